#pragma once

// The files of one `cohort score` run beside OUT (docs/deploy.md):
//
//   OUT.run/score.json        what is being scored (model, data, samples,
//                             --batch-size, the ranks' parts): a rerun must
//                             match it, and the command and its ranks both
//                             read the parts and batch size from it
//   OUT.run/part-<r>.jsonl    rank r's predictions for its contiguous part,
//                             appended a batch at a time
//   OUT.run/rank-<r>.log      rank r's log
//   OUT.run/summary.json      the outcome of the last run
//   OUT.run/lock              flock'ed by the command scoring into OUT
//
// A part holds complete lines for samples begin, begin + 1, ... in order;
// a rank killed mid-write leaves at most one torn line at its end, which
// keptLines() cuts off. The parts are concatenated into OUT once every rank
// has finished, and removed.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace cohort::serve::detail {

struct ScorePaths {
  std::string out;  // OUT, absolute
  std::string dir() const { return out + ".run"; }
  std::string record() const { return dir() + "/score.json"; }
  std::string summary() const { return dir() + "/summary.json"; }
  std::string lock() const { return dir() + "/lock"; }  // held by the command while it runs
  std::string part(int rank) const { return dir() + "/part-" + std::to_string(rank) + ".jsonl"; }
  std::string log(int rank) const { return dir() + "/rank-" + std::to_string(rank) + ".log"; }
};

struct ScoreRecord {
  std::string model, modelFingerprint;
  std::string data, dataFingerprint;
  int64_t samples = 0;
  bool tokens = false;
  int64_t topK = 0;   // images
  int procs = 1;
  int64_t batchSize = 0;  // batches start at its multiples: the parts' boundaries do too
  std::vector<std::pair<int64_t, int64_t>> parts;  // rank -> [begin, end)

  nlohmann::json toJson() const;
  // Throws DataError naming `origin`.
  static ScoreRecord fromJson(const nlohmann::json& j, const std::string& origin);
  // What differs between `before` (a run under way) and this one, one
  // phrase per difference ("the model's weights changed"); empty: the same.
  std::vector<std::string> differences(const ScoreRecord& before) const;
};

// Contiguous parts of whole batches: rank r takes batches [r*n/procs,
// (r+1)*n/procs) of the n = ceil(samples / batchSize), so the batches do not
// depend on the number of ranks.
std::vector<std::pair<int64_t, int64_t>> splitParts(int64_t samples, int64_t batchSize, int procs);

// Reads score.json; throws DataError naming the file.
ScoreRecord readRecord(const std::string& path);

// How the weights MODEL names changed: a hash of the file `weights` (or of
// the checkpoint directory's manifest; of each part of a LoRA run's "BASE +
// ADAPTERS"), or of MODEL itself when `weights` is empty (a TorchScript
// export holds its weights); the path when there is no such file.
std::string modelFingerprint(const std::string& model, const std::string& weights);

// The number of complete lines at the start of part `path` for samples
// begin, begin + 1, ... (at most `count`), after cutting off anything after
// them (a torn line). 0 when the file does not exist. Throws IoError.
int64_t keptLines(const std::string& path, int64_t begin, int64_t count);

// Writes the parts, in order, into `out` atomically (a temporary file in its
// directory, fsync, rename). Checks that part r holds exactly its samples
// (DataError naming it otherwise); returns the number of lines holding an
// "error". Throws IoError naming `out`.
int64_t mergeParts(const ScorePaths& paths, const ScoreRecord& record);

// Writes all of `bytes` to `fd` (retrying short writes and EINTR). Throws
// IoError naming `path`.
void writeAll(int fd, const std::string& bytes, const std::string& path);

}  // namespace cohort::serve::detail
