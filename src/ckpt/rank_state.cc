#include "cohort/ckpt/rank_state.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <ATen/core/Generator.h>

#include <mutex>

#include "cohort/ckpt/state_dict.h"
#include "cohort/ckpt/tensor_file.h"

namespace cohort::ckpt {
namespace {

constexpr const char* kRng = "rng.cpu";
constexpr const char* kBufferPrefix = "buffer.";

// Cloning the generator is cheap; building its state tensor is not (~0.1 ms),
// so the copier thread does that.
std::function<at::Tensor()> rngStateLater() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return [clone = gen.clone()]() { return clone.get_state(); };
}

void setRngState(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

std::string rankStateFile(int rank) { return fmt::format("rank-{}.bin", rank); }

std::string optimizerFile(bool sharded, int rank) {
  return sharded ? fmt::format("optimizer-{}.bin", rank) : std::string("optimizer.bin");
}

std::string modelPartFile(int rank) { return fmt::format("model-{}.bin", rank); }

std::string stageFile(int stage, int stages, const std::string& name) {
  return stages > 1 ? fmt::format("stage{}-{}", stage, name) : name;
}

std::string sliceFile(int slice, int slices, const std::string& name) {
  return slices > 1 ? fmt::format("slice{}-{}", slice, name) : name;
}

std::vector<SnapshotItem> rankStateItems(const std::vector<SnapshotItem>& modelItems,
                                         bool ownBuffers) {
  std::vector<SnapshotItem> items{{kRng, rngStateLater()}};
  if (ownBuffers) {
    for (const auto& item : modelItems) {
      if (item.early) items.push_back({kBufferPrefix + item.name, item.tensor, true});
    }
  }
  return items;
}

void restoreRankState(const std::string& checkpoint, int rank, const torch::nn::Module& model) {
  const std::string file = checkpoint + "/" + rankStateFile(rank);
  const StateDict own = stateDict(model);
  const std::string prefix = kBufferPrefix;
  torch::NoGradGuard noGrad;
  for (const auto& [name, t] : readTensorFile(file).tensors) {
    if (name == kRng) setRngState(t);
    if (name.rfind(prefix, 0) != 0) continue;
    for (const auto& [n, live] : own) {
      if (n == name.substr(prefix.size()) && live.sizes() == t.sizes()) live.copy_(t);
    }
  }
}

}  // namespace cohort::ckpt
