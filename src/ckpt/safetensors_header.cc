// The safetensors header (ckpt/safetensors.h): its own file, free of
// LibTorch's library, so the fuzz target links it alone.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

#include "cohort/ckpt/safetensors.h"
#include "cohort/core/error.h"

namespace cohort::ckpt {
namespace {

// Ordered: entries() lists the tensors as the header does.
using HeaderJson = nlohmann::ordered_json;

struct SafetensorsDtype {
  const char* name;
  at::ScalarType dtype;
};
constexpr SafetensorsDtype kSafetensorsDtypes[] = {{"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},
                                 {"BF16", at::kBFloat16}, {"I64", at::kLong}, {"I32", at::kInt},
                                 {"I16", at::kShort},     {"I8", at::kChar},  {"U8", at::kByte},
                                 {"BOOL", at::kBool}};

std::optional<at::ScalarType> dtypeOf(const std::string& name) {
  for (const SafetensorsDtype& d : kSafetensorsDtypes) {
    if (name == d.name) return d.dtype;
  }
  return std::nullopt;
}

}  // namespace

const char* safetensorsDtypeName(at::ScalarType dtype) {
  for (const SafetensorsDtype& d : kSafetensorsDtypes) {
    if (dtype == d.dtype) return d.name;
  }
  throw Error(fmt::format("safetensors: cohort does not write tensors of dtype {}", c10::toString(dtype)));
}

namespace {

std::string handled() {
  std::vector<std::string> names;
  for (const SafetensorsDtype& d : kSafetensorsDtypes) names.emplace_back(d.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace

SafetensorsHeader parseSafetensorsHeader(std::string_view text, uint64_t dataBytes, const std::string& origin) {
  const HeaderJson h = HeaderJson::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (!h.is_object()) throw DataError(fmt::format("{}: the safetensors header is not a JSON object", origin));
  SafetensorsHeader out;
  for (const auto& item : h.items()) {
    const std::string& name = item.key();
    const HeaderJson& v = item.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw DataError(fmt::format("{}: __metadata__ is not an object of strings", origin));
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) {
          throw DataError(fmt::format("{}: __metadata__ '{}' is not a string", origin, k));
        }
        out.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) {
      return DataError(fmt::format("{}: tensor '{}': {}", origin, name, what));
    };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
      throw bad("expected {\"dtype\", \"shape\", \"data_offsets\"}");
    }
    SafetensorsEntry e;
    e.name = name;
    if (!v["dtype"].is_string()) throw bad("dtype is not a string");
    const std::string dtype = v["dtype"].get<std::string>();
    const auto d = dtypeOf(dtype);
    if (!d) throw bad(fmt::format("dtype {}, which cohort does not handle (it reads {})", dtype, handled()));
    e.dtype = *d;
    if (!v["shape"].is_array()) throw bad("shape is not an array");
    uint64_t numel = 1;
    for (const HeaderJson& dim : v["shape"]) {
      if (!dim.is_number_unsigned()) throw bad(fmt::format("shape {} holds a dimension that is not a count", v["shape"].dump()));
      const uint64_t n = dim.get<uint64_t>();
      if (n > (uint64_t{1} << 48) || (n != 0 && numel > (uint64_t{1} << 48) / n)) {
        throw bad(fmt::format("shape {} is too large", v["shape"].dump()));
      }
      numel *= n;
      e.shape.push_back(static_cast<int64_t>(n));
    }
    const HeaderJson& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      throw bad("data_offsets is not [begin, end]");
    }
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.begin > e.end || e.end > dataBytes) {
      throw bad(fmt::format("data_offsets [{}, {}] are outside the {} bytes of data", e.begin, e.end, dataBytes));
    }
    const uint64_t bytes = numel * c10::elementSize(e.dtype);
    if (e.end - e.begin != bytes) {
      throw bad(fmt::format("shape {} of {} needs {} bytes, data_offsets [{}, {}] hold {}", v["shape"].dump(), dtype,
                            bytes, e.begin, e.end, e.end - e.begin));
    }
    out.tensors.push_back(std::move(e));
  }
  // Every byte of the data in exactly one tensor.
  std::vector<const SafetensorsEntry*> byOffset;
  for (const auto& e : out.tensors) byOffset.push_back(&e);
  std::stable_sort(byOffset.begin(), byOffset.end(), [](const auto* a, const auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t at = 0;
  const SafetensorsEntry* before = nullptr;
  for (const SafetensorsEntry* e : byOffset) {
    if (e->begin < at) {
      throw DataError(fmt::format("{}: tensors '{}' and '{}' overlap (bytes [{}, {}) and [{}, {}))", origin,
                                  before->name, e->name, before->begin, before->end, e->begin, e->end));
    }
    if (e->begin > at) {
      throw DataError(fmt::format("{}: bytes [{}, {}) of the data belong to no tensor (before '{}')", origin, at,
                                  e->begin, e->name));
    }
    at = e->end;
    before = e;
  }
  if (at != dataBytes) {
    throw DataError(fmt::format("{}: the last {} bytes of the data belong to no tensor", origin, dataBytes - at));
  }
  return out;
}

}  // namespace cohort::ckpt
