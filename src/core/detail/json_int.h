#pragma once

// Integers read from JSON that cohort did not just write itself: manifests,
// file headers, heartbeats, reports.
//
// nlohmann's get<int64_t>() also accepts a floating-point number and converts
// it with a cast, which is undefined behaviour when it is out of range
// (1e22 as a record count). jsonInt accepts only an integer that fits `Int`
// and throws nlohmann's own type_error / out_of_range otherwise, so that the
// caller's existing catch of nlohmann::json::exception names the file.

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

namespace cohort {

template <class Int, class Json>
Int jsonInt(const Json& v) {
  static_assert(std::is_integral_v<Int> && !std::is_same_v<Int, bool>);
  if (!v.is_number_integer()) {
    throw nlohmann::json::type_error::create(
        302, std::string("type must be an integer, but is ") + v.type_name(), nullptr);
  }
  bool fits;
  if (v.is_number_unsigned()) {
    fits = v.template get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<Int>::max());
  } else {
    const int64_t s = v.template get<int64_t>();
    if constexpr (std::is_signed_v<Int>) {
      fits = s >= static_cast<int64_t>(std::numeric_limits<Int>::min()) &&
             s <= static_cast<int64_t>(std::numeric_limits<Int>::max());
    } else {
      fits = s >= 0 && static_cast<uint64_t>(s) <= std::numeric_limits<Int>::max();
    }
  }
  if (!fits) {
    throw nlohmann::json::out_of_range::create(406, "integer " + v.dump() + " is out of range",
                                               nullptr);
  }
  return v.template get<Int>();
}

// obj[key] as an integer, or `fallback` when obj has no `key`.
template <class Int, class Json>
Int jsonInt(const Json& obj, const char* key, Int fallback) {
  return obj.is_object() && obj.contains(key) ? jsonInt<Int>(obj.at(key)) : fallback;
}

template <class Int, class Json>
std::vector<Int> jsonInts(const Json& v) {
  if (!v.is_array()) {
    throw nlohmann::json::type_error::create(
        302, std::string("type must be an array of integers, but is ") + v.type_name(), nullptr);
  }
  std::vector<Int> out;
  out.reserve(v.size());
  for (const auto& e : v) out.push_back(jsonInt<Int>(e));
  return out;
}

}  // namespace cohort
