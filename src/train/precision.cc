#include "cohort/train/precision.h"

#include <ATen/autocast_mode.h>

#include <algorithm>

namespace cohort::train {

PrecisionChoice resolvePrecision(Precision setting, const CpuInfo& cpu) {
  if (setting != Precision::automatic) {
    return {setting, "training.precision: " + std::string(choiceName(setting))};
  }
  const auto has = [&](const char* f) {
    return std::find(cpu.features.begin(), cpu.features.end(), f) != cpu.features.end();
  };
  if (has("amx_bf16")) return {Precision::bf16, "training.precision: auto; the CPU has amx_bf16"};
  if (has("avx512_bf16")) return {Precision::bf16, "training.precision: auto; the CPU has avx512_bf16"};
  return {Precision::fp32, "training.precision: auto; the CPU has neither avx512_bf16 nor amx_bf16"};
}

AutocastScope::AutocastScope(Precision precision, const c10::Device& device) {
  if (precision != Precision::bf16 && precision != Precision::fp16) return;
  const at::ScalarType type = precision == Precision::fp16 ? at::kHalf : at::kBFloat16;
  active_ = true;
  cuda_ = device.is_cuda();
  if (cuda_) {
    wasEnabled_ = at::autocast::is_enabled();
    wasType_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(type);
  } else {
    wasEnabled_ = at::autocast::is_cpu_enabled();
    wasType_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(type);
  }
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  if (cuda_) {
    at::autocast::set_enabled(wasEnabled_);
    at::autocast::set_autocast_gpu_dtype(wasType_);
  } else {
    at::autocast::set_cpu_enabled(wasEnabled_);
    at::autocast::set_autocast_cpu_dtype(wasType_);
  }
}

}  // namespace cohort::train
