#include "train/detail/fused_adamw.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "cohort/core/dense_floats.h"
#include "train/detail/fused_adamw_loop.h"

namespace cohort::train::detail {

AdamWScalars adamwScalars(const torch::optim::AdamWOptions& o, int64_t step) {
  // The doubles LibTorch's AdamW::step computes, then the float each ATen
  // float kernel makes of them.
  const double beta1 = std::get<0>(o.betas());
  const double beta2 = std::get<1>(o.betas());
  const double correction1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double correction2 = 1 - std::pow(beta2, static_cast<double>(step));
  AdamWScalars s;
  s.decay = static_cast<float>(1 - o.lr() * o.weight_decay());
  s.beta1 = static_cast<float>(beta1);
  s.oneMinusBeta1 = static_cast<float>(1 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.oneMinusBeta2 = static_cast<float>(1 - beta2);
  s.sqrtCorrection2 = static_cast<float>(std::sqrt(correction2));
  s.eps = static_cast<float>(o.eps());
  s.negStepSize = static_cast<float>(-(o.lr() / correction1));
  return s;
}

void adamwUpdate(const AdamWArrays& a, const AdamWScalars& s, int64_t begin, int64_t end) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2) {
    adamwUpdateAvx2(a, s, begin, end);
    return;
  }
#endif
  adamwLoop(a, s, begin, end);
}

void adamwMultiTensor(const std::vector<AdamWTask>& tasks, int64_t grain) {
  // starts[k]: where task k begins in the flat range of all elements.
  std::vector<int64_t> starts(tasks.size() + 1, 0);
  for (size_t k = 0; k < tasks.size(); ++k) starts[k + 1] = starts[k] + tasks[k].arrays.size;
  const int64_t total = starts.back();
  if (total == 0) return;
  at::parallel_for(0, total, std::max<int64_t>(grain, 1), [&](int64_t lo, int64_t hi) {
    // The first task that ends past lo, then each task overlapping [lo, hi).
    size_t k = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), lo) - starts.begin()) - 1;
    for (; k < tasks.size() && starts[k] < hi; ++k) {
      const int64_t begin = std::max(lo, starts[k]) - starts[k];
      const int64_t end = std::min(hi, starts[k + 1]) - starts[k];
      if (begin < end) adamwUpdate(tasks[k].arrays, tasks[k].scalars, begin, end);
    }
  });
}

namespace {

std::string key(const at::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

// Whether `t`, a state tensor of `p`, can be walked beside it; relays a
// float CPU one of another layout in place (see FusedAdamW).
bool alike(const at::Tensor& p, at::Tensor& t) {
  if (!t.defined() || t.scalar_type() != at::kFloat || !t.device().is_cpu() || t.sizes() != p.sizes()) {
    return false;
  }
  if (t.strides() != p.strides() || !t.is_non_overlapping_and_dense()) {
    at::Tensor relaid = at::empty_strided(p.sizes(), p.strides(), t.options());
    relaid.copy_(t);
    t.set_(relaid);
  }
  return denseFloatTwins(p, t);
}

// LibTorch 1.13's AdamW::step for one parameter, operation for operation.
void opStep(at::Tensor& p, const at::Tensor& grad, torch::optim::AdamWParamState& s,
            const torch::optim::AdamWOptions& o) {
  if (o.weight_decay() != 0) p.mul_(1 - o.lr() * o.weight_decay());
  const double beta1 = std::get<0>(o.betas());
  const double beta2 = std::get<1>(o.betas());
  const double correction1 = 1 - std::pow(beta1, s.step());
  const double correction2 = 1 - std::pow(beta2, s.step());
  s.exp_avg().mul_(beta1).add_(grad, 1 - beta1);
  s.exp_avg_sq().mul_(beta2).addcmul_(grad, grad, 1 - beta2);
  at::Tensor denom;
  if (o.amsgrad()) {
    torch::max_out(s.max_exp_avg_sq(), s.exp_avg_sq(), s.max_exp_avg_sq());
    denom = (s.max_exp_avg_sq().sqrt() / std::sqrt(correction2)).add_(o.eps());
  } else {
    denom = (s.exp_avg_sq().sqrt() / std::sqrt(correction2)).add_(o.eps());
  }
  p.addcdiv_(s.exp_avg(), denom, -(o.lr() / correction1));
}

}  // namespace

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::NoGradGuard noGrad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enableGrad(true);
    loss = closure();
  }
  std::vector<AdamWTask> tasks;
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    tasks.clear();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor& grad = p.grad();
      TORCH_CHECK(!grad.is_sparse(), "AdamW does not support sparse gradients");
      auto& slot = state_[key(p)];
      if (!slot) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& s = static_cast<torch::optim::AdamWParamState&>(*slot);
      // A state restored from a checkpoint has no running maximum (it is
      // not saved): it starts again from the restored average.
      if (o.amsgrad() && !s.max_exp_avg_sq().defined()) {
        s.max_exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
      }
      s.step(s.step() + 1);
      const bool fused = denseFloatTwins(p, grad) && alike(p, s.exp_avg()) && alike(p, s.exp_avg_sq()) &&
                         (!o.amsgrad() || alike(p, s.max_exp_avg_sq()));
      if (!fused) {
        opStep(p, grad, s, o);
        continue;
      }
      if (p.numel() == 0) continue;
      // A parameter listed twice steps twice, one step after the other.
      for (const auto& queued : tasks) {
        if (queued.arrays.param == p.data_ptr<float>()) {
          adamwMultiTensor(tasks);
          tasks.clear();
          break;
        }
      }
      AdamWTask t;
      t.arrays.param = p.data_ptr<float>();
      t.arrays.grad = grad.data_ptr<float>();
      t.arrays.expAvg = s.exp_avg().data_ptr<float>();
      t.arrays.expAvgSq = s.exp_avg_sq().data_ptr<float>();
      t.arrays.maxExpAvgSq = o.amsgrad() ? s.max_exp_avg_sq().data_ptr<float>() : nullptr;
      t.arrays.size = p.numel();
      t.scalars = adamwScalars(o, s.step());
      tasks.push_back(t);
    }
    adamwMultiTensor(tasks);
  }
  return loss;
}

}  // namespace cohort::train::detail
