#pragma once

// `cohort score MODEL --data DATA --out predictions.jsonl`: batch inference
// over a dataset, data-parallel over --procs processes, merged in input
// order, resumable. docs/deploy.md describes DATA and the output.

#include <cstdint>
#include <string>

#include "cohort/storage/storage.h"

namespace cohort::serve {

struct ScoreOptions {
  std::string model;         // MODEL (serve/model.h)
  std::string job;           // --job
  std::string data;          // DATA: see docs/deploy.md
  std::string out;           // predictions.jsonl
  int procs = 1;             // ranks
  // --split N: each rank's model split across N local processes of its own
  // (serve --procs: pipeline stages, or with `tensor` tensor parallel), for a
  // gpt or llama no process can hold whole; 1: each rank holds the model.
  int split = 1;
  bool tensor = false;
  int64_t batchSize = 64;
  int64_t topK = 5;          // classes per image
  int rank = -1;             // >= 0: this process is one rank of a score run (internal)
  // A rank whose part has not grown for this long (from its start, or its
  // last batch) is taken as hung: every rank is stopped, exit 1. 0: never.
  double stallSeconds = 900;
  // Blob URLs in DATA: credentials file, endpoint, CA file, plain http for
  // the emulator (the --credentials-file, --endpoint, --ca-file and
  // --allow-insecure of `cohort data`); given to every rank.
  storage::StorageOptions storage;
};

// Scores DATA into `out`: starts `procs` rank processes (this binary with
// --rank r), waits for them and merges their parts into `out` atomically.
// OUT.run/ beside it holds what is scored (score.json: a rerun must match
// it), the ranks' parts while scoring (what a rerun keeps), their logs, and
// summary.json (samples, seconds, throughput). An image that does not
// decode gets a line with its error. Returns 0 (also when `out` is complete
// already), or 1 / 2 when a rank failed (named, with its log); throws
// UsageError / DataError / ConfigError for bad input (no such model or
// data, data that does not fit the model, an unwritable `out`, a rerun with
// other inputs), before any rank starts. With `rank` >= 0 it is that rank
// and does not return (exit 0 done, 2 bad input, 1 other failures).
int scoreCommand(const ScoreOptions& options);

}  // namespace cohort::serve
