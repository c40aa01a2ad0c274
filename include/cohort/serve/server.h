#pragma once

// `cohort serve MODEL`: predictions over HTTP, with dynamic batching.
// docs/deploy.md is the reference for the endpoints and their errors.

#include <cstdint>
#include <string>

namespace cohort::serve {

// What /v1/generate does with a prompt longer than the model's context
// (block_size): refuse it (400), or keep its last block_size - 1 tokens.
enum class TruncatePrompt { none, left };

struct ServeOptions {
  std::string model;             // MODEL (serve/model.h)
  std::string job;               // --job
  std::string host = "127.0.0.1";
  int port = 8080;               // 0: a free port (printed, and written to portFile)
  int64_t maxBatch = 16;         // requests run together, at most
  double maxDelayMs = 5;         // how long the first request of a batch waits for others
  bool waitAlone = false;        // --wait-alone: wait maxDelayMs even with no other request in flight
  int threads = 8;               // HTTP worker threads
  int64_t maxBodyBytes = 8 << 20;     // larger requests: 413
  int64_t maxConcurrency = 64;        // requests in flight at once; more: 429
  int64_t maxQueue = 256;             // inputs waiting for the model; more: 503
  int64_t topK = 5;                   // classes returned per image (a request may ask for fewer/more)
  int64_t maxNewTokens = 1024;        // /v1/generate: max_tokens at most this
  std::string tokenFile;         // --token-file: the bearer token; else $COHORT_SERVE_TOKEN
  std::string portFile;          // --port-file: the bound port is written there once listening
  int computeThreads = 0;        // intra-op threads for the model; 0: LibTorch's default
  double drainSeconds = 60;      // after SIGTERM, how long requests in flight may take; then 503
  std::string modelName;         // --model-name: the OpenAI API's model; "": MODEL's base name
  // --procs N: the model split across N local rank processes, N pipeline
  // stages (openSplitPredictor in serve/model.h); 1: this process holds it.
  int procs = 1;
  bool tensor = false;  // --tensor: the N ranks split every layer (tensor parallel), not into stages
  // Internal, what the front gives the ranks it starts: this process is
  // rank splitRank of a split model, its group's store on
  // 127.0.0.1:splitStorePort. -1: not a rank.
  int splitRank = -1;
  int splitStorePort = 0;
  // Continuous batching of generations (a model that decodes with a
  // key/value cache): tokens one iteration feeds the model beyond one per
  // running generation (prompts beyond it are fed over several iterations),
  // and positions per key/value cache block.
  int64_t maxStepTokens = 512;
  int64_t kvBlockTokens = 16;
  TruncatePrompt truncatePrompt = TruncatePrompt::none;
};

// Serves until SIGTERM or SIGINT, then stops taking requests, answers those
// in flight (those still waiting for the model after drainSeconds get 503)
// and returns 0; a split model whose rank ended stops it the same way and
// returns 1. With splitRank >= 0, runs that rank instead (its exit code). Throws UsageError for bad options (e.g. a
// non-loopback host without a token) and what loading MODEL throws.
int serveCommand(const ServeOptions& options);

}  // namespace cohort::serve
