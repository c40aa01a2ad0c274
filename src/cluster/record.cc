#include "cohort/cluster/record.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cohort/core/error.h"
#include "cohort/core/file.h"

namespace cohort::cluster {

std::string SlurmRecord::ref() const {
  return arrayTask >= 0 ? fmt::format("{}_{}", jobId, arrayTask) : jobId;
}

std::string slurmRecordPath(const std::string& dir) { return dir + "/slurm.json"; }

void writeSlurmRecord(const std::string& dir, const SlurmRecord& r) {
  nlohmann::json j = {{"job_id", r.jobId},       {"script", r.script},
                      {"submitted", r.submitted}, {"overrides", r.overrides}};
  if (r.arrayTask >= 0) j["array_task"] = r.arrayTask;
  writeFileAtomic(slurmRecordPath(dir), j.dump(2) + "\n");
}

std::optional<SlurmRecord> readSlurmRecord(const std::string& dir) {
  const std::string path = slurmRecordPath(dir);
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  const auto j = nlohmann::json::parse(text.str(), nullptr, false);
  if (!j.is_object() || !j.contains("job_id") || !j["job_id"].is_string()) {
    throw DataError(fmt::format("{}: not a Slurm record written by `cohort submit` (no job_id)", path));
  }
  SlurmRecord r;
  r.jobId = j["job_id"].get<std::string>();
  r.arrayTask = j.value("array_task", -1);
  r.script = j.value("script", "");
  r.submitted = j.value("submitted", "");
  if (j.contains("overrides") && j["overrides"].is_array()) {
    for (const auto& o : j["overrides"]) {
      if (o.is_string()) r.overrides.push_back(o.get<std::string>());
    }
  }
  return r;
}

}  // namespace cohort::cluster
