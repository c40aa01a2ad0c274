// A memory limit the training state cannot fit, with real processes in a
// real memory cgroup (root only; skipped otherwise): the fit check stops the
// run before it allocates the state, with exit 2 and the limit's source;
// a state that fits the check but not the run is killed by the kernel, and
// the launcher says that the out-of-memory killer did it.

#include <fmt/format.h>
#include <gtest/gtest.h>


#include "util/cgroup.h"
#include "util/corpus.h"
#include "util/jobs.h"
#include "util/process.h"
#include "util/skip.h"

namespace cohort {
namespace {


class ZeroLimit : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!group_.unavailable().empty()) COHORT_SKIP(group_.unavailable());
    test::writeText(dir.file("corpus.txt"), test::corpus(6'000));
    auto tok = test::cohort({"data", "tokenize", dir.file("corpus.txt"), dir.file("tok"), "--no-progress"});
    ASSERT_EQ(tok.exitCode, 0) << tok.describe();
  }

  // One rank training a GPT of 50M parameters (AdamW: 772 MB of state
  // unsharded) inside the cgroup, limited to `limitMb`.
  test::ProcessResult train(const std::string& tag, int limitMb, int zero) {
    group_.setLimit(static_cast<int64_t>(limitMb) << 20);
    test::writeText(dir.file(tag + ".yaml"), R"(name: )" + tag + R"(
model: {arch: gpt, n_layer: 16, n_head: 8, n_embd: 512, block_size: 64}
data:
  train: {kind: tokens, path: )" + dir.file("tok/train") + R"(}
  loader_threads: 1
distribution: {procs_per_node: 1, threads_per_rank: 1, max_restarts: 0, zero: )" +
                                             std::to_string(zero) + R"(}
training:
  max_steps: 2
  batch_size: 2
  precision: fp32
  optimizer: {name: adamw, lr: 0.001}
checkpoint: {enabled: false}
output: {progress: off, save_final: false}
)");
    return test::run(group_.wrap({test::cohortBin(), "run", dir.file(tag + ".yaml"), "--run-dir", dir.file(tag)}));
  }

  test::MemoryCgroup group_{"zero-limit"};
  test::TempDir dir;
};

TEST_F(ZeroLimit, AStateThatCannotFitEvenAtStage3IsRefusedAndAnOutOfMemoryKillIsNamed) {
  // Stage 3 on one rank holds everything: 772 MB, over 650.
  auto refused = train("refused", 650, 3);
  EXPECT_EQ(refused.exitCode, 2) << refused.describe();
  const std::string said = refused.out + refused.err;
  for (const std::string& want : {std::string("rank 0: the training state does not fit in memory"),
                                 std::string("ZeRO stage 3 on 1 rank"), group_.limitFile()}) {
    EXPECT_NE(said.find(want), std::string::npos) << want << "\n" << refused.describe();
  }
  // 772 MB fits the check under 800, but the run needs more: the kernel
  // kills the rank, and the launcher says who.
  auto killed = train("killed", 800, 0);
  EXPECT_EQ(killed.exitCode, 1) << killed.describe();
  EXPECT_NE((killed.out + killed.err).find("sent by the kernel's out-of-memory killer"), std::string::npos)
      << killed.describe();
  EXPECT_NE((killed.out + killed.err).find("activations may not fit"), std::string::npos)
      << killed.describe();
}

}  // namespace
}  // namespace cohort
