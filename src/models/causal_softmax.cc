// The causal softmax of attention (cohort/models/fused_ops.h): an autograd
// function over the loops of models/fused_kernels.h.
#include <torch/torch.h>

#include "models/fused_kernels.h"
#include "models/fused_ops.h"

namespace cohort::models {
namespace {

using Bf16 = c10::BFloat16;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t rowsOf(const at::Tensor& t) { return t.size(-1) == 0 ? 0 : t.numel() / t.size(-1); }

at::Tensor softmaxValues(const at::Tensor& scores) {
  const at::Tensor x = scores.contiguous();
  at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
  detail::causalSoftmaxForward(x.data_ptr<Bf16>(), y.data_ptr<Bf16>(), rowsOf(x), x.size(-2), x.size(-1));
  return y;
}

// Keeps its output, the one tensor the backward reads.
class CausalSoftmaxFunction : public torch::autograd::Function<CausalSoftmaxFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& scores) {
    at::Tensor y = softmaxValues(scores);
    ctx->save_for_backward({y});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor y = ctx->get_saved_variables()[0];
    const at::Tensor gy = grads[0].to(at::kBFloat16).contiguous();
    at::Tensor gx = at::empty_like(y, at::MemoryFormat::Contiguous);
    detail::causalSoftmaxBackward(y.data_ptr<Bf16>(), gy.data_ptr<Bf16>(), gx.data_ptr<Bf16>(), rowsOf(y),
                                  y.size(-2), y.size(-1));
    return {gx};
  }
};

}  // namespace

namespace detail {

bool causalSoftmaxTakes(const at::Tensor& scores) {
  return scores.defined() && scores.device().is_cpu() && scores.layout() == at::kStrided &&
         scores.scalar_type() == at::kBFloat16 && scores.dim() >= 2 && scores.size(-2) <= scores.size(-1);
}

at::Tensor causalSoftmaxFused(const at::Tensor& scores) {
  TORCH_CHECK(causalSoftmaxTakes(scores), "causalSoftmax: the fused path takes CPU scores [..., Q, T] (Q <= T) of bfloat16, got ",
              scores.sizes(), " ", scores.scalar_type(), " on ", scores.device());
  countFusedCall();
  // Without a gradient to keep: the values alone, no autograd node.
  if (!(at::GradMode::is_enabled() && scores.requires_grad())) return softmaxValues(scores);
  return CausalSoftmaxFunction::apply(scores);
}

}  // namespace detail

at::Tensor causalSoftmax(const at::Tensor& scores) {
  if (!fusedOpsOn() || !detail::causalSoftmaxTakes(scores)) return torch::softmax(scores, -1);
  return detail::causalSoftmaxFused(scores);
}

}  // namespace cohort::models
