// bench/data: the data path from packed shards, measured in one run.
//
//   (1) epoch read time of a packed ImageNet-like dataset on blob storage
//       (Azurite on loopback): epoch 1 streams from the emulator while the
//       shards land in the node-local cache, epoch 2 reads the cache; the
//       ratio epoch 1 / epoch 2;
//   (2) data_wait_frac of ResNet-18 training at 2 ranks (1 thread each) from
//       local shards, and from blob storage through a fresh cache: the share
//       of step time the trainer waited for a batch (target <= 0.01).
//
//   cohort_bench_data [--classes C] [--per-class N] [--steps S] [--crop PX]

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cohort/data/sampler.h"
#include "cohort/data/shard.h"
#include "cohort/data/shard_source.h"
#include "test_paths.h"
#include "util/azurite.h"
#include "util/process.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace cohort;

namespace {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void check(const test::ProcessResult& r, const std::string& what) {
  if (r.exitCode != 0) {
    std::cerr << what << " failed:\n" << r.describe() << "\n";
    std::exit(1);
  }
}

// Reads every record of the dataset once, in an epoch's order, with
// `threads` readers; returns seconds.
double readEpoch(data::ShardSource& source, int threads, uint64_t epoch) {
  const auto& m = source.manifest();
  std::vector<int64_t> counts;
  for (const auto& s : m.shards) counts.push_back(s.records);
  const auto order = data::shuffledShardOrder(counts, 4, 1, static_cast<int64_t>(epoch));
  std::vector<int64_t> first = {0};
  for (int64_t c : counts) first.push_back(first.back() + c);
  std::vector<data::ShardIndex> index(m.shards.size());
  std::vector<int> plan;
  std::vector<bool> seen(m.shards.size(), false);
  for (int64_t i : order) {
    const auto s = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), i) - first.begin() - 1);
    if (!seen[s]) {
      seen[s] = true;
      plan.push_back(static_cast<int>(s));
    }
  }
  const auto start = Clock::now();
  source.plan(plan);
  for (size_t s = 0; s < m.shards.size(); ++s) {
    index[s] = data::readShardIndex([&](int64_t o, int64_t n) { return source.read(int(s), o, n); },
                                    m.shards[s].bytes, m.shards[s].name);
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t k = next++; k < order.size(); k = next++) {
        const int64_t i = order[k];
        const auto s = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), i) - first.begin() - 1);
        const auto r = static_cast<size_t>(i - first[s]);
        const int64_t at = index[s].begin(r);
        data::parseRecord(source.read(int(s), at, index[s].end(r) - at), at, m.shards[s].name);
      }
    });
  }
  for (auto& t : pool) t.join();
  return since(start);
}

struct TrainResult {
  double dataWaitFrac = 0;
  double imagesPerS = 0;
};

TrainResult train(const std::string& dir, const std::string& tag, const std::string& trainPath, int steps,
                  int crop, const std::map<std::string, std::string>& env,
                  const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {
      COHORT_BIN, "run", std::string(COHORT_SOURCE_DIR) + "/examples/imagenet-style.yaml",
      "--run-dir", dir + "/" + tag, "--procs", "2",
      "--set", "data.train.path=" + trainPath, "--set", "data.eval.kind=none",
      "--set", fmt::format("data.train.crop_size={}", crop),
      "--set", "model.arch=resnet18", "--set", "training.epochs=1",
      "--set", fmt::format("training.max_steps={}", steps),
      "--set", "checkpoint.enabled=false", "--set", "output.progress=off",
      "--set", "distribution.threads_per_rank=1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  check(test::run(argv, env, std::chrono::minutes(30)), "training " + tag);
  std::ifstream in(dir + "/" + tag + "/summary.json");
  const auto j = nlohmann::json::parse(in);
  return {j.at("data_wait_frac").get<double>(), j.at("train_images_per_s").get<double>()};
}

}  // namespace

int main(int argc, char** argv) {
  int classes = 10, perClass = 200, steps = 30, crop = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int v = std::stoi(argv[i + 1]);
    if (a == "--classes") classes = v;
    else if (a == "--per-class") perClass = v;
    else if (a == "--steps") steps = v;
    else if (a == "--crop") crop = v;
    else {
      std::cerr << "usage: cohort_bench_data [--classes C] [--per-class N] [--steps S] [--crop PX]\n";
      return 2;
    }
  }
  test::TempDir dir;
  check(test::run({COHORT_PYTHON, std::string(COHORT_SOURCE_DIR) + "/scripts/make-imagenet-like.py",
                   dir.file("img"), "--classes", std::to_string(classes), "--per-class",
                   std::to_string(perClass), "--seed", "0"}, {}, std::chrono::minutes(20)),
        "making images");
  check(test::run({COHORT_BIN, "data", "pack", dir.file("img"), dir.file("shards"), "--shard-mb", "16",
                   "--no-progress"}), "packing");

  test::Azurite azurite;
  const std::map<std::string, std::string> env = {{"AZURE_STORAGE_KEY", test::Azurite::kKey}};
  const std::string url = azurite.url("bench/train");
  check(test::run({COHORT_BIN, "data", "pack", dir.file("img"), url, "--shard-mb", "16", "--no-progress",
                   "--allow-insecure"}, env), "packing to Azurite");
  ::setenv("AZURE_STORAGE_KEY", test::Azurite::kKey, 1);
  storage::StorageOptions so;
  so.allowInsecure = true;
  CacheConfig cache;
  cache.dir = dir.file("cache");
  double epoch1 = 0, epoch2 = 0;
  int64_t bytes = 0;
  {
    data::ShardSource source(url, so, cache);
    bytes = source.manifest().bytes();
    epoch1 = readEpoch(source, 2, 1);
    source.waitForPlan();
    epoch2 = readEpoch(source, 2, 2);
  }
  std::cout << fmt::format("dataset: {} images of {} classes, {:.1f} MB in shards of 16 MB\n\n",
                           classes * perClass, classes, double(bytes) / 1e6);
  std::cout << fmt::format("{:<44} {:>9} {:>9}\n", "epoch read (2 reader threads, no decode)", "s", "MB/s");
  std::cout << fmt::format("{:<44} {:>9.3f} {:>9.0f}\n", "epoch 1: Azurite, streaming into the cache", epoch1,
                           double(bytes) / 1e6 / epoch1);
  std::cout << fmt::format("{:<44} {:>9.3f} {:>9.0f}\n", "epoch 2: node-local cache", epoch2,
                           double(bytes) / 1e6 / epoch2);
  std::cout << fmt::format("{:<44} {:>9.1f}\n\n", "ratio epoch 1 / epoch 2", epoch1 / epoch2);

  const TrainResult local = train(dir.path(), "local", dir.file("shards"), steps, crop, {}, {});
  const TrainResult blob = train(dir.path(), "blob", url, steps, crop, env,
                                 {"--set", "storage.allow_insecure=true", "--set",
                                  "data.cache.dir=" + dir.file("train-cache")});
  std::cout << fmt::format("ResNet-18, {} px, 2 ranks x 1 thread, batch 32/rank, {} steps\n", crop, steps);
  std::cout << fmt::format("{:<44} {:>14} {:>9}\n", "training data", "data_wait_frac", "img/s");
  std::cout << fmt::format("{:<44} {:>14.4f} {:>9.1f}\n", "local shards", local.dataWaitFrac, local.imagesPerS);
  std::cout << fmt::format("{:<44} {:>14.4f} {:>9.1f}\n", "Azurite, fresh cache (first epoch)", blob.dataWaitFrac,
                           blob.imagesPerS);
  nlohmann::json j = {{"bench", "data"},
                      {"images", classes * perClass},
                      {"bytes", bytes},
                      {"epoch1_azurite_s", epoch1},
                      {"epoch2_cache_s", epoch2},
                      {"epoch_ratio", epoch1 / epoch2},
                      {"train_crop", crop},
                      {"train_steps", steps},
                      {"data_wait_frac_local", local.dataWaitFrac},
                      {"data_wait_frac_azurite", blob.dataWaitFrac},
                      {"images_per_s_local", local.imagesPerS},
                      {"images_per_s_azurite", blob.imagesPerS}};
  std::cout << j.dump() << "\n";
  return 0;
}
