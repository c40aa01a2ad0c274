// bench/decode: the training input pipeline of ImageNet-style JPEGs, cohort
// against PyTorch, in images per second per thread, in one run:
//
//   cohort:  decodeImage (RandomResizedCrop to SIZE) + applyTransform (random
//            horizontal flip, mean/std normalization), each thread decoding
//            its own slice of the files, held in memory;
//   PyTorch: torchvision's ImageFolder with RandomResizedCrop(SIZE),
//            RandomHorizontalFlip, ToTensor, Normalize in a DataLoader with as
//            many worker processes, batch 32 (bench/peers/decode.py, run with
//            COHORT_PYTHON); worker start-up excluded (reported apart).
//
// for SIZE 224 (ImageNet) and 64 (what this 2-core machine trains), and 1
// and 2 threads / workers. The ratio cohort / PyTorch is the result.
// For reference, a line before the table gives TurboJPEG's decode of each
// whole image alone (tjDecompress2, 1 thread): what cohort's pipeline would
// cost at least without DCT scaling and region decoding.
//
//   cohort_bench_decode [--dir DIR] [--seconds S] [--no-peer]
//
// Without --dir it writes 10 classes x 50 images (~500x375) with
// scripts/make-imagenet-like.py into a temporary directory.

#include <fmt/format.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench_paths.h"
#include "cohort/data/image.h"
#include "cohort/data/transform.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<std::vector<uint8_t>> readJpegs(const std::string& dir) {
  std::vector<std::string> paths;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    std::string ext = e.path().extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
    if (e.is_regular_file() && (ext == ".jpeg" || ext == ".jpg")) paths.push_back(e.path());
  }
  std::sort(paths.begin(), paths.end());
  std::vector<std::vector<uint8_t>> files;
  for (const auto& p : paths) {
    std::ifstream in(p, std::ios::binary);
    files.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return files;
}

// Images per second per thread: `threads` threads, each over its own slice
// of `files` round and round, after a warm-up pass of ~10% of the time.
double cohortRate(const std::vector<std::vector<uint8_t>>& files, int64_t size, int threads,
                  double seconds) {
  cohort::data::ImageTransform it;
  it.outHeight = it.outWidth = size;
  it.randomResizedCrop = true;
  cohort::data::Transform tf;
  tf.mean = {0.485f, 0.456f, 0.406f};
  tf.std = {0.229f, 0.224f, 0.225f};
  tf.augment = true;
  tf.augmentation.hflip = true;
  const cohort::data::SampleShape shape{3, size, size};
  std::atomic<int64_t> total{0};
  std::atomic<int> ready{0};
  std::atomic<bool> go{false}, stop{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const size_t lo = files.size() * t / threads, hi = files.size() * (t + 1) / threads;
      std::vector<float> out(static_cast<size_t>(shape.numel())), scratch(out.size());
      uint64_t seed = 1000003 * t;
      auto one = [&](size_t i) {
        ++seed;
        cohort::data::decodeImage(files[i].data(), files[i].size(), it, seed, out.data());
        cohort::data::applyTransform(tf, shape, out.data(), scratch.data(), seed);
      };
      const auto warm = Clock::now() + std::chrono::duration<double>(seconds / 10);
      for (size_t i = lo; Clock::now() < warm; i = i + 1 < hi ? i + 1 : lo) one(i);
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      int64_t n = 0;
      for (size_t i = lo; !stop.load(std::memory_order_relaxed); i = i + 1 < hi ? i + 1 : lo) {
        one(i);
        ++n;
      }
      total.fetch_add(n);
    });
  }
  while (ready.load() < threads) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto t0 = Clock::now();
  go.store(true);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop.store(true);
  for (auto& th : pool) th.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  return static_cast<double>(total.load()) / elapsed / threads;
}

// Images per second: TurboJPEG's decode of the whole image to RGB, 1 thread.
double fullDecodeRate(const std::vector<std::vector<uint8_t>>& files, double seconds) {
  tjhandle h = tjInitDecompress();
  std::vector<uint8_t> rgb;
  auto one = [&](const std::vector<uint8_t>& f) {
    int w = 0, ht = 0, samp = 0, cs = 0;
    tjDecompressHeader3(h, f.data(), static_cast<unsigned long>(f.size()), &w, &ht, &samp, &cs);
    rgb.resize(static_cast<size_t>(w) * ht * 3);
    if (tjDecompress2(h, f.data(), static_cast<unsigned long>(f.size()), rgb.data(), w, 0, ht,
                      TJPF_RGB, 0) != 0) {
      throw std::runtime_error(tjGetErrorStr2(h));
    }
  };
  for (size_t i = 0; i < std::min<size_t>(files.size(), 50); ++i) one(files[i]);
  int64_t n = 0;
  const auto t0 = Clock::now();
  double elapsed = 0;
  while (elapsed < seconds) {
    one(files[static_cast<size_t>(n) % files.size()]);
    ++n;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  tjDestroy(h);
  return static_cast<double>(n) / elapsed;
}

struct PeerResult {
  double perWorker = 0, firstBatch = 0;
};

PeerResult peerRate(const std::string& dir, int64_t size, int threads, double seconds) {
  const std::string cmd =
      fmt::format("'{}' '{}/bench/peers/decode.py' '{}' {} {} {}", COHORT_PYTHON,
                  COHORT_SOURCE_DIR, dir, size, threads, seconds);
  PeerResult r;
  std::string text;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    while (std::fgets(buf, sizeof(buf), p) != nullptr) text += buf;
    pclose(p);
  }
  try {
    const auto j = nlohmann::json::parse(text);
    r.perWorker = j["images_per_s_per_worker"].get<double>();
    r.firstBatch = j["first_batch_s"].get<double>();
  } catch (const std::exception& e) {
    std::cerr << "peer failed (" << cmd << "): " << text << "\n";
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  double seconds = 3;
  bool peer = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--seconds" && i + 1 < argc) seconds = std::atof(argv[++i]);
    else if (a == "--no-peer") peer = false;
    else {
      std::cerr << "usage: cohort_bench_decode [--dir DIR] [--seconds S] [--no-peer]\n";
      return 2;
    }
  }
  std::string tmp;
  if (dir.empty()) {
    char pattern[] = "/tmp/cohort-bench-decode-XXXXXX";
    if (mkdtemp(pattern) == nullptr) {
      std::cerr << "cannot create a temporary directory\n";
      return 1;
    }
    tmp = pattern;
    dir = tmp + "/images";
    const std::string cmd = fmt::format(
        "'{}' '{}/scripts/make-imagenet-like.py' '{}' --classes 10 --per-class 50 --seed 0",
        COHORT_PYTHON, COHORT_SOURCE_DIR, dir);
    if (std::system(cmd.c_str()) != 0) {
      std::cerr << "failed: " << cmd << "\n";
      return 1;
    }
  }
  const auto files = readJpegs(dir);
  if (files.empty()) {
    std::cerr << dir << ": no .JPEG files\n";
    return 2;
  }
  size_t bytes = 0;
  for (const auto& f : files) bytes += f.size();
  std::cout << fmt::format("{} JPEGs, {:.0f} KB mean, in {}; {:.1f} s per measurement\n",
                           files.size(), bytes / 1e3 / files.size(), dir, seconds);

  const double full = fullDecodeRate(files, seconds);
  std::cout << fmt::format("reference: TurboJPEG decode of the whole image alone: {:.1f} img/s "
                           "(1 thread)\n",
                           full);

  struct Row {
    int64_t size;
    int threads;
    double cohort, torch, firstBatch;
  };
  std::vector<Row> rows;
  for (int64_t size : {224, 64}) {
    for (int threads : {1, 2}) {
      Row r{size, threads, 0, 0, 0};
      r.cohort = cohortRate(files, size, threads, seconds);
      if (peer) {
        const PeerResult p = peerRate(dir, size, threads, seconds);
        r.torch = p.perWorker;
        r.firstBatch = p.firstBatch;
      }
      rows.push_back(r);
    }
  }

  std::cout << fmt::format("\n{:>5} {:>7} | {:>18} {:>18} {:>7} | {:>14}\n", "size", "threads",
                           "cohort img/s/thr", "PyTorch img/s/wkr", "ratio",
                           "PyTorch start s");
  for (const Row& r : rows) {
    const double ratio = r.torch > 0 ? r.cohort / r.torch : 0;
    std::cout << fmt::format("{:>5} {:>7} | {:>18.1f} {:>18.1f} {:>6.2f}x | {:>14.2f}\n", r.size,
                             r.threads, r.cohort, r.torch, ratio, r.firstBatch);
  }
  std::cout << "\n";
  std::cout << nlohmann::json({{"bench", "decode"}, {"reference", "turbojpeg_full_decode"},
                               {"images_per_s_per_thread", full}})
                   .dump()
            << "\n";
  for (const Row& r : rows) {
    nlohmann::json j = {{"bench", "decode"},
                        {"size", r.size},
                        {"threads", r.threads},
                        {"images", files.size()},
                        {"cohort_images_per_s_per_thread", r.cohort},
                        {"pytorch_images_per_s_per_worker", r.torch},
                        {"ratio", r.torch > 0 ? r.cohort / r.torch : 0.0},
                        {"pytorch_first_batch_s", r.firstBatch}};
    std::cout << j.dump() << "\n";
  }
  if (!tmp.empty()) fs::remove_all(tmp);
  return 0;
}
