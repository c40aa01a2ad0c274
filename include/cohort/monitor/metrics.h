#pragma once

// metrics.jsonl: one JSON object per line, appended and flushed as it
// happens, so a crashed run keeps every record written before the crash.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace cohort::monitor {

struct TrainRecord {
  int64_t step = 0;       // optimizer steps done
  int64_t epoch = 0;      // 1-based
  double loss = 0;        // mean over the steps since the last record, all ranks
  double lr = 0;
  double imagesPerS = 0;  // samples (images, token windows) per second, all ranks together
  double tokensPerS = 0;  // language models: predicted tokens per second; 0 otherwise
  double dataWaitFrac = 0;  // share of the time ranks waited for batches
  int64_t corruptSkipped = 0;  // undecodable samples skipped since the last record, all ranks
  double modelFlopsPerS = 0;   // model FLOPs per second, all ranks (models/flops.h); 0: not counted
  double mfu = NAN;            // model FLOPs utilization per rank against the GEMM ceiling; NaN: not known
};

struct EvalRecord {
  int64_t step = 0;
  int64_t epoch = 0;
  double top1 = 0;        // fraction in [0, 1]
  double top5 = 0;
  double loss = 0;
  int64_t samples = 0;
  double seconds = 0;
  // Language models: predicted tokens (top1, top5 and loss are per token)
  // and exp(loss); 0 for image models.
  int64_t tokens = 0;
  double perplexity = 0;
  // The loss per byte of the evaluation text (nats; loss / bytes per
  // token), which compares across tokenizers, and in bits; 0: unknown.
  double lossPerByte = 0;
  double bitsPerByte = 0;
};

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // Appends to `path`; throws IoError naming it.
  explicit MetricsWriter(const std::string& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void write(const TrainRecord& r);
  void write(const EvalRecord& r);
  // Any other event: `json` must be one JSON object.
  void writeLine(const std::string& json);

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

// A resumed run repeats the steps after its checkpoint: drops the records of
// `path` whose step is past `step` (and evaluations at `step`, which come
// after a checkpoint), so each is recorded once. Lines that
// are not JSON records with a step are kept. Rewrites the file atomically.
void dropRecordsAfter(const std::string& path, int64_t step);

}  // namespace cohort::monitor
