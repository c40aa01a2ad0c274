#include "cohort/parallel/unit_parts.h"

#include <torch/torch.h>

#include "cohort/parallel/ddp.h"

namespace cohort::parallel {

UnitParts::UnitParts(int parts, int index) : count_(parts), index_(index) {}

void UnitParts::take(const std::string& unit, std::vector<std::pair<std::string, at::Tensor>> values) {
  UnitPart p;
  int64_t bytes = 0;
  for (const auto& [name, t] : values) {
    p.names.push_back(name);
    const at::Tensor c = t.detach().cpu().contiguous();
    hash_.update(name.data(), name.size());
    hash_.update(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
    bytes += static_cast<int64_t>(c.numel()) * c.element_size();
  }
  largest_ = std::max(largest_, bytes);
  p.part = cutUnit(values, count_, index_);
  values.clear();
  parts_[unit] = std::move(p);
}

void UnitParts::put(const std::string& unit, UnitPart part) { parts_[unit] = std::move(part); }

int64_t UnitParts::partBytes() const {
  int64_t n = 0;
  for (const auto& [unit, p] : parts_) n += static_cast<int64_t>(p.part.numel()) * p.part.element_size();
  return n;
}

}  // namespace cohort::parallel
