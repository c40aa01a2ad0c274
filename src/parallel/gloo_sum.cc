#include "parallel/detail/gloo_sum.h"

#include <torch/torch.h>

namespace cohort::parallel::detail {

GlooSum launchSum(c10d::ProcessGroup& pg, at::Tensor& flat, DdpOptions::Compression compression) {
  torch::NoGradGuard noGrad;
  GlooSum sum;
  if (compression == DdpOptions::Compression::none || flat.scalar_type() != at::kFloat) {
    std::vector<at::Tensor> v{flat};
    sum.work = pg.allreduce(v);
    return sum;
  }
  sum.compression = compression;
  const bool bf16 = compression == DdpOptions::Compression::bf16;
  const at::ScalarType type = bf16 ? at::kBFloat16 : at::kHalf;
  // Backends other than Gloo (NCCL) sum both types themselves.
  const bool gather = pg.getBackendName() == "gloo" && (bf16 || pg.getSize() == 2);
  if (!gather) {
    sum.wire = flat.to(type);
    std::vector<at::Tensor> v{sum.wire};
    sum.work = pg.allreduce(v);
    return sum;
  }
  const int64_t n = flat.numel();
  at::Tensor mine = flat.to(type).view(at::kHalf);
  sum.wire = torch::empty({pg.getSize(), n}, flat.options().dtype(at::kHalf));
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < pg.getSize(); ++r) outputs[0].push_back(sum.wire[r]);
  std::vector<at::Tensor> inputs{mine};
  sum.work = pg.allgather(outputs, inputs);
  return sum;
}

void completeSum(at::Tensor& flat, const GlooSum& sum) {
  if (!sum.wire.defined()) return;
  torch::NoGradGuard noGrad;
  if (sum.wire.dim() == 1) {
    flat.copy_(sum.wire);
    return;
  }
  // Gathered: add the ranks' values in rank order, in float32.
  const at::Tensor rows =
      sum.compression == DdpOptions::Compression::bf16 ? sum.wire.view(at::kBFloat16) : sum.wire;
  flat.copy_(rows[0]);
  for (int64_t r = 1; r < rows.size(0); ++r) flat.add_(rows[r]);
}

}  // namespace cohort::parallel::detail
