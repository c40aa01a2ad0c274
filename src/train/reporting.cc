#include "train/detail/reporting.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cohort/core/log.h"
#include "cohort/monitor/straggler.h"
#include "train/detail/utilization.h"

namespace cohort::train::detail {

namespace {

// output.progress: auto is a bar on a terminal and plain lines otherwise; a
// bar without a terminal falls back to plain lines too.
monitor::ProgressMode progressMode(ProgressStyle style, bool terminal) {
  switch (style) {
    case ProgressStyle::off: return monitor::ProgressMode::off;
    case ProgressStyle::plain: return monitor::ProgressMode::plain;
    case ProgressStyle::automatic:
    case ProgressStyle::bar: break;
  }
  return terminal ? monitor::ProgressMode::bar : monitor::ProgressMode::plain;
}

}  // namespace

Reporter::Reporter(const JobConfig& job, const comm::Comm& comm, const RunDir& runDir,
                   const data::BatchLoader& loader, const PhaseTimes& phases, int stages,
                   const TrainSummary::Utilization* utilization)
    : job_(job), comm_(comm), loader_(loader), phases_(phases), stages_(stages), utilization_(utilization) {
  if (comm.rank != 0) return;
  metrics_ = std::make_unique<monitor::MetricsWriter>(runDir.metrics());
  if (job.output.tensorboard) {
    try {
      board_ = std::make_unique<monitor::TensorBoardWriter>(runDir.root + "/tensorboard");
    } catch (const std::exception& e) {
      log::warn("no TensorBoard output: {}", e.what());
    }
  }
  progress_ = std::make_unique<monitor::Progress>(
      progressMode(job.output.progress, log::consoleIsTerminal()), job.training.epochs);
}

void Reporter::event(const nlohmann::json& line) {
  if (metrics_) metrics_->writeLine(line.dump());
}

void Reporter::board(int64_t step, std::initializer_list<std::pair<const char*, double>> scalars) {
  if (!board_) return;
  try {
    for (const auto& [tag, v] : scalars) board_->addScalar(tag, step, v);
    board_->flush();
  } catch (const std::exception& e) {
    log::warn("TensorBoard output stopped: {}", e.what());
    board_.reset();
  }
}

void Reporter::evaluation(const monitor::EvalRecord& r) {
  if (metrics_) metrics_->write(r);
  board(r.step, {{"eval/top1", r.top1}, {"eval/top5", r.top5}, {"eval/loss", r.loss}});
  if (r.tokens > 0) board(r.step, {{"eval/perplexity", r.perplexity}});
}

void Reporter::startEpoch(int64_t epoch, int64_t steps) {
  if (progress_) progress_->startEpoch(epoch, steps);
  epochStart_ = SteadyClock::now();
  epochWaitStart_ = loader_.waitSeconds();
  epochImages_ = epochSteps_ = epochLossCount_ = 0;
  epochLossSum_ = 0;
  resetWindow();
  windowComputeStart_ = phases_.forward + phases_.backward;
}

void Reporter::resetWindow() {
  windowStart_ = SteadyClock::now();
  windowWaitStart_ = loader_.waitSeconds();
  windowLoss_ = 0;
  windowMicro_ = windowImages_ = windowSkipped_ = windowSteps_ = 0;
}

void Reporter::microBatch(double loss, int64_t images, int64_t skipped) {
  if (std::isfinite(loss)) {
    windowLoss_ += loss;
    epochLossSum_ += loss;
    ++epochLossCount_;
    ++windowMicro_;
  }
  windowImages_ += images;
  windowSkipped_ += skipped;
  epochImages_ += images;
}

double Reporter::mfu(double samplesPerS) const {
  if (utilization_ == nullptr || !utilization_->ceiling || !std::isfinite(samplesPerS)) return NAN;
  return utilizationFraction(*utilization_, samplesPerS, comm_.worldSize);
}

void Reporter::stepDone(int64_t step, int64_t epoch, double lr) {
  ++epochSteps_;
  ++windowSteps_;
  if (step % job_.training.logEvery == 0) {
    record(step, epoch, lr);
  } else if (progress_) {
    const double elapsed = secondsSince(epochStart_);
    const double rate = elapsed > 0 ? double(epochImages_) * comm_.worldSize / stages_ / elapsed : NAN;
    progress_->update(epochSteps_, epochLossSum_ / std::max<int64_t>(1, epochLossCount_), rate, false, mfu(rate));
  }
}

void Reporter::record(int64_t step, int64_t epoch, double lr) {
  const int world = comm_.worldSize;
  const double elapsed = secondsSince(windowStart_);
  const double compute = phases_.forward + phases_.backward - windowComputeStart_;
  windowComputeStart_ = phases_.forward + phases_.backward;
  constexpr int kSlots = 7;
  at::Tensor w = torch::zeros({kSlots + world}, torch::kFloat64);
  {
    auto a = w.accessor<double, 1>();
    const double values[kSlots] = {windowLoss_,          double(windowMicro_),
                                   loader_.waitSeconds() - windowWaitStart_, elapsed,
                                   double(windowImages_), double(windowSkipped_),
                                   double(windowSteps_)};
    for (int k = 0; k < kSlots; ++k) a[k] = values[k];
    a[kSlots + comm_.rank] = compute;
  }
  comm::allreduceSum(comm_, w, "train metrics");
  auto a = w.accessor<double, 1>();
  const double factor = job_.distribution.stragglerFactor;
  if (comm_.rank == 0 && factor > 0 && a[6] > 0) {
    std::vector<double> msPerStep;
    for (int r = 0; r < world; ++r) msPerStep.push_back(1000 * a[kSlots + r] / (a[6] / world));
    for (const auto& s : monitor::findStragglers(msPerStep, factor)) {
      log::warn("straggler at step {}: {} (distribution.straggler_factor {})", step,
                monitor::describe(s), factor);
      event({{"event", "straggler"},
             {"step", step},
             {"rank", s.rank},
             {"compute_ms_per_step", s.ms},
             {"median_ms_per_step", s.medianMs}});
    }
  }
  monitor::TrainRecord r;
  r.step = step;
  r.epoch = epoch;
  r.loss = a[0] / std::max(1.0, a[1]);
  r.lr = lr;
  r.imagesPerS = a[3] > 0 ? a[4] / stages_ / (a[3] / world) : 0;
  if (tokenModel(job_)) r.tokensPerS = r.imagesPerS * double(job_.model.blockSize);
  r.dataWaitFrac = a[3] > 0 ? a[2] / a[3] : 0;
  r.corruptSkipped = static_cast<int64_t>(a[5]);
  if (utilization_ != nullptr && utilization_->flops.known) {
    r.modelFlopsPerS = utilization_->flops.trainingPerSample * r.imagesPerS;
    r.mfu = mfu(r.imagesPerS);
  }
  if (metrics_) metrics_->write(r);
  board(step, {{"train/loss", r.loss},
               {"train/lr", r.lr},
               {"train/images_per_s", r.imagesPerS},
               {"train/data_wait_frac", r.dataWaitFrac}});
  if (r.tokensPerS > 0) board(step, {{"train/tokens_per_s", r.tokensPerS}});
  if (std::isfinite(r.mfu)) board(step, {{"train/mfu", r.mfu}});
  if (progress_) progress_->update(epochSteps_, r.loss, r.imagesPerS, true, r.mfu);
  resetWindow();
}

EpochTotals Reporter::endEpoch() {
  EpochTotals t;
  t.seconds = secondsSince(epochStart_);
  t.waitSeconds = loader_.waitSeconds() - epochWaitStart_;
  t.images = epochImages_;
  t.steps = epochSteps_;
  t.meanLoss = epochLossSum_ / std::max<int64_t>(1, epochLossCount_);
  if (progress_) progress_->endEpoch();
  return t;
}

}  // namespace cohort::train::detail
