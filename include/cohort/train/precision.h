#pragma once

// training.precision as a rank applies it (docs/performance.md, "Mixed
// precision"). bf16 is autocast: the weights, their gradients and the
// optimizer state stay float32, and inside a forward pass LibTorch runs
// matrix products and convolutions in bfloat16 (oneDNN's kernels on CPUs
// with AVX512-BF16 or AMX) and keeps the rest in float32; the loss is
// computed in float32 from float32 logits. Backward follows the forward's
// types. Only the CPU path is tested; on a CUDA device the same scope
// autocasts there (untested). fp16 is the same with float16, on CUDA only
// (the job file refuses it without a CUDA build), and needs loss scaling
// (train/loss_scale.h).

#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "cohort/config/choices.h"
#include "cohort/core/cpu.h"

namespace cohort::train {

struct PrecisionChoice {
  Precision precision = Precision::fp32;  // fp32, bf16 or fp16, never auto
  std::string reason;                     // for the log: the setting, and the CPU for auto
};

// auto: bf16 when `cpu` has bf16 instructions (avx512_bf16 or amx_bf16),
// else fp32 (LibTorch's bf16 kernels without them are slower than fp32).
PrecisionChoice resolvePrecision(Precision setting, const CpuInfo& cpu);

// Autocast for the scope when `precision` is bf16 or fp16; nothing for fp32. Nests
// (an inner scope leaves the outer one's setting in place); the last one
// to close drops autocast's cache of cast weights, which would otherwise
// hold the previous step's copies.
class AutocastScope {
 public:
  AutocastScope(Precision precision, const c10::Device& device);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  bool cuda_ = false;
  bool wasEnabled_ = false;
  at::ScalarType wasType_ = at::kFloat;
};

}  // namespace cohort::train
