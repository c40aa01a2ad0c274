#include "cohort/train/optimizer.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <fmt/format.h>

#include <map>

#include "cohort/core/error.h"

namespace cohort::train {

std::unique_ptr<torch::optim::Optimizer> createOptimizer(const OptimizerConfig& c,
                                                         std::vector<at::Tensor> parameters) {
  if (c.name == "sgd") {
    torch::optim::SGDOptions o(c.lr);
    o.momentum(c.momentum).nesterov(c.nesterov).weight_decay(c.weightDecay);
    return std::make_unique<torch::optim::SGD>(std::move(parameters), o);
  }
  if (c.name == "adamw") {
    torch::optim::AdamWOptions o(c.lr);
    o.betas({c.betas.at(0), c.betas.at(1)}).eps(c.eps).weight_decay(c.weightDecay);
    return std::make_unique<torch::optim::AdamW>(std::move(parameters), o);
  }
  throw ConfigError("training.optimizer.name: unknown optimizer '" + c.name + "'");
}

void setLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

namespace {

std::string key(const at::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

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
