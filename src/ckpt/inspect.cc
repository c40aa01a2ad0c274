// `cohort ckpt inspect`: what a checkpoint holds, down to its tensors. Apart
// from ckpt/tools.cc, which lists and verifies without LibTorch.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/tensor_file.h"
#include "cohort/ckpt/tools.h"
#include "cohort/core/error.h"
#include "cohort/core/text.h"

namespace cohort::ckpt {

namespace {

// The layout that wrote `m` (docs/checkpoint-format.md, "Another layout"):
// "2 data replicas x 2 pipeline stages (split [1, 3], 1f1b, 4 micro-batches)
// x 1 tensor rank; ZeRO stage 1".
std::string describeLayout(const Manifest& m) {
  const int stages = checkpointStages(m), tensors = checkpointSlices(m);
  const int replicas = std::max(1, m.worldSize / (stages * tensors));
  std::string pipe;
  if (stages > 1) {
    const nlohmann::json& p = m.extra["pipeline"];
    std::vector<int64_t> split;
    for (const auto& b : p.value("split", nlohmann::json::array())) split.push_back(b.is_number_integer() ? b.get<int64_t>() : 0);
    pipe = fmt::format(" (split [{}], {}, {} micro-batches)", fmt::join(split, ", "),
                       p.value("schedule", std::string("1f1b")), p.value("micro_batches", 0));
  }
  nlohmann::json zero = m.extra.value("zero", nlohmann::json());
  if (stages > 1) {
    const nlohmann::json layouts = m.extra["pipeline"].value("stage_zero", nlohmann::json());
    if (layouts.is_array() && !layouts.empty()) zero = layouts[0];
  }
  const int stage = zero.is_object() ? zero.value("stage", 0) : 0;
  return fmt::format("{} data replica{} x {} pipeline stage{}{} x {} tensor rank{}{}; ZeRO stage {}", replicas,
                     replicas == 1 ? "" : "s", stages, stages == 1 ? "" : "s", pipe, tensors,
                     tensors == 1 ? "" : "s",
                     tensors > 1 && m.extra["tensor"].value("sequence_parallel", false) ? " (sequence parallel)" : "",
                     stage);
}

}  // namespace

int inspectCommand(const std::string& path, bool tensors, std::ostream& out) {
  const std::string dir = findCheckpoint(path);
  if (dir.empty()) {
    out << "no valid checkpoint in " << path << "\n";
    return 2;
  }
  const Manifest m = readManifest(dir);
  out << fmt::format("checkpoint   {}\n", dir);
  out << fmt::format("format       cohort-checkpoint version {}\n", m.formatVersion);
  out << fmt::format("step         {}\n", m.step);
  out << fmt::format("position     epoch {}, batch {} per rank ({} samples of the epoch)\n",
                     m.epoch, m.batchInEpoch, m.samplesInEpoch);
  out << fmt::format("world size   {}\n", m.worldSize);
  out << fmt::format("layout       {}\n", describeLayout(m));
  out << fmt::format("job hash     {}\n", m.jobHash);
  out << fmt::format("created      {}\n", m.created);
  if (m.extra.contains("lr")) out << fmt::format("lr           {}\n", m.extra["lr"].dump());
  if (m.extra.contains("optimizer")) {
    out << fmt::format("optimizer    {}\n", m.extra["optimizer"].get<std::string>());
  }
  out << "files\n";
  size_t width = 16;  // the names' column (a pipeline's stage<s>-... are longer)
  for (const auto& f : m.files) width = std::max(width, f.name.size());
  for (const auto& f : m.files) {
    std::string what;
    try {
      nlohmann::json meta;
      const auto infos = readTensorFileInfo(dir + "/" + f.name, &meta);
      uint64_t elements = 0;
      for (const auto& t : infos) {
        uint64_t n = 1;
        for (int64_t s : t.shape) n *= static_cast<uint64_t>(s);
        elements += n;
      }
      what = fmt::format("{}: {} tensors, {} elements", meta.value("kind", std::string("?")),
                         infos.size(), elements);
      if (tensors) {
        for (const auto& t : infos) {
          what += fmt::format("\n      {} {} [{}]", t.name, t.dtype, fmt::join(t.shape, ", "));
        }
      }
    } catch (const Error& e) {
      what = fmt::format("unreadable: {}", e.what());
    }
    out << fmt::format("  {:<{}} {:>11}  {}  {}\n", f.name, width, humanBytes(f.size), f.checksum, what);
  }
  return 0;
}

}  // namespace cohort::ckpt
