#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace cohort::models {

// ZeRO stage 3 (parallel/ddp.h): runs a sharding unit's forward with the unit's
// parameters present, which are otherwise held in parts across the ranks.
class UnitRunner {
 public:
  using Forward = std::function<at::Tensor(const at::Tensor&)>;
  virtual ~UnitRunner() = default;
  // f(x) for unit `unit` (an index into Model::shardingUnits(), or
  // kWholeModel: the parameters outside every unit, around the whole forward).
  virtual at::Tensor run(int unit, const Forward& f, const at::Tensor& x) = 0;
  static constexpr int kWholeModel = -1;
};

// Receives each sharding unit's parameters (Model::shardingUnits) as the
// model is built, one unit at a time, their values final (initialized as
// the whole model's of the same seed) and in the model's parameter order:
// a rank that keeps only its part of each (ZeRO stage 3) never holds the
// whole model. The model keeps those parameters without storage
// (releaseStorage): the receiver is their only holder.
class UnitSink {
 public:
  virtual ~UnitSink() = default;
  virtual void take(const std::string& unit, std::vector<std::pair<std::string, at::Tensor>> values) = 0;
  // false: only the shapes matter (a fit check before the real build): no
  // values are made, take() is not called.
  virtual bool wantsValues() const { return true; }
};

// A sink for a model built for its shapes alone (a fit check, an export):
// no values are made, nothing is kept.
class ShapesOnly : public UnitSink {
 public:
  void take(const std::string&, std::vector<std::pair<std::string, at::Tensor>>) override {}
  bool wantsValues() const override { return false; }
};

// The storage under `t` (and every view of it) given back: the tensor
// keeps its sizes and strides, and must not be read until
// allocateStorage() gives it storage again (uninitialized, t.numel()
// elements, from the storage's own allocator).
void releaseStorage(const at::Tensor& t);
void allocateStorage(const at::Tensor& t);
bool hasStorage(const at::Tensor& t);

}  // namespace cohort::models
