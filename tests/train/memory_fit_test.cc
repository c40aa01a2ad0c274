// The memory limit a process reads from its cgroup (v1 and v2, "no limit"
// in both spellings) and the machine, the OOM killer's count, and the ZeRO
// fit check built on them: what each stage holds per rank, and the error
// that names the rank, the stage and the limit's source.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "cohort/core/error.h"
#include "cohort/core/memory_limit.h"
#include "train/detail/memory_fit.h"
#include "util/process.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;

void put(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

TEST(MemoryLimit, TheSmallerOfTheCgroupsLimitAndTheMachinesMemory) {
  test::TempDir dir;
  const std::string root = dir.file("v1");
  put(root + "/proc/meminfo", "MemTotal:        1024000 kB\nMemFree:          512000 kB\n");
  put(root + "/proc/self/cgroup", "5:devices:/\n4:cpu,memory:/job\n0::/\n");
  put(root + "/sys/fs/cgroup/memory/job/memory.limit_in_bytes", "524288000\n");
  put(root + "/sys/fs/cgroup/memory/job/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n");
  memory::Limit l = memory::processLimit(root);
  EXPECT_EQ(l.bytes, 524288000u);
  EXPECT_EQ(l.source, root + "/sys/fs/cgroup/memory/job/memory.limit_in_bytes");
  EXPECT_EQ(memory::oomKills(root), 3u);
  // v1's "no limit" is a number near 2^63: the machine's memory counts.
  put(root + "/sys/fs/cgroup/memory/job/memory.limit_in_bytes", "9223372036854771712\n");
  l = memory::processLimit(root);
  EXPECT_EQ(l.bytes, 1024000u * 1024);
  EXPECT_EQ(l.source, "MemTotal");

  const std::string v2 = dir.file("v2");
  put(v2 + "/proc/meminfo", "MemTotal:        1024000 kB\n");
  put(v2 + "/proc/self/cgroup", "0::/a/b\n");
  put(v2 + "/sys/fs/cgroup/a/b/memory.max", "max\n");
  EXPECT_EQ(memory::processLimit(v2).source, "MemTotal");
  EXPECT_EQ(memory::oomKills(v2), std::nullopt);
  put(v2 + "/sys/fs/cgroup/a/b/memory.max", "1048576\n");
  put(v2 + "/sys/fs/cgroup/a/b/memory.events", "low 0\nhigh 0\nmax 7\noom 2\noom_kill 1\n");
  EXPECT_EQ(memory::processLimit(v2).bytes, 1048576u);
  EXPECT_EQ(memory::oomKills(v2), 1u);

  // A limit on a parent cgroup applies; a path the container does not
  // show is the mount itself.
  put(v2 + "/sys/fs/cgroup/a/memory.max", "4096\n");
  EXPECT_EQ(memory::processLimit(v2).bytes, 4096u);
  EXPECT_EQ(memory::processLimit(v2).source, v2 + "/sys/fs/cgroup/a/memory.max");
  const std::string docker = dir.file("docker");
  put(docker + "/proc/meminfo", "MemTotal:        1024000 kB\n");
  put(docker + "/proc/self/cgroup", "9:memory:/docker/0123abcd\n");
  put(docker + "/sys/fs/cgroup/memory/memory.limit_in_bytes", "2048\n");
  put(docker + "/sys/fs/cgroup/memory/memory.oom_control", "oom_kill 5\n");
  EXPECT_EQ(memory::processLimit(docker).bytes, 2048u);
  EXPECT_EQ(memory::oomKills(docker), 5u);

  // Nothing readable: unknown, and the check lets it be.
  EXPECT_EQ(memory::processLimit(dir.file("none")).bytes, 0u);
  EXPECT_EQ(train::detail::checkStateFits({1e12, 0, 0, 0}, memory::processLimit(dir.file("none")), 1, 0, 1, 0), "");
}

struct Blocks : torch::nn::Module {
  Blocks() {
    h0 = register_module("h0", torch::nn::Linear(10, 10));   // 110
    h1 = register_module("h1", torch::nn::Linear(10, 20));   // 220
    head = register_module("head", torch::nn::Linear(20, 2));  // 42
    frozen = register_parameter("frozen", torch::zeros({1000}), /*requires_grad=*/false);
  }
  torch::nn::Linear h0{nullptr}, h1{nullptr}, head{nullptr};
  at::Tensor frozen;
};

TEST(MemoryFit, EachStageHoldsItsShareAndTooLittleMemoryIsAConfigurationError) {
  Blocks model;
  OptimizerConfig adamw;
  adamw.name = OptimizerKind::adamw;
  const double p = 4 * 372.0;  // trainable bytes
  const double frozen = 4 * 1000.0;  // whole on every rank, without gradients or state
  const double cap = 1e-4;           // MB: a bucket of 104 bytes
  auto s0 = train::detail::stateBytes(model, 0, 2, {}, adamw, cap);
  EXPECT_DOUBLE_EQ(s0.parameters, frozen + p);
  EXPECT_DOUBLE_EQ(s0.gradients, p);
  EXPECT_DOUBLE_EQ(s0.optimizer, 2 * p);
  EXPECT_DOUBLE_EQ(s0.unit, 0);
  EXPECT_DOUBLE_EQ(s0.total(), frozen + 4 * p);
  auto s2 = train::detail::stateBytes(model, 2, 2, {}, adamw, cap);
  EXPECT_DOUBLE_EQ(s2.optimizer, p);
  EXPECT_DOUBLE_EQ(s2.gradients, p / 2);
  EXPECT_DOUBLE_EQ(s2.unit, 2 * cap * (1 << 20));  // two buckets in flight
  auto s3 = train::detail::stateBytes(model, 3, 2, {"h0", "h1"}, adamw, cap);
  EXPECT_DOUBLE_EQ(s3.parameters, frozen + p / 2);
  EXPECT_DOUBLE_EQ(s3.optimizer, p);
  EXPECT_DOUBLE_EQ(s3.unit, 2 * 4 * (220.0 + 42.0));  // h1, the largest unit, inside the head's
  EXPECT_DOUBLE_EQ(s3.wholeModel, frozen + p);
  // Built unit by unit, no step holds the model whole.
  EXPECT_DOUBLE_EQ(train::detail::stateBytes(model, 3, 2, {"h0", "h1"}, adamw, cap, true).wholeModel, 0);
  {
    // Built unit by unit, the frozen weights (outside the units here) are
    // held in parts too, and gathered whole with their unit.
    auto parts = train::detail::stateBytes(model, 3, 2, {"h0", "h1"}, adamw, cap, true);
    EXPECT_DOUBLE_EQ(parts.parameters, (frozen + p) / 2);
    EXPECT_DOUBLE_EQ(parts.fixed, 0);
    EXPECT_DOUBLE_EQ(parts.shardable, 4 * p + frozen);
    // h1 inside the head and the frozen tensor (outside the units).
    EXPECT_DOUBLE_EQ(parts.unit, frozen + 2 * 4 * 42.0 + 2 * 4 * 220.0);
  }
  EXPECT_DOUBLE_EQ(s3.shardable, 4 * p);
  EXPECT_DOUBLE_EQ(s3.fixed, frozen);
  // Sharded over many ranks, the model as built is what bounds it.
  const train::detail::StateBytes wide{10, 10, 10, 10, 100};
  EXPECT_DOUBLE_EQ(wide.total(), 100);
  OptimizerConfig plainSgd;
  plainSgd.momentum = 0;
  EXPECT_DOUBLE_EQ(train::detail::stateBytes(model, 0, 1, {}, plainSgd, cap).optimizer, 0);

  const memory::Limit limit{1000, "/sys/fs/cgroup/job/memory.max"};
  EXPECT_EQ(train::detail::checkStateFits({100, 100, 100, 0}, limit, 2, 0, 2, 0), "");
  EXPECT_NE(train::detail::checkStateFits({150, 150, 150, 0}, limit, 2, 0, 2, 0).find("activations may not fit"),
            std::string::npos);
  try {
    // 2400 bytes to shard, 500 per rank: 5 ranks would fit.
    train::detail::checkStateFits({200, 200, 200, 0, 0, 0, 2400, 0}, limit, 2, 1, 4, 3);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    for (const char* want : {"rank 1:", "ZeRO stage 3 on 4 ranks", "/sys/fs/cgroup/job/memory.max",
                             "distribution.zero: 3 on at least 5 ranks"}) {
      EXPECT_NE(what.find(want), std::string::npos) << want << " in: " << what;
    }
  }
  try {
    // A unit alone takes more than a rank has: no number of ranks helps.
    train::detail::checkStateFits({200, 200, 200, 0, 0, 0, 2400, 600}, limit, 2, 0, 4, 0);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("whatever the ranks"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cohort
