// Parts of a rank's training loop that stand on their own
// (src/train/detail/): the exchange's options as set-up derives them from
// the job, and the fault plan a rank reads from COHORT_FAULT.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <utility>

#include "cohort/config/job.h"
#include "train/detail/faults.h"
#include "train/detail/setup.h"

namespace cohort {
namespace {

using train::detail::FaultPlan;

TEST(DdpOptionsFromJob, FollowTheDistributionKeys) {
  JobConfig job;
  job.distribution.bucketCapMb = 7;
  job.distribution.findUnusedParameters = true;
  job.distribution.broadcastBuffers = false;
  job.distribution.sharedMemory = false;
  using C = parallel::DdpOptions::Compression;
  for (const auto& [choice, wanted] : {std::pair{GradCompression::none, C::none},
                                       std::pair{GradCompression::fp16, C::fp16},
                                       std::pair{GradCompression::bf16, C::bf16}}) {
    job.distribution.compression = choice;
    const parallel::DdpOptions o = train::detail::ddpOptions(job);
    EXPECT_EQ(o.compression, wanted) << choiceName(choice);
    EXPECT_EQ(o.bucketCapMb, 7);
    EXPECT_TRUE(o.findUnusedParameters);
    EXPECT_FALSE(o.broadcastBuffers);
    EXPECT_FALSE(o.sharedMemory);
    // The loss carries 1 / world size; the exchange only sums.
    EXPECT_FALSE(o.divideGradients);
  }
  const parallel::DdpOptions defaults = train::detail::ddpOptions(JobConfig{});
  EXPECT_TRUE(defaults.sharedMemory);
  EXPECT_TRUE(defaults.broadcastBuffers);
  EXPECT_EQ(defaults.compression, C::none);
}

// COHORT_FAULT for the duration of one test.
class FaultVariable {
 public:
  explicit FaultVariable(const char* value) { setenv("COHORT_FAULT", value, 1); }
  ~FaultVariable() { unsetenv("COHORT_FAULT"); }
  FaultVariable(const FaultVariable&) = delete;
  FaultVariable& operator=(const FaultVariable&) = delete;
};

TEST(FaultPlan, PoisonsOnlyTheNamedRanksStepInTheFirstAttempt) {
  FaultVariable fault("nan@rank1:step3");
  EXPECT_TRUE(FaultPlan(1, 0).poisonInputs(3));
  EXPECT_FALSE(FaultPlan(1, 0).poisonInputs(2));
  EXPECT_FALSE(FaultPlan(1, 0).poisonInputs(4));
  EXPECT_FALSE(FaultPlan(0, 0).poisonInputs(3)) << "another rank";
  EXPECT_FALSE(FaultPlan(1, 1).poisonInputs(3)) << "a restarted attempt";
}

TEST(FaultPlan, AlwaysFiresInEveryAttempt) {
  FaultVariable fault("nan@rank0:step2:always");
  EXPECT_TRUE(FaultPlan(0, 0).poisonInputs(2));
  EXPECT_TRUE(FaultPlan(0, 3).poisonInputs(2));
}

TEST(FaultPlan, ANonPoisoningFaultLeavesTheInputsAndTheStepAlone) {
  // An exit fault acts after its step, never on the inputs; afterStep of
  // another step, or of another rank, returns (the process goes on).
  FaultVariable fault("exit3@rank0:step5");
  const FaultPlan plan(0, 0);
  for (int64_t step = 1; step <= 6; ++step) EXPECT_FALSE(plan.poisonInputs(step));
  plan.afterStep(4);
  FaultPlan(1, 0).afterStep(5);
  FaultPlan(0, 1).afterStep(5);
  // Reached only if none of them ended the process.
}

TEST(FaultPlan, AfterStepEndsTheProcessWithTheFaultsCode) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // LibTorch's threads may run
  FaultVariable fault("exit3@rank0:step5");
  EXPECT_EXIT(FaultPlan(0, 0).afterStep(5), ::testing::ExitedWithCode(3), "exiting with code 3");
}

TEST(FaultPlan, NoVariableNoFault) {
  unsetenv("COHORT_FAULT");
  const FaultPlan plan(0, 0);
  EXPECT_FALSE(plan.poisonInputs(1));
  plan.afterStep(1);
}

}  // namespace
}  // namespace cohort
