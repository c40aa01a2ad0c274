#include "cohort/train/optimizer.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <map>

#include "cohort/core/dense_floats.h"
#include "cohort/core/error.h"
#include "train/detail/fused_adamw.h"
#include "train/detail/fused_sgd_arrays.h"

namespace cohort::train {
namespace {

std::string key(const at::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

// SGD with momentum, Nesterov and L2 weight decay, as LibTorch's SGD computes
// it (operation by operation: train/detail/fused_sgd_loop.h), but for each
// float32 CPU parameter in one pass over its memory, with AVX2 and FMA where
// the CPU has them (train/fused_sgd_avx2.cc):
//
//   g = grad + wd * p;  buf = momentum * buf + (1 - dampening) * g  (buf = g at the first step)
//   p -= lr * (nesterov ? g + momentum * buf : buf)
//
// where the operator-by-operator form reads and writes the parameter's size
// about thirteen times (and allocates two temporaries), this reads grad, buf
// and p and writes buf and p once: the step is memory-bound, so it is that
// much faster (ResNet-18: ~17 ms -> ~6 ms per step on one core). The state is
// LibTorch's SGDParamState, so checkpoints and optimizerState() see no
// difference. Parameters the loop cannot take (another dtype or device,
// overlapping memory) take the operator path.
class FusedSgd final : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;

  torch::Tensor step(LossClosure closure = nullptr) override {
    COHORT_ASSERT(closure == nullptr, "the fused SGD takes no closure");
    torch::NoGradGuard noGrad;
    for (auto& group : param_groups_) {
      const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        torch::optim::SGDParamState* s = nullptr;
        if (o.momentum() != 0) {  // without momentum there is no state (as in LibTorch's SGD)
          auto& slot = state_[key(p)];
          if (!slot) slot = std::make_unique<torch::optim::SGDParamState>();
          s = static_cast<torch::optim::SGDParamState*>(slot.get());
        }
        update(p, p.grad(), s, o);
      }
    }
    return {};
  }

 private:
  static void update(at::Tensor& p, const at::Tensor& grad, torch::optim::SGDParamState* s,
                     const torch::optim::SGDOptions& o) {
    const double momentum = o.momentum();
    const bool hasBuffer = s != nullptr && s->momentum_buffer().defined();
    if (!denseFloatTwins(p, grad)) {
      at::Tensor d = o.weight_decay() != 0 ? grad.add(p, o.weight_decay()) : grad;
      if (momentum != 0) {
        if (!hasBuffer) {
          s->momentum_buffer(d.clone());
        } else {
          s->momentum_buffer().mul_(momentum).add_(d, 1 - o.dampening());
        }
        d = o.nesterov() ? d.add(s->momentum_buffer(), momentum) : s->momentum_buffer();
      }
      p.add_(d, -o.lr());
      return;
    }
    float* buf = nullptr;
    bool first = false;
    if (momentum != 0) {
      // The buffer takes the parameter's layout (a restored one may not
      // have it), so the three run element by element in step.
      if (!hasBuffer || s->momentum_buffer().strides() != p.strides()) {
        at::Tensor b = at::empty_strided(p.sizes(), p.strides(), p.options());
        if (hasBuffer) b.copy_(s->momentum_buffer());
        s->momentum_buffer(b);
        first = !hasBuffer;
      }
      buf = s->momentum_buffer().data_ptr<float>();
    }
    detail::SgdArrays arrays;
    arrays.param = p.data_ptr<float>();
    arrays.grad = grad.data_ptr<float>();
    arrays.momentumBuffer = buf;
    detail::SgdScalars scalars;
    scalars.lr = static_cast<float>(o.lr());
    scalars.weightDecay = static_cast<float>(o.weight_decay());
    scalars.momentum = static_cast<float>(momentum);
    scalars.keep = static_cast<float>(1 - o.dampening());
    scalars.nesterov = o.nesterov();
    scalars.firstStep = first;
    at::parallel_for(0, p.numel(), 1 << 15,
                     [&](int64_t begin, int64_t end) { detail::sgdUpdate(arrays, scalars, begin, end); });
  }
};

}  // namespace

std::unique_ptr<torch::optim::Optimizer> createOptimizer(const OptimizerConfig& c,
                                                         std::vector<at::Tensor> parameters) {
  switch (c.name) {
    case OptimizerKind::sgd: {
      torch::optim::SGDOptions o(c.lr);
      o.momentum(c.momentum).nesterov(c.nesterov).weight_decay(c.weightDecay);
      return std::make_unique<FusedSgd>(std::move(parameters), o);
    }
    case OptimizerKind::adamw: {
      torch::optim::AdamWOptions o(c.lr);
      o.betas({c.betas.at(0), c.betas.at(1)}).eps(c.eps).weight_decay(c.weightDecay);
      return std::make_unique<detail::FusedAdamW>(std::move(parameters), o);
    }
  }
  throw ConfigError(fmt::format("training.optimizer.name: unknown optimizer ({})", static_cast<int>(c.name)));
}

int64_t optimizerStateBytes(torch::optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  auto add = [&](const at::Tensor& t) { bytes += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; };
  for (const auto& [key, state] : optimizer.state()) {
    if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(state.get())) {
      add(s->momentum_buffer());
    } else if (auto* a = dynamic_cast<torch::optim::AdamWParamState*>(state.get())) {
      add(a->exp_avg());
      add(a->exp_avg_sq());
      add(a->max_exp_avg_sq());
    }
  }
  return bytes;
}

void setLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

namespace {

std::vector<at::Tensor> allParameters(torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> out;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) out.push_back(p);
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> optimizerState(
    torch::optim::Optimizer& optimizer, const std::vector<std::string>& names) {
  const auto params = allParameters(optimizer);
  COHORT_ASSERT(params.size() == names.size(), params.size(), " parameters, ", names.size(), " names");
  std::vector<std::pair<std::string, at::Tensor>> out;
  auto& state = optimizer.state();
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = state.find(key(params[i]));
    if (it == state.end()) continue;  // no step taken for it yet
    if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
      if (s->momentum_buffer().defined()) {
        out.emplace_back(names[i] + ".momentum_buffer", s->momentum_buffer());
      }
    } else if (auto* a = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
      out.emplace_back(names[i] + ".step", torch::tensor({a->step()}, torch::kInt64));
      out.emplace_back(names[i] + ".exp_avg", a->exp_avg());
      out.emplace_back(names[i] + ".exp_avg_sq", a->exp_avg_sq());
    }
  }
  return out;
}

OptimizerStateCache::OptimizerStateCache(torch::optim::Optimizer& optimizer,
                                         std::vector<std::string> names)
    : optimizer_(optimizer), names_(std::move(names)) {}

const std::vector<std::pair<std::string, at::Tensor>>& OptimizerStateCache::get() {
  auto& state = optimizer_.state();
  if (state.size() != count_) {
    items_ = optimizerState(optimizer_, names_);
    count_ = state.size();
    ++generation_;
    steps_.clear();
    const auto params = allParameters(optimizer_);
    for (size_t i = 0; i < params.size(); ++i) {
      auto it = state.find(key(params[i]));
      if (it == state.end()) continue;
      if (dynamic_cast<torch::optim::AdamWParamState*>(it->second.get()) == nullptr) continue;
      for (const auto& [name, t] : items_) {
        if (name == names_[i] + ".step") steps_.emplace_back(it->second.get(), t);
      }
    }
  }
  for (auto& [s, t] : steps_) {
    // The previous checkpoint's copy of these scalars is done: the trainer
    // waits for it before the optimizer step that precedes this call.
    t.data_ptr<int64_t>()[0] = static_cast<const torch::optim::AdamWParamState*>(s)->step();
  }
  return items_;
}

void loadOptimizerState(torch::optim::Optimizer& optimizer, const std::vector<std::string>& names,
                        const std::vector<std::pair<std::string, at::Tensor>>& state,
                        const std::string& origin) {
  const auto params = allParameters(optimizer);
  COHORT_ASSERT(params.size() == names.size(), params.size(), " parameters, ", names.size(), " names");
  std::map<std::string, at::Tensor> byName(state.begin(), state.end());
  size_t used = 0;
  auto take = [&](const std::string& name, const at::Tensor& like) -> at::Tensor {
    auto it = byName.find(name);
    if (it == byName.end()) return {};
    if (like.defined() && it->second.sizes() != like.sizes()) {
      throw DataError(fmt::format("{}: optimizer state '{}' has shape {}, the parameter has {}",
                                  origin, name, fmt::join(it->second.sizes(), "x"),
                                  fmt::join(like.sizes(), "x")));
    }
    ++used;
    return like.defined() ? it->second.to(like.options()) : it->second;
  };
  const bool sgd = dynamic_cast<torch::optim::SGD*>(&optimizer) != nullptr;
  auto& live = optimizer.state();
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    if (sgd) {
      at::Tensor buf = take(names[i] + ".momentum_buffer", p);
      if (!buf.defined()) continue;
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(buf);
      live[key(p)] = std::move(s);
    } else {
      at::Tensor step = take(names[i] + ".step", {});
      at::Tensor avg = take(names[i] + ".exp_avg", p);
      at::Tensor sq = take(names[i] + ".exp_avg_sq", p);
      if (!step.defined() && !avg.defined() && !sq.defined()) continue;
      if (!step.defined() || !avg.defined() || !sq.defined()) {
        throw DataError(fmt::format("{}: incomplete adamw state for parameter '{}'", origin, names[i]));
      }
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(step.item<int64_t>());
      s->exp_avg(avg);
      s->exp_avg_sq(sq);
      live[key(p)] = std::move(s);
    }
  }
  if (used != byName.size()) {
    for (const auto& [name, t] : byName) {
      bool known = false;
      for (const auto& n : names) known = known || name.rfind(n + ".", 0) == 0;
      if (!known) {
        throw DataError(fmt::format("{}: optimizer state '{}' belongs to no parameter of this model "
                                    "(a checkpoint of another model?)",
                                    origin, name));
      }
    }
    throw DataError(fmt::format("{}: the optimizer state is of another optimizer than "
                                "training.optimizer.name ({})",
                                origin, sgd ? "sgd" : "adamw"));
  }
}

}  // namespace cohort::train
