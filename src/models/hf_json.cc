#include "models/hf_json.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "cohort/core/error.h"

namespace cohort::models {

using nlohmann::json;

json readHfJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw DataError(fmt::format("{}: cannot read", path));
  std::stringstream text;
  text << in.rdbuf();
  try {
    json j = json::parse(text.str());
    if (!j.is_object()) throw DataError(fmt::format("{}: not a JSON object", path));
    return j;
  } catch (const json::parse_error& e) {
    throw DataError(fmt::format("{}: not JSON: {}", path, e.what()));
  }
}

std::string stringAt(const json& config, const char* key, const std::string& otherwise, const std::string& origin) {
  const auto it = config.find(key);
  if (it == config.end()) return otherwise;
  if (!it->is_string()) throw DataError(fmt::format("{}: {} is {}, not a string", origin, key, it->dump()));
  return it->get<std::string>();
}

int64_t integerAt(const json& config, const char* key, int64_t otherwise, const std::string& origin) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) {
    if (otherwise < 0) throw DataError(fmt::format("{}: no {}", origin, key));
    return otherwise;
  }
  if (!it->is_number_integer()) throw DataError(fmt::format("{}: {} is {}, not an integer", origin, key, it->dump()));
  return it->get<int64_t>();
}

double numberAt(const json& config, const char* key, double otherwise, const std::string& origin) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return otherwise;
  if (!it->is_number()) throw DataError(fmt::format("{}: {} is {}, not a number", origin, key, it->dump()));
  return it->get<double>();
}

void checkSizes(std::initializer_list<JobSize> sizes, const std::string& origin) {
  for (const JobSize& s : sizes) {
    if (s.ours > 0 && s.theirs != s.ours) {
      throw DataError(fmt::format("{}: {} is {}, the job's {} is {}: set {}: {}", origin, s.key, s.theirs, s.job,
                                  s.ours, s.job, s.theirs));
    }
  }
}

}  // namespace cohort::models
