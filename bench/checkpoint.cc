// bench/checkpoint: what a checkpoint costs the training of ResNet-50 (model
// and SGD momentum state, ~205 MB), measured in one run on this machine.
//
//   (a) time the training thread is blocked per checkpoint (cohort's
//       asynchronous checkpoints, from the trainer's own accounting),
//   (b) a plain synchronous save of the same state: LibTorch's torch::save
//       of the tensors, then fsync, median of 3; and, side by side, PyTorch's
//       torch.save + fsync (bench/peers/checkpoint_save.py, under COHORT_PYTHON),
//   (c) (b) / (a), for both baselines,
//   (d) training throughput with a checkpoint requested every step vs none,
//       for both when_behind policies, and with one every 5 steps,
//   (e) encryption at rest (security.encryption): the background writer's
//       throughput on one core, sealing in memory and writing the same image
//       plain and sealed (median of 3 each, side by side), and (a) again for
//       a job with a key, run in the same rounds as the plain one.
//
// (a) and (d) come from real `cohort run` jobs (2 ranks, 1 thread each,
// synthetic 64 px images, batch 8 per rank), run back to back.
//
//   cohort_bench_checkpoint [--steps N] [--rounds R] [--dir DIR]

#include <fcntl.h>
#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench_paths.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/ckpt/tensor_file.h"
#include "cohort/core/cpu.h"
#include "cohort/security/keys.h"
#include "cohort/security/sealed.h"
#include "cohort/config/job.h"
#include "cohort/models/model.h"
#include "cohort/train/optimizer.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string jobYaml(int steps) {
  return fmt::format(R"(name: bench-ckpt
model:
  arch: resnet50
  num_classes: 1000
data:
  train:
    kind: synthetic
    size: {}
    shape: [3, 64, 64]
  loader_threads: 1
distribution:
  procs_per_node: 2
  threads_per_rank: 1
training:
  epochs: 1
  batch_size: 8
  log_every: 1000
  optimizer:
    name: sgd
    lr: 0.01
    momentum: 0.9
output:
  progress: off
  save_final: false
)",
                     steps * 16);
}

struct RunResult {
  double imagesPerS = 0;
  int64_t taken = 0, skipped = 0;
  double blockedMeanMs = 0, blockedMaxMs = 0, blockedMedianMs = 0;
};

RunResult runJob(const std::string& cohort, const std::string& job, const std::string& runDir,
                 const std::vector<std::string>& sets) {
  std::string cmd = fmt::format("'{}' run '{}' --run-dir '{}'", cohort, job, runDir);
  for (const auto& s : sets) cmd += " --set " + s;
  cmd += " > '" + runDir + ".log' 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    throw std::runtime_error("failed: " + cmd + " (see " + runDir + ".log)");
  }
  std::ifstream in(runDir + "/summary.json");
  const auto j = nlohmann::json::parse(in);
  RunResult r;
  r.imagesPerS = j["train_images_per_s"].get<double>();
  if (j.contains("checkpoints")) {
    r.taken = j["checkpoints"]["taken"].get<int64_t>();
    r.skipped = j["checkpoints"]["skipped"].get<int64_t>();
    r.blockedMeanMs = j["checkpoints"]["blocked_ms_mean"].get<double>();
    r.blockedMaxMs = j["checkpoints"]["blocked_ms_max"].get<double>();
    r.blockedMedianMs = j["checkpoints"]["blocked_ms_median"].get<double>();
  }
  return r;
}

// A plain save of ResNet-50's parameters, buffers and momentum buffers.
double plainSaveSeconds(const std::string& dir, uint64_t* bytes) {
  torch::manual_seed(0);
  at::set_num_threads(1);
  cohort::ModelConfig mc;
  mc.arch = cohort::ModelArch::resnet50;
  mc.numClasses = 1000;
  mc.inChannels = 3;
  auto model = cohort::models::createModel(mc, {3, 64, 64});
  cohort::OptimizerConfig oc;
  oc.momentum = 0.9;
  auto opt = cohort::train::createOptimizer(oc, model->parameters());
  model->forward(torch::randn({2, 3, 64, 64})).sum().backward();
  opt->step();  // creates the momentum buffers
  std::vector<std::string> names;
  for (const auto& p : model->named_parameters()) names.push_back(p.key());
  cohort::ckpt::StateDict state = cohort::ckpt::stateDict(*model);
  for (auto& [n, t] : cohort::train::optimizerState(*opt, names)) state.emplace_back(n, t);
  std::vector<double> times;
  const std::string path = dir + "/plain.pt";
  std::vector<at::Tensor> tensors;
  for (auto& [n, t] : state) tensors.push_back(t);
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    torch::save(tensors, path);
    const int fd = ::open(path.c_str(), O_RDONLY);
    ::fsync(fd);
    ::close(fd);
    times.push_back(seconds(t0, Clock::now()));
  }
  *bytes = fs::file_size(path);
  // For reference: an in-memory copy of the same tensors.
  std::vector<double> copies;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    std::vector<at::Tensor> c;
    for (auto& [n, t] : state) c.push_back(t.clone());
    copies.push_back(seconds(t0, Clock::now()));
  }
  std::cout << fmt::format("in-memory copy of the same tensors: {:.1f} ms (median of 3)\n",
                           1000 * median(copies));
  fs::remove(path);
  return median(times);
}

// (e) The background writer's work on an image of `bytes` (one core): sealing
// in memory, then writeFileImage plain and sealed (fsync'd, to the bench dir).
void encryptionThroughput(const std::string& dir, uint64_t bytes) {
  const auto key = cohort::security::parseKey(std::string(64, 'a'), "bench key");
  std::string image(bytes, '\0');
  for (uint64_t i = 0; i < bytes; i += 4096) image[i] = static_cast<char>(i >> 12);
  std::vector<double> seal, plainWrite, sealedWrite, ratios;
  // Plain and sealed writes alternate (which goes first alternates too), so
  // the disk's drift over the run touches both alike.
  constexpr int kPairs = 7;
  for (int i = 0; i < kPairs; ++i) {
    auto t0 = Clock::now();
    cohort::security::Sealer s(key, "step-1/model.bin", bytes);
    std::string chunk;
    for (uint64_t c = 0; c < s.chunks(); ++c) s.seal(c, image.data() + c * cohort::security::kDefaultChunkBytes, chunk);
    seal.push_back(seconds(t0, Clock::now()));
    fs::create_directories(dir + "/enc/step-1");
    double p = 0, q = 0;
    for (int k = 0; k < 2; ++k) {
      t0 = Clock::now();
      if ((i + k) % 2 == 0) {
        cohort::ckpt::writeFileImage(dir + "/enc/step-1/plain.bin", image.data(), bytes);
        p = seconds(t0, Clock::now());
      } else {
        cohort::ckpt::writeFileImage(dir + "/enc/step-1/sealed.bin", image.data(), bytes, nullptr, &key);
        q = seconds(t0, Clock::now());
      }
    }
    plainWrite.push_back(p);
    sealedWrite.push_back(q);
    ratios.push_back(p / q);
    fs::remove_all(dir + "/enc");
  }
  const double gb = bytes / 1e9;
  std::cout << fmt::format(
      "(e) {:.0f} MB image (a std::string: the plain write goes through the page cache), one core, "
      "median of {} alternating pairs: AES-256-GCM sealing in memory {:.2f} GB/s | writeFileImage "
      "plain {:.2f} GB/s, sealed {:.2f} GB/s (per-pair ratio median {:.2f}, range {:.2f}-{:.2f})\n",
      bytes / 1e6, kPairs, gb / median(seal), gb / median(plainWrite), gb / median(sealedWrite),
      median(ratios), *std::min_element(ratios.begin(), ratios.end()),
      *std::max_element(ratios.begin(), ratios.end()));
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 12, rounds = 2;
  std::string dir = "bench-checkpoint";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--steps") steps = std::atoi(argv[i + 1]);
    else if (a == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (a == "--dir") dir = argv[i + 1];
    else {
      std::cerr << "usage: cohort_bench_checkpoint [--steps N] [--rounds R] [--dir DIR]\n";
      return 2;
    }
  }
  fs::remove_all(dir);
  fs::create_directories(dir);
  dir = fs::absolute(dir).string();
  const std::string cohort = fs::path(argv[0]).parent_path().parent_path().string() + "/cli/cohort";
  const std::string job = dir + "/job.yaml";
  std::ofstream(job) << jobYaml(steps);

  // AES-GCM's speed depends on AES-NI/VAES and PCLMULQDQ (OpenSSL picks them).
  std::cout << "cpu: " << cohort::describe(cohort::cpuInfo()) << "\n";
  if (FILE* f = popen("grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'aes|vaes|pclmulqdq|vpclmulqdq' | "
                      "tr '\\n' ' '", "r")) {
    char buf[128] = {0};
    std::fread(buf, 1, sizeof buf - 1, f);
    pclose(f);
    std::cout << "AES instructions: " << (buf[0] ? buf : "none") << "\n";
  }
  uint64_t bytes = 0;
  const double plain = plainSaveSeconds(dir, &bytes);
  encryptionThroughput(dir, bytes);
  const std::string keyFile = dir + "/bench.key";
  std::ofstream(keyFile) << std::string(64, 'b') << "\n";
  fs::permissions(keyFile, fs::perms::owner_read | fs::perms::owner_write);
  std::cout << fmt::format("(b) torch::save + fsync of {:.0f} MB: {:.1f} ms (median of 3)\n",
                           bytes / 1e6, 1000 * plain);
  // PyTorch's own torch.save, side by side, when COHORT_PYTHON has torch.
  double peer = 0;
  const std::string script = std::string(COHORT_SOURCE_DIR) + "/bench/peers/checkpoint_save.py";
  const std::string peerCmd = fmt::format("'{}' '{}' '{}' 2>/dev/null", COHORT_PYTHON, script, dir);
  if (FILE* p = popen(peerCmd.c_str(), "r")) {
    double ms = 0, size = 0;
    if (std::fscanf(p, "%lf %lf", &ms, &size) == 2) peer = ms / 1000;
    pclose(p);
    if (peer > 0) {
      std::cout << fmt::format("(b) PyTorch torch.save + fsync of {:.0f} MB: {:.1f} ms (median of 3)\n",
                               size / 1e6, 1000 * peer);
    }
  }

  const std::vector<std::string> none = {"checkpoint.enabled=false"};
  const std::vector<std::string> skip = {"checkpoint.every_steps=1", "checkpoint.every_epochs=0",
                                         "checkpoint.keep_last=2"};
  std::vector<std::string> wait = skip;
  wait.push_back("checkpoint.when_behind=wait");
  const std::vector<std::string> every5 = {"checkpoint.every_steps=5", "checkpoint.every_epochs=0",
                                           "checkpoint.keep_last=2"};
  std::vector<std::string> sealed = skip;
  sealed.push_back("security.encryption.key_file=" + keyFile);
  std::vector<double> tNone, tSkip, tWait, t5, blockedSkip, blockedWait, maxBlocked, medians;
  std::vector<double> tSealed, blockedSealed;
  int64_t takenSealed = 0, skippedSealed = 0;
  int64_t takenSkip = 0, skippedSkip = 0, takenWait = 0;
  for (int r = 0; r < rounds; ++r) {
    const auto a = runJob(cohort, job, fmt::format("{}/none-{}", dir, r), none);
    const auto b = runJob(cohort, job, fmt::format("{}/skip-{}", dir, r), skip);
    const auto c = runJob(cohort, job, fmt::format("{}/wait-{}", dir, r), wait);
    const auto d = runJob(cohort, job, fmt::format("{}/every5-{}", dir, r), every5);
    const auto e = runJob(cohort, job, fmt::format("{}/sealed-{}", dir, r), sealed);
    tSealed.push_back(e.imagesPerS);
    blockedSealed.push_back(e.blockedMeanMs);
    takenSealed += e.taken;
    skippedSealed += e.skipped;
    std::cout << fmt::format(
        "round {}: every step, skip, encrypted {:.2f} img/s ({} taken, {} skipped, blocked {:.3f} "
        "ms mean)\n",
        r + 1, e.imagesPerS, e.taken, e.skipped, e.blockedMeanMs);
    t5.push_back(d.imagesPerS);
    tNone.push_back(a.imagesPerS);
    tSkip.push_back(b.imagesPerS);
    tWait.push_back(c.imagesPerS);
    blockedSkip.push_back(b.blockedMeanMs);
    blockedWait.push_back(c.blockedMeanMs);
    maxBlocked.push_back(std::max(b.blockedMaxMs, c.blockedMaxMs));
    medians.push_back(b.blockedMedianMs);
    medians.push_back(c.blockedMedianMs);
    takenSkip += b.taken;
    skippedSkip += b.skipped;
    takenWait += c.taken;
    std::cout << fmt::format(
        "round {}: none {:.2f} img/s | every step, skip when behind {:.2f} img/s ({} taken, {} "
        "skipped, blocked {:.3f} ms mean) | every step, wait {:.2f} img/s ({} taken, blocked "
        "{:.3f} ms mean) | every 5 steps {:.2f} img/s\n",
        r + 1, a.imagesPerS, b.imagesPerS, b.taken, b.skipped, b.blockedMeanMs, c.imagesPerS,
        c.taken, c.blockedMeanMs, d.imagesPerS);
  }
  // Every checkpoint of every run counts: the mean over runs of each run's
  // mean (skip policy) is the headline figure.
  double sum = 0;
  for (double b : blockedSkip) sum += b;
  const double blocked = sum / double(blockedSkip.size()) / 1000;
  std::cout << "\n| figure | value |\n|---|---|\n";
  std::cout << fmt::format("| (a) training thread blocked per checkpoint (skip policy, mean) | {:.3f} ms |\n",
                           1000 * blocked);
  std::cout << fmt::format("| (a) same, median checkpoint (both policies) | {:.3f} ms |\n",
                           median(medians));
  std::cout << fmt::format("| (a) same, wait policy (includes waiting for a free buffer) | {:.3f} ms |\n",
                           median(blockedWait));
  std::cout << fmt::format("| (a) worst single checkpoint | {:.3f} ms |\n",
                           *std::max_element(maxBlocked.begin(), maxBlocked.end()));
  std::cout << fmt::format("| (b) LibTorch torch::save + fsync, {:.0f} MB | {:.1f} ms |\n",
                           bytes / 1e6, 1000 * plain);
  std::cout << fmt::format("| (c) (b) / (a) | {:.0f}x |\n", plain / blocked);
  if (peer > 0) {
    std::cout << fmt::format("| (b') PyTorch torch.save + fsync | {:.1f} ms |\n", 1000 * peer);
    std::cout << fmt::format("| (c') (b') / (a) | {:.0f}x |\n", peer / blocked);
  }
  std::cout << fmt::format("| (d) throughput, checkpoint every step (skip) / none | {:.3f} ({} taken, {} skipped) |\n",
                           median(tSkip) / median(tNone), takenSkip, skippedSkip);
  std::cout << fmt::format("| (d) throughput, checkpoint every step (wait) / none | {:.3f} ({} taken) |\n",
                           median(tWait) / median(tNone), takenWait);
  std::cout << fmt::format("| throughput, checkpoint every 5 steps / none | {:.3f} |\n",
                           median(t5) / median(tNone));
  std::cout << fmt::format("| throughput without checkpoints | {:.2f} img/s |\n", median(tNone));
  double sealedSum = 0;
  for (double b : blockedSealed) sealedSum += b;
  std::cout << fmt::format("| (e) blocked per checkpoint, encrypted / plain (skip policy, mean) | {:.3f} ms / {:.3f} ms |\n",
                           sealedSum / double(blockedSealed.size()), 1000 * blocked);
  std::cout << fmt::format("| (e) throughput, checkpoint every step encrypted / plain (skip) | {:.3f} ({} taken, {} skipped) |\n",
                           median(tSealed) / median(tSkip), takenSealed, skippedSealed);
  return 0;
}
