#include "train/detail/stages.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <limits>
#include <map>
#include <numeric>

#include "cohort/comm/comm.h"
#include "cohort/core/cpu.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/time.h"
#include "cohort/parallel/pipeline.h"
#include "cohort/train/precision.h"
#include "core/detail/json_int.h"

namespace cohort::train::detail {

namespace {

std::string splitText(const std::vector<int64_t>& split) { return fmt::format("[{}]", fmt::join(split, ", ")); }

// Seconds each block takes, forward and backward, for one micro-batch of
// training.batch_size: each built on its own (the first with the model's
// input layers, the last with its output layers) and run on what the block
// before it returned, after a warm-up run. A busy machine makes a block
// look slower than it is, so the blocks are timed in three passes, one
// block after another in each, and a block's time is its fastest; blocks
// alike (the same parameter shapes: a GPT's inner blocks) take the fastest
// of theirs. One block is built at a time.
std::vector<double> measureBlocks(const JobConfig& job, const Datasets& data) {
  ModelConfig mc = job.model;
  if (decoderArch(mc.arch) && mc.vocabSize == 0) mc.vocabSize = data.vocabSize;
  if (mc.inChannels == 0) mc.inChannels = data.shape.channels;
  const int64_t blocks = pipelineBlocks(mc);
  const int64_t b = job.training.batchSize;
  const Precision precision = resolvePrecision(job.training.precision, cpuInfo()).precision;
  const models::InputShape input{mc.inChannels, data.shape.height, data.shape.width};
  std::vector<double> seconds(static_cast<size_t>(blocks), std::numeric_limits<double>::infinity());
  std::vector<std::string> kind(static_cast<size_t>(blocks));
  for (int pass = 0; pass < 3; ++pass) {
    at::Tensor x = decoderArch(mc.arch)
                       ? torch::randint(0, std::max<int64_t>(1, mc.vocabSize), {b, mc.blockSize}, torch::kLong)
                       : torch::randn({b, data.shape.channels, data.shape.height, data.shape.width});
    for (int64_t k = 0; k < blocks; ++k) {
      models::ModelPart part;
      part.firstBlock = k;
      part.endBlock = k + 1;
      part.input = k == 0;
      part.output = k == blocks - 1;
      part.exact = false;
      const auto block = models::createModel(mc, input, part);
      block->train();
      if (pass == 0) {
        for (const auto& p : block->parameters()) kind[static_cast<size_t>(k)] += fmt::format("{};", fmt::join(p.sizes(), ","));
      }
      at::Tensor out;
      for (int run = 0; run < 2; ++run) {
        const at::Tensor in = x.is_floating_point() ? x.detach().requires_grad_(true) : x;
        const auto start = SteadyClock::now();
        {
          AutocastScope autocast(precision, c10::kCPU);
          out = block->forward(in);
        }
        out.to(at::kFloat).sum().backward();
        if (run == 1) seconds[static_cast<size_t>(k)] = std::min(seconds[static_cast<size_t>(k)], secondsSince(start));
      }
      x = out.detach().to(at::kFloat);
    }
  }
  std::map<std::string, double> fastest;
  for (int64_t k = 0; k < blocks; ++k) {
    auto [it, fresh] = fastest.emplace(kind[static_cast<size_t>(k)], seconds[static_cast<size_t>(k)]);
    if (!fresh) it->second = std::min(it->second, seconds[static_cast<size_t>(k)]);
  }
  for (int64_t k = 0; k < blocks; ++k) seconds[static_cast<size_t>(k)] = fastest[kind[static_cast<size_t>(k)]];
  return seconds;
}

// The split a resumed pipelined checkpoint was written with (empty: none).
std::vector<int64_t> checkpointSplit(const ckpt::Manifest& m) {
  if (!m.extra.contains("pipeline")) return {};
  return jsonInts<int64_t>(m.extra["pipeline"].value("split", nlohmann::json::array()));
}

// Whether the checkpoint's stages are the job's (the same number, and the
// same split when the job names one).
bool checkLayout(const JobConfig& job, const parallel::Mesh& mesh, const ckpt::Manifest& m,
                 const std::string& path) {
  const int slices = ckpt::checkpointSlices(m);
  const int was = ckpt::checkpointStages(m);
  const std::vector<int64_t> split = checkpointSplit(m);
  const PipelineSplit& asked = job.distribution.pipeline.split;
  const bool same =
      slices == mesh.tensors && was == mesh.stages && (asked.automatic() || was == 1 || asked.blocks == split);
  if (same) return true;
  auto layout = [](int stages, const std::vector<int64_t>& s, int tensors) {
    std::string text = stages == 1 ? std::string("no pipeline")
                                   : fmt::format("{} pipeline stages{}", stages, s.empty() ? "" : " split " + splitText(s));
    return tensors > 1 ? text + fmt::format(", distribution.tensor {}", tensors) : text;
  };
  const std::string here =
      layout(mesh.stages, asked.automatic() ? std::vector<int64_t>{} : asked.blocks, mesh.tensors);
  if (mesh.world.rank == 0) {
    log::info("resuming {} (written by {}) in {}: each rank reads its part's tensors and their optimizer "
              "state from the checkpoint's stages (and slices) that hold them",
              path, layout(was, split, slices), here);
  }
  return false;
}

}  // namespace

std::vector<int64_t> resolveSplit(const JobConfig& job, const Datasets& data,
                                  const parallel::Mesh& mesh,
                                  const std::optional<ckpt::Manifest>& resumed,
                                  const std::string& resumeFrom, bool& restaged) {
  const bool same = !resumed || checkLayout(job, mesh, *resumed, resumeFrom);
  restaged = !same;
  if (!mesh.pipelined()) return {};
  const PipelineSplit& asked = job.distribution.pipeline.split;
  std::vector<int64_t> split;
  if (resumed && same) {
    split = checkpointSplit(*resumed);
  } else if (!asked.automatic()) {
    split = asked.blocks;
  } else {
    std::string shared;
    if (mesh.world.rank == 0) {
      const std::vector<double> seconds = measureBlocks(job, data);
      split = parallel::balanceStages(seconds, mesh.stages);
      std::vector<std::string> ms;
      for (double s : seconds) ms.push_back(fmt::format("{:.1f}", 1000 * s));
      log::info("pipeline split auto: blocks take {} ms (forward and backward of a micro-batch); "
                "stages get {} blocks",
                fmt::join(ms, ", "), splitText(split));
      shared = nlohmann::json(split).dump();
    }
    shared = comm::shareFromRoot(mesh.world, "pipeline_split", shared);
    split = nlohmann::json::parse(shared).get<std::vector<int64_t>>();
  }
  COHORT_ASSERT(static_cast<int>(split.size()) == mesh.stages, "a split of ", split.size(),
                " stages for ", mesh.stages);
  return split;
}

models::ModelPart partOf(const std::vector<int64_t>& split, int stage) {
  models::ModelPart part;
  if (split.empty()) return part;
  const auto s = static_cast<size_t>(stage);
  part.firstBlock = std::accumulate(split.begin(), split.begin() + static_cast<std::ptrdiff_t>(s), int64_t{0});
  part.endBlock = part.firstBlock + split[s];
  part.input = stage == 0;
  part.output = s + 1 == split.size();
  return part;
}

nlohmann::json pipelineLayout(const JobConfig& job, const parallel::Mesh& mesh,
                              const std::vector<int64_t>& split) {
  const PipelineConfig& p = job.distribution.pipeline;
  return {{"stages", mesh.stages},
          {"replicas", mesh.replicas},
          {"micro_batches", p.microBatchCount()},
          {"schedule", std::string(choiceName(p.schedule))},
          {"split", split}};
}

nlohmann::json gatherStageLayouts(const parallel::Mesh& mesh, const nlohmann::json& mine) {
  const comm::Comm& world = mesh.world;
  auto key = [](int stage) { return fmt::format("pipeline/stage_zero/{}", stage); };
  if (mesh.replica == 0) {
    const std::string text = mine.dump();
    world.store->set(key(mesh.stage), std::vector<uint8_t>(text.begin(), text.end()));
  }
  nlohmann::json all = nlohmann::json::array();
  for (int s = 0; s < mesh.stages; ++s) {
    try {
      world.store->wait({key(s)}, world.timeout);
    } catch (const std::exception& e) {
      throw TimeoutError(fmt::format("rank {}: pipeline stage {} did not publish its ZeRO layout within "
                                     "{} s: {}",
                                     world.rank, s, world.timeout.count() / 1000.0, e.what()));
    }
    const std::vector<uint8_t> raw = world.store->get(key(s));
    all.push_back(nlohmann::json::parse(std::string(raw.begin(), raw.end())));
  }
  return all;
}

}  // namespace cohort::train::detail
