// The operator profiler's place in training (monitor/profiler.h): the
// range of output.profile checked against the run's steps, and the
// profiler set up on every rank with the same trace directory.

#include <fmt/format.h>

#include <ctime>

#include "cohort/comm/comm.h"
#include "cohort/config/step_range.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/net.h"
#include "cohort/core/time.h"
#include "cohort/monitor/profiler.h"
#include "cohort/monitor/timeline.h"
#include "train/detail/state.h"

namespace cohort::train::detail {

void setUpProfiler(TrainState& s) {
  if (s.job.output.profile.empty()) return;
  const StepRange asked = parseStepRange(s.job.output.profile);  // checked when the job was read
  const int64_t total = s.steps.totalSteps;
  if (asked.first > total) {
    // Nothing would be recorded: a mistake worth stopping for, before training.
    throw ConfigError(fmt::format(
        "output.profile (cohort run --profile) {}: the run has {} steps (training.epochs, training.max_steps): "
        "choose steps from 1 to {}",
        asked.describe(), total, total));
  }
  StepRange range = asked;
  if (range.last > total) {
    range.last = total;
    log::warn("output.profile (cohort run --profile) {} ends past the run's last step, {}: profiling steps {}",
              asked.describe(), total, range.describe());
  }
  // Every rank traces into the same directory (TensorBoard shows one
  // profile run with a worker per rank): rank 0's time.
  const std::string traceTime =
      comm::shareFromRoot(s.comm, "profile_trace_time", formatUtc(std::time(nullptr), "%Y-%m-%d_%H-%M-%S"));
  if (s.step >= range.last) {
    log::warn("output.profile (cohort run --profile) {}: those steps were trained before this run resumed at step "
              "{}; nothing is profiled",
              range.describe(), s.step);
    return;
  }
  monitor::ProfilerOptions o;
  o.first = range.first;
  o.last = range.last;
  o.runDir = s.runDir.root;
  o.traceTime = traceTime;
  o.host = hostName();
  o.rank = s.comm.rank;
  o.worldSize = s.comm.worldSize;
  o.timeline = monitor::timeline();
  s.profiler = std::make_unique<monitor::Profiler>(o);
}

}  // namespace cohort::train::detail
