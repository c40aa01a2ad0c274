#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

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

}  // namespace cohort::models
