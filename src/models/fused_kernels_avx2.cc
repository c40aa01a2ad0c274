// The fused ops' loops built for AVX2 and FMA
// (models/detail/fused_kernels_impl.h; flags in cmake/cpu_kernels.cmake).
#include "models/detail/fused_kernels_impl.h"
#include "models/detail/bf16_kernels_impl.h"
#include "models/detail/attention_kernels_impl.h"
