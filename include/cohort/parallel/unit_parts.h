#pragma once

// ZeRO stage 3 without the whole model in any process (docs/zero.md,
// "Built, loaded and saved unit by unit"): the model hands each sharding
// unit's values to a UnitParts as it builds them (models::ModelPart::sink),
// which keeps this rank's part of the unit, cut as the engine cuts its
// bucket (cutUnit), and drops the rest. The parts then go to the engine
// (DdpOptions::presharded) instead of a broadcast of the whole model.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cohort/core/checksum.h"
#include "cohort/models/unit_runner.h"
#include "cohort/parallel/options.h"

namespace cohort::parallel {

class UnitParts : public models::UnitSink {
 public:
  // Part `index` of `parts` (the rank in its data group, and its size).
  UnitParts(int parts, int index);
  // Keeps part `index` of the unit's values (a unit taken again, e.g. from
  // model.init_from after it was built, is replaced).
  void take(const std::string& unit, std::vector<std::pair<std::string, at::Tensor>> values) override;
  // Whether `unit` was taken.
  bool holds(const std::string& unit) const { return parts_.count(unit) > 0; }
  // Puts a part read elsewhere (a checkpoint cut alike) in place.
  void put(const std::string& unit, UnitPart part);
  // For DdpOptions::presharded; empties this object.
  std::map<std::string, UnitPart> release() { return std::move(parts_); }

  // Of every value taken, in order (names and bytes): ranks that built or
  // read the same model agree on it.
  std::string digest() const { return hash_.hex(); }
  int64_t units() const { return static_cast<int64_t>(parts_.size()); }
  int64_t largestUnitBytes() const { return largest_; }
  int64_t partBytes() const;

 private:
  int count_;
  int index_;
  std::map<std::string, UnitPart> parts_;
  Hasher hash_;
  int64_t largest_ = 0;
};

}  // namespace cohort::parallel
