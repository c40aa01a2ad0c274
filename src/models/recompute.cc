#include "models/recompute.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <atomic>
#include <utility>

#include "cohort/models/model.h"

namespace cohort::models {
namespace {

std::atomic<int64_t> recomputedForwards{0};

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the recomputation needs, carried from forward to backward.
struct Recipe : torch::CustomClassHolder {
  std::function<at::Tensor(const at::Tensor&)> f;
  std::vector<at::Tensor> buffers;
  std::vector<at::Tensor> buffersAfterForward;
  at::Tensor rngBeforeForward;
  bool cpuAutocast = false;
  at::ScalarType cpuAutocastType = at::kBFloat16;
  bool gpuAutocast = false;
  at::ScalarType gpuAutocastType = at::kHalf;
};

// Sets autocast as `r` recorded it for the scope's life.
class AutocastAs {
 public:
  explicit AutocastAs(const Recipe& r)
      : cpu_(at::autocast::is_cpu_enabled()),
        cpuType_(at::autocast::get_autocast_cpu_dtype()),
        gpu_(at::autocast::is_enabled()),
        gpuType_(at::autocast::get_autocast_gpu_dtype()) {
    at::autocast::set_cpu_enabled(r.cpuAutocast);
    at::autocast::set_autocast_cpu_dtype(r.cpuAutocastType);
    at::autocast::set_enabled(r.gpuAutocast);
    at::autocast::set_autocast_gpu_dtype(r.gpuAutocastType);
    at::autocast::increment_nesting();
  }
  ~AutocastAs() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_cpu_enabled(cpu_);
    at::autocast::set_autocast_cpu_dtype(cpuType_);
    at::autocast::set_enabled(gpu_);
    at::autocast::set_autocast_gpu_dtype(gpuType_);
  }
  AutocastAs(const AutocastAs&) = delete;
  AutocastAs& operator=(const AutocastAs&) = delete;

 private:
  bool cpu_;
  at::ScalarType cpuType_;
  bool gpu_;
  at::ScalarType gpuType_;
};

class RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<Recipe> r) {
    auto generator = at::detail::getDefaultCPUGenerator();
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      r->rngBeforeForward = generator.get_state();
    }
    r->cpuAutocast = at::autocast::is_cpu_enabled();
    r->cpuAutocastType = at::autocast::get_autocast_cpu_dtype();
    r->gpuAutocast = at::autocast::is_enabled();
    r->gpuAutocastType = at::autocast::get_autocast_gpu_dtype();
    // Gradients are off here: nothing is kept. Autocast may cache the
    // weights it casts; those copies carry no graph, so the caller must
    // leave the autocast scope before backward (the step does: the cache is
    // cleared when the scope closes) or the recomputation would reuse them.
    at::Tensor y = r->f(x);
    for (const auto& b : r->buffers) r->buffersAfterForward.push_back(b.clone());
    ctx->save_for_backward({x});
    ctx->saved_data["recipe"] = c10::IValue::make_capsule(std::move(r));
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto r = c10::static_intrusive_pointer_cast<Recipe>(ctx->saved_data["recipe"].toCapsule());
    const at::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    at::Tensor y;
    {
      // The generator as the forward found it, and afterwards as backward did.
      auto generator = at::detail::getDefaultCPUGenerator();
      at::Tensor rngNow;
      {
        std::lock_guard<std::mutex> lock(generator.mutex());
        rngNow = generator.get_state();
        generator.set_state(r->rngBeforeForward);
      }
      AutocastAs autocast(*r);
      torch::AutoGradMode gradients(true);
      y = r->f(x);
      recomputedForwards.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(rngNow);
    }
    torch::autograd::backward({y}, {grads[0]});
    {
      // After backward: the recomputed graph saved the buffers it updated.
      torch::NoGradGuard noGrad;
      for (size_t k = 0; k < r->buffers.size(); ++k) r->buffers[k].copy_(r->buffersAfterForward[k]);
    }
    return {x.grad(), at::Tensor()};
  }
};

}  // namespace

int64_t recomputations() { return recomputedForwards.load(std::memory_order_relaxed); }

at::Tensor recomputed(std::function<at::Tensor(const at::Tensor&)> f, const at::Tensor& x,
                      std::vector<at::Tensor> buffers) {
  if (!torch::GradMode::is_enabled() || !x.requires_grad()) return f(x);
  auto r = c10::make_intrusive<Recipe>();
  r->f = std::move(f);
  r->buffers = std::move(buffers);
  return RecomputeFunction::apply(x, r);
}

}  // namespace cohort::models
