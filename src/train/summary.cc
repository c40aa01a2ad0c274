#include "cohort/train/trainer.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "cohort/ckpt/resume.h"
#include "cohort/config/load.h"
#include "cohort/core/fence.h"
#include "cohort/core/file.h"
#include "cohort/core/memory_limit.h"
#include "train/detail/setup.h"
#include "train/detail/utilization.h"

namespace cohort::train {

namespace {

// <run>/plan.json (`cohort run --plan`): the prediction for this run's
// ranks beside what the run measured, and the error of each.
// Without one, the plan `cohort plan` kept for this very job.
nlohmann::json planComparison(const JobConfig& job, const RunDir& runDir, int worldSize, double peakRssMb,
                              double samplesPerS) {
  std::error_code ec;
  std::string path = runDir.plan();
  if (!std::filesystem::exists(path, ec)) path = savedPlanPath(job);
  std::ifstream in(path);
  if (!in) return nullptr;
  nlohmann::json j = {{"file", path}};
  // A plan edited by hand or of another version never costs the summary.
  try {
    const auto plan = nlohmann::json::parse(in, nullptr, false);
    if (plan.is_discarded() || !plan.is_object()) throw std::runtime_error("not a JSON object");
    const auto ranksOf = [](const nlohmann::json& row) -> int64_t {
      if (!row.is_object() || !row.contains("setting") || !row["setting"].is_object()) return 0;
      const auto& r = row["setting"].value("ranks", nlohmann::json());
      return r.is_number_integer() ? r.get<int64_t>() : 0;
    };
    nlohmann::json row;
    if (plan.contains("predicted") && ranksOf(plan["predicted"]) == worldSize) row = plan["predicted"];
    const auto byNodes = plan.value("by_nodes", nlohmann::json::array());
    if (byNodes.is_array()) {
      for (const auto& r : byNodes) {
        if (row.is_null() && ranksOf(r) == worldSize) row = r;
      }
    }
    if (row.is_null()) {
      j["note"] = "the plan predicts no setting of " + std::to_string(worldSize) + " ranks";
      return j;
    }
    const double peak = row.at("memory_mb").at("peak").get<double>();
    const double sps = row.at("speed").at("samples_per_s").get<double>();
    const auto error = [](double predicted, double measured) {
      return measured > 0 ? 100 * (predicted - measured) / measured : 0.0;
    };
    j["setting"] = row["setting"];
    j["predicted"] = {{"peak_rss_mb", peak}, {"samples_per_s", sps}, {"step_ms", row["speed"].value("step_ms", 0.0)}};
    j["measured"] = {{"peak_rss_mb", peakRssMb}, {"samples_per_s", samplesPerS}};
    j["error_pct"] = {{"peak_rss_mb", error(peak, peakRssMb)}, {"samples_per_s", error(sps, samplesPerS)}};
  } catch (const std::exception& e) {
    j = {{"file", path}, {"note", std::string("not a plan cohort can read: ") + e.what()}};
  }
  return j;
}

}  // namespace

void writeSummary(const JobConfig& job, const TrainSummary& s, const RunDir& runDir,
                  int worldSize) {
  nlohmann::json j;
  j["job"] = job.name;
  j["status"] = s.stopped ? "stopped" : "completed";
  j["world_size"] = worldSize;
  j["epochs"] = s.epochs;
  j["steps"] = s.steps;
  j["global_batch"] = s.globalBatch;
  j["steps_per_epoch"] = s.stepsPerEpoch;
  j["epoch_samples"] = s.epochSamples;
  j["peak_lr"] = s.peakLr;
  j["parameters"] = s.parameters;
  j["trainable_parameters"] = s.trainableParameters;
  if (!s.loraBaseDigest.empty()) j["lora_base_digest"] = s.loraBaseDigest;
  j["wall_time_s"] = s.seconds;
  j["train_images"] = s.images;
  j["train_images_per_s"] = s.imagesPerS;  // samples: token windows for a language model
  if (tokenModel(job)) {
    j["train_tokens_per_s"] = s.imagesPerS * double(job.model.blockSize);
  }
  j["data_wait_frac"] = s.dataWaitFrac;
  // The most memory this process (rank 0) held at once, resident; and each
  // rank's, by job rank (an agent's round: this round's ranks).
  if (const double peak = memory::peakResidentMb(); peak > 0) j["peak_rss_mb"] = peak;
  if (!s.peakRssMbPerRank.empty()) j["peak_rss_mb_per_rank"] = s.peakRssMbPerRank;
  if (auto plan = planComparison(job, runDir, worldSize, j.value("peak_rss_mb", 0.0), s.imagesPerS); !plan.is_null()) {
    j["plan"] = std::move(plan);
  }
  j["memory"] = {{"zero_stage", s.memory.zeroStage},
                 {"parameter_mb", double(s.memory.parameterBytes) / (1 << 20)},
                 {"gradient_mb", double(s.memory.gradientBytes) / (1 << 20)},
                 {"optimizer_state_mb", double(s.memory.optimizerStateBytes) / (1 << 20)}};
  if (s.memory.elementsKnown) {
    const ModelElements& e = s.memory.elements;
    j["memory"]["elements"] = {{"trainable", e.trainable}, {"frozen", e.frozen}, {"buffers", e.buffers},
                               {"unit", e.unit}, {"unit_with_frozen", e.unitWithFrozen}};
  }
  if (s.memory.zeroStage == 3) {
    j["memory"]["largest_unit_mb"] = double(s.memory.largestUnitBytes) / (1 << 20);
    j["memory"]["unit_peak_mb"] = double(s.memory.unitPeakBytes) / (1 << 20);
    if (s.memory.frozenBytes > 0) j["memory"]["frozen_mb"] = double(s.memory.frozenBytes) / (1 << 20);
  }
  if (!s.stages.empty()) {
    nlohmann::json stages = nlohmann::json::array();
    for (const auto& st : s.stages) {
      stages.push_back({{"blocks", {st.firstBlock, st.endBlock}},
                        {"parameters", st.parameters},
                        {"state_mb", double(st.stateBytes) / (1 << 20)},
                        {"peak_rss_mb", st.peakResidentMb},
                        {"idle_frac", st.idleFraction},
                        {"bubble_frac_theory", st.bubbleFraction},
                        {"recv_s", st.recvSeconds},
                        {"round_end_wait_s", st.endSeconds},
                        {"send_s", st.sendSeconds},
                        {"schedule_s", st.roundSeconds},
                        {"activations_held_peak", st.heldPeak}});
    }
    j["pipeline"] = {{"stages", s.stages.size()},
                     {"micro_batches", s.microBatches},
                     {"schedule", s.schedule},
                     {"per_stage", std::move(stages)}};
  }
  if (!s.tensor.is_null()) j["tensor"] = s.tensor;
  j["corrupt_skipped"] = s.corruptSkipped;
  j["nonfinite_skipped"] = s.nonfiniteSkipped;
  j["recomputed_forwards"] = s.recomputedForwards;
  if (s.lossScale > 0) j["loss_scale"] = s.lossScale;
  if (s.phases.steps > 0) {
    const double k = 1000.0 / double(s.phases.steps);
    j["phase_ms_per_step"] = {{"data_wait", k * s.phases.dataWait},
                              {"forward", k * s.phases.forward},
                              {"backward", k * s.phases.backward},
                              {"exposed_comm", k * s.phases.exposedComm},
                              {"optimizer", k * s.phases.optimizer}};
    if (!s.stages.empty()) {
      j["phase_ms_per_step"]["pipeline_wait"] = k * s.phases.pipelineWait;
      j["phase_ms_per_step"]["pipeline_send"] = k * s.phases.pipelineTransfer;
    }
  }
  j["compute"] = toJson(s.compute);
  j["utilization"] = detail::utilizationJson(s.utilization, s.imagesPerS, worldSize, s.globalBatch);
  j["restart_count"] = s.restartCount;
  if (s.resumedFromStep >= 0) {
    j["resumed_from"] = {{"step", s.resumedFromStep}, {"checkpoint", s.resumedFrom}};
  }
  if (job.checkpoint.enabled) {
    const auto& c = s.checkpoints;
    j["checkpoints"] = {{"dir", ckpt::checkpointDir(job, runDir)},
                        {"taken", c.taken},
                        {"skipped", c.skipped},
                        {"failed", c.failed},
                        {"blocked_ms_mean", c.taken + c.skipped > 0
                                                ? 1000 * c.blockedSeconds / double(c.taken + c.skipped)
                                                : 0.0},
                        {"blocked_ms_median", 1000 * c.medianBlockedSeconds},
                        {"blocked_ms_max", 1000 * c.maxBlockedSeconds},
                        {"blocked_ms_total", {{"mark", 1000 * c.markSeconds},
                                              {"wait_before_step", 1000 * c.copyWaitSeconds}}},
                        {"bytes_written", c.bytesWritten}};
  }
  if (s.evaluated) {
    j["eval"] = {{"epoch", s.lastEval.epoch}, {"top1", s.lastEval.top1},
                 {"top5", s.lastEval.top5},   {"loss", s.lastEval.loss},
                 {"samples", s.lastEval.samples}};
    if (s.lastEval.tokens > 0) {
      j["eval"]["tokens"] = s.lastEval.tokens;
      j["eval"]["perplexity"] = s.lastEval.perplexity;
      if (s.lastEval.lossPerByte > 0) {
        j["eval"]["loss_per_byte"] = s.lastEval.lossPerByte;
        j["eval"]["bits_per_byte"] = s.lastEval.bitsPerByte;
      }
    }
    j["best_top1"] = s.bestTop1;
  }
  j["run_dir"] = runDir.root;
  j["outputs"] = {{"job", runDir.jobFile()}, {"metrics", runDir.metrics()},
                  {"logs", runDir.logsDir()}};
  if (job.output.saveFinal) j["outputs"]["model"] = detail::finalModelPath(job, runDir);
  fence::check("summary.json");
  writeFileAtomic(runDir.summary(), j.dump(2) + "\n");
}

}  // namespace cohort::train
