#pragma once

// What a run directory remembers of the scheduler that runs it:
// `slurm.json`, written by `cohort submit --slurm`, read by `cohort status`,
// `cohort cancel`, `cohort logs` and `cohort runs`, so a user never needs the
// Slurm job id. A sweep's directory holds one too, for the whole array.

#include <optional>
#include <string>
#include <vector>

namespace cohort::cluster {

struct SlurmRecord {
  std::string jobId;   // what sbatch printed; an array's id for a sweep
  int arrayTask = -1;  // this run's array task; -1: the whole job
  std::string script;  // the sbatch script
  std::string submitted;               // UTC, ISO 8601
  std::vector<std::string> overrides;  // a sweep point's --set values
  // "1234" or "1234_2": what squeue, sacct and scancel take for this run.
  std::string ref() const;
};

std::string slurmRecordPath(const std::string& dir);
// Writes `<dir>/slurm.json` atomically. Throws IoError.
void writeSlurmRecord(const std::string& dir, const SlurmRecord& record);
// nullopt when `dir` has none; throws DataError naming the file when it is
// unreadable.
std::optional<SlurmRecord> readSlurmRecord(const std::string& dir);

}  // namespace cohort::cluster
