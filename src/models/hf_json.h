#pragma once

// Reading Hugging Face's JSON files (config.json, model.safetensors.index.json)
// with errors that name the file and the key.

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>

namespace cohort::models {

// The JSON object in `path`. Throws DataError naming the file when it
// cannot be read, does not parse, or is not an object.
nlohmann::json readHfJson(const std::string& path);

// config[key] as a string, `otherwise` when it is absent. Throws DataError
// naming `origin` when it is something else.
std::string stringAt(const nlohmann::json& config, const char* key, const std::string& otherwise,
                     const std::string& origin);

// config[key] as an integer, `otherwise` when absent or null (< 0:
// required). Throws DataError naming `origin` and the key.
int64_t integerAt(const nlohmann::json& config, const char* key, int64_t otherwise, const std::string& origin);

// config[key] as a number, `otherwise` when absent or null.
double numberAt(const nlohmann::json& config, const char* key, double otherwise, const std::string& origin);

// A size config.json gives and the job's (`job` the model.* key).
struct JobSize {
  const char* key;
  int64_t theirs, ours;
  const char* job;
};

// Each of `sizes` must agree; one whose job value is 0 or less (taken from
// the data, not known yet) is skipped. Throws DataError naming `origin`,
// the key, both values and the setting that would match.
void checkSizes(std::initializer_list<JobSize> sizes, const std::string& origin);

}  // namespace cohort::models
