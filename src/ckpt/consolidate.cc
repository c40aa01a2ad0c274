// `cohort ckpt consolidate` (ckpt/tools.h): one PyTorch file for the model,
// and one in torch.optim's state_dict() layout for the optimizer state,
// whatever the ZeRO stage and world size that wrote the checkpoint.

#include <fmt/format.h>
#include <torch/torch.h>

#include <map>
#include <set>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/stage_tensors.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/ckpt/tools.h"
#include "cohort/ckpt/weights.h"
#include "cohort/ckpt/zero_state.h"
#include "cohort/config/load.h"
#include "cohort/core/error.h"
#include "core/detail/json_int.h"

namespace cohort::ckpt {

namespace {

using GenericDict = c10::impl::GenericDict;

// A dict of str (or int) keys to values of any type, as Python's.
GenericDict dictOf(const c10::TypePtr& key) { return GenericDict(key, c10::AnyType::get()); }

// The optimizer's hyperparameters as torch.optim 1.13 keeps them in a
// param group (its step() reads every key).
GenericDict paramGroup(const OptimizerConfig& c, double lr, int64_t count) {
  GenericDict g = dictOf(c10::StringType::get());
  g.insert("lr", lr);
  g.insert("weight_decay", c.weightDecay);
  g.insert("maximize", false);
  g.insert("foreach", c10::IValue());
  g.insert("differentiable", false);
  if (c.name == OptimizerKind::adamw) {
    g.insert("betas", c10::ivalue::Tuple::create({c.betas.at(0), c.betas.at(1)}));
    g.insert("eps", c.eps);
    g.insert("amsgrad", false);
    g.insert("capturable", false);
  } else {
    g.insert("momentum", c.momentum);
    g.insert("dampening", 0.0);
    g.insert("nesterov", c.nesterov);
  }
  c10::List<int64_t> params;
  for (int64_t i = 0; i < count; ++i) params.push_back(i);
  g.insert("params", params);
  return g;
}

}  // namespace

int consolidateCommand(const std::string& path, const std::string& modelOut,
                       const std::string& optimizerOut, std::ostream& out, WeightsFormat format) {
  const std::string dir = findCheckpoint(path);
  if (dir.empty()) {
    out << "no valid checkpoint in " << path << "\n";
    return 2;
  }
  const Manifest m = readManifest(dir);
  // Tensor by tensor into the file, one ZeRO-3 bucket put together at a
  // time: the model is never held whole here.
  size_t tensors = 0;
  std::vector<std::string> order;
  {
    const std::unique_ptr<WeightsWriter> writer = openWeightsWriter(modelOut, format);
    order = visitCheckpointModel(dir, m, [&](const std::string& name, const at::Tensor& t) {
      writer->add(name, t);
      ++tensors;
    });
    writer->finish(order);
  }
  out << fmt::format("{}: step {}, written by {} ranks{}{}\n", dir, m.step, m.worldSize,
                     m.extra.contains("zero")
                         ? fmt::format(" at ZeRO stage {}", jsonInt(m.extra["zero"], "stage", 0))
                         : std::string(),
                     m.extra.contains("tensor")
                         ? fmt::format(", each layer split over {} tensor ranks",
                                       jsonInt(m.extra["tensor"], "tensors", 1))
                         : std::string());
  out << fmt::format("wrote the model ({} tensors, {}) to {}\n", tensors, choiceName(format), modelOut);
  if (optimizerOut.empty()) return 0;

  const JobConfig job = loadJobFromString(m.extra.value("job", std::string()),
                                          dir + "/manifest.json (extra.job)", {});
  // Each parameter's state read from its stage (the first that holds it;
  // a split one put together from its slices) and written at once: one
  // bucket of a sharded state is held at a time.
  CheckpointOptimizer checkpoint(dir, m);
  std::map<std::string, std::set<std::string>> kinds;  // parameter: its kinds of state
  for (const std::string& name : checkpoint.names()) {
    const size_t dot = name.rfind('.');
    kinds[name.substr(0, dot)].insert(name.substr(dot + 1));
  }
  // Parameters in the model's order, as torch.optim numbers
  // model.parameters(); buffers and frozen weights have no state.
  StateDictWriter writer(optimizerOut);
  GenericDict state = dictOf(c10::IntType::get());
  int64_t index = 0;
  for (const std::string& name : order) {
    auto it = kinds.find(name);
    if (it == kinds.end()) continue;
    GenericDict s = dictOf(c10::StringType::get());
    for (const char* kind : {"exp_avg", "exp_avg_sq", "momentum_buffer"}) {
      if (it->second.count(kind) != 0) {
        s.insert(kind, writer.add(name + "." + kind, checkpoint.state(name + "." + kind)));
      }
    }
    // torch.optim 1.13's AdamW counts steps in a float32 scalar tensor.
    if (it->second.count("step") != 0) {
      const int64_t step = checkpoint.state(name + ".step").item<int64_t>();
      s.insert("step", writer.add(name + ".step", torch::tensor(static_cast<float>(step))));
    }
    state.insert(index++, std::move(s));
  }
  if (index == 0) {
    out << fmt::format("{}: no optimizer state to write ({} keeps none yet, e.g. sgd without "
                       "momentum)\n", dir, choiceName(job.training.optimizer.name));
    return 2;
  }
  if (static_cast<size_t>(index) != kinds.size()) {
    throw DataError(fmt::format("{}: the optimizer state names {} parameters, model.bin holds {} "
                                "of them", dir, kinds.size(), index));
  }
  GenericDict top = dictOf(c10::StringType::get());
  top.insert("state", state);
  c10::impl::GenericList groups(c10::AnyType::get());
  groups.push_back(paramGroup(job.training.optimizer, m.extra.value("lr", job.training.optimizer.lr), index));
  top.insert("param_groups", groups);
  writer.finishValue(c10::IValue(top));
  out << fmt::format("wrote the {} state of {} parameters to {}\n",
                     choiceName(job.training.optimizer.name), index, optimizerOut);
  return 0;
}

}  // namespace cohort::ckpt
