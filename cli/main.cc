// The cohort command line: parses arguments and calls libcohort.
//
//   cohort run JOB.yaml [--set key.path=value ...] [--run-dir DIR] [--procs N]
//   cohort worker JOB.yaml [--set ...] [--run-dir DIR]
//   cohort validate JOB.yaml [--set ...]
//   cohort ckpt list|verify|inspect PATH | decrypt FILE OUT --key-file K
//   cohort ckpt consolidate PATH OUT.pt|OUT.safetensors [--optimizer OPT.pt] [--format pt|safetensors]
//   cohort data pack SRC DST | tokenize SRC DST [--tokenizer sentencepiece --vocab-size N] | inspect PATH | verify PATH
//   cohort generate RUN_DIR --prompt TEXT --tokens N [--top-p P] [--stop S] [--no-kv-cache]
//   cohort export MODEL --format onnx|torchscript|safetensors|huggingface [--out PATH] [--batch dynamic|N]
//   cohort serve MODEL [--port P] [--host H] [--max-batch B] [--max-delay-ms D] [--threads T]
//   cohort score MODEL --data DATA --out predictions.jsonl [--procs N]
//   cohort health [JOB] [--procs N] [--json] [--set ...]
//   cohort logs RUN_DIR [--rank r] [--follow]
//   cohort submit JOB.yaml --slurm|--k8s [--sweep key=v1,v2 ...] [--nodes N] [--time T] ...
//   cohort runs DIR | status RUN_DIR | cancel RUN_DIR
//   cohort help [COMMAND] | cohort --version
//
// Exit codes: 0 success; 2 bad input (job file, data, arguments); 1 a failure
// during training; 75 stopped on SIGTERM after a checkpoint (rerun resumes);
// 128+N when stopped by signal N. A rank (`cohort worker`) also exits 3 when
// training diverged, 4 when it gave up on a stalled collective and 5 when a
// preflight health check failed; `cohort run` reports them and exits 1.

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <sys/stat.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "cluster.h"
#include "plan.h"
#include "cohort/ckpt/tools.h"
#include "cohort/config/load.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"
#include "cohort/core/text.h"
#include "cohort/core/version.h"
#include "cohort/data/pack.h"
#include "cohort/data/tokens.h"
#include "cohort/elastic/agent.h"
#include "cohort/run/launcher.h"
#include "cohort/health/health.h"
#include "cohort/monitor/logs.h"
#include "cohort/security/sealed.h"
#include "cohort/serve/export.h"
#include "cohort/serve/score.h"
#include "cohort/serve/server.h"
#include "cohort/train/generate.h"
#include "cohort/train/worker.h"

namespace {

int fail(const std::string& message, int code) {
  cohort::log::setStatusLine("");
  cohort::log::error("{}", message);
  cohort::log::flush();
  return code;
}

// Where a command reads or writes blob URLs: how it reaches the storage.
void addStorageFlags(CLI::App* sub, cohort::storage::StorageOptions& so) {
  sub->add_option("--credentials-file", so.credentialsFile,
                  "Blob storage: file with account_key = ... or sas = ... (default: environment)");
  sub->add_option("--endpoint", so.endpoint, "Blob storage: where az://account/... goes (the emulator's address)");
  sub->add_option("--ca-file", so.caFile, "Blob storage: trusted certificate authorities (PEM)");
  sub->add_flag("--allow-insecure", so.allowInsecure,
                "Blob storage, emulator only: plain http, no certificate verification");
}

// Reports the exception being handled; returns the exit code it maps to.
int reportCurrentException() {
  try {
    throw;
  } catch (const cohort::Error& e) {
    return fail(e.what(), e.exitCode());
  } catch (const c10::Error& e) {
    return fail(e.what_without_backtrace(), 1);
  } catch (const std::exception& e) {
    return fail(e.what(), 1);
  } catch (...) {
    return fail("unknown error", 1);
  }
}

// A rank ends with _Exit once its log is flushed: static destructors of
// LibTorch and Gloo would race the rank's signal thread and background
// threads for nothing.
[[noreturn]] void runWorkerAndExit(const cohort::train::WorkerOptions& options) {
  int code = 0;
  try {
    code = cohort::train::runWorker(options);
  } catch (...) {
    code = reportCurrentException();
  }
  cohort::log::flush();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

// Every option of every command, and the commands, as CLI11 fills them in.
struct Cli {
  Cli() = default;
  Cli(const Cli&) = delete;  // `so` refers to this object's packOptions
  Cli& operator=(const Cli&) = delete;

  // run, worker, validate
  CLI::App *run = nullptr, *worker = nullptr, *validate = nullptr;
  std::string jobPath, runDir;
  std::vector<std::string> overrides;
  int procs = 0;
  std::string resume;
  bool newRun = false;
  std::string planFile;
  bool timeline = false;
  int metricsPort = 0;
  // ckpt
  CLI::App *ckpt = nullptr, *ckptList = nullptr, *ckptVerify = nullptr, *ckptInspect = nullptr,
           *ckptDecrypt = nullptr, *ckptConsolidate = nullptr;
  std::string ckptPath;
  bool ckptTensors = false;
  std::string decryptOut;
  std::string consolidateOut, consolidateOptimizer, consolidateFormat;
  cohort::security::KeySources keySources;
  // data
  CLI::App *data = nullptr, *dataPack = nullptr, *dataInspect = nullptr, *dataVerify = nullptr,
           *dataTokenize = nullptr;
  cohort::data::TokenizeOptions tokenizeOptions;
  // agent
  CLI::App* agent = nullptr;
  cohort::elastic::AgentOptions agentOptions;
  std::string nnodes;
  std::string agentOnSigterm = "leave";
  // generate
  CLI::App* generate = nullptr;
  cohort::train::GenerateOptions generateOptions;
  bool generateNoCache = false, generateTiming = false;
  std::string dataSrc, dataDst, dataPath;
  cohort::data::PackOptions packOptions;
  cohort::storage::StorageOptions& so = packOptions.storage;
  double shardMb = 256;
  bool noProgress = false, decode = false;
  int64_t inspectRecords = 0;
  // export, serve, score
  CLI::App *exportCmd = nullptr, *serveCmd = nullptr, *scoreCmd = nullptr;
  cohort::serve::ExportOptions exportOptions;
  std::string exportBatch = "dynamic";
  cohort::serve::ServeOptions serveOptions;
  cohort::serve::ScoreOptions scoreOptions;
  // health, logs, help
  CLI::App *health = nullptr, *logs = nullptr, *help = nullptr;
  cohort::health::HealthCommandOptions healthOptions;
  cohort::monitor::LogsOptions logsOptions;
  std::string helpTopic;
  // submit, runs, status, cancel
  cohort::cli::ClusterCommands cluster;
  cohort::cli::PlanCommand planCommand;

  void addTraining(CLI::App& app);
  void addCkpt(CLI::App& app);
  void addData(CLI::App& app);
  void addHealthLogsHelp(CLI::App& app);
  void addDeploy(CLI::App& app);  // export, serve, score
  // After parsing: runs the chosen command and returns the exit code.
  int dispatch(CLI::App& app, int argc);
  int showHelp(CLI::App& app, int argc) const;
  // --key-file and --previous-key-file for a data command.
  void addKeyFile(CLI::App* sub, const char* what);
};

void Cli::addKeyFile(CLI::App* sub, const char* what) {
  sub->add_option("--key-file", keySources.keyFile, what);
  sub->add_option("--previous-key-file", keySources.previousKeyFile,
                  "Encrypted shards: the key before a rotation");
}

void Cli::addTraining(CLI::App& app) {

  run = app.add_subcommand("run", "Train: start the ranks on this machine and watch them");
  run->add_option("job", jobPath, "Job file (YAML)")->required();
  run->add_option("--set", overrides, "Override a job key: key.path=value (repeatable)")
      ->take_all()
      ->allow_extra_args(false);
  run->add_option("--run-dir", runDir, "Run directory (default: <output.dir>/<name>-<UTC time>)");
  run->add_option("--procs", procs, "Ranks to start (default: distribution.procs_per_node)")
      ->check(CLI::Range(1, 4096));
  run->add_option("--resume", resume,
                  "Resume from this checkpoint (a step-<N> directory, a checkpoints directory or "
                  "a run directory) when the run directory has none of its own");
  run->add_option("--plan", planFile,
                  "`cohort plan --json` output: kept as <run>/plan.json, its prediction set beside the "
                  "measured figures in summary.json");
  run->add_flag("--timeline", timeline,
                "Each rank writes a Chrome trace to <run>/timeline/rank-<r>.json (output.timeline)");
  run->add_option("--metrics-port", metricsPort,
                  "Serve Prometheus metrics at http://127.0.0.1:PORT/metrics (output.metrics_port)")
      ->check(CLI::Range(1, 65535));
  run->add_flag("--new-run", newRun,
                "Start a new run directory even if an interrupted run of the same job could be "
                "resumed");

  agent = app.add_subcommand(
      "agent", "Elastic training: run this node's ranks in a job of MIN..MAX nodes that may "
               "lose and gain nodes (docs/elastic.md)");
  agent->add_option("job", jobPath, "Job file (YAML)")->required();
  agent->add_option("--set", overrides, "Override a job key: key.path=value (repeatable)")
      ->take_all()
      ->allow_extra_args(false);
  agent->add_option("--nnodes", nnodes, "MIN:MAX nodes (or N: exactly N)")->required();
  agent->add_option("--rdzv", agentOptions.rdzv,
                    "Rendezvous: etcd://HOST:PORT[,HOST:PORT...]/JOB_ID, etcds://... (etcd over TLS: "
                    "elastic.etcd_* in the job) or store://HOST:PORT/JOB_ID (the agent on HOST hosts "
                    "the store)")
      ->required();
  agent->add_option("--node-id", agentOptions.nodeId, "This node's unique name (default: <host>-<pid>)");
  agent->add_option("--address", agentOptions.address,
                    "This node's address the others reach (default: the one that routes to the "
                    "rendezvous host)");
  agent->add_option("--run-dir", runDir,
                    "Run directory, the same on every node (default: <output.dir>/<name>-<JOB_ID>)");
  agent->add_option("--procs", procs, "Ranks on this node (default: distribution.procs_per_node)")
      ->check(CLI::Range(1, 4096));
  agent->add_option("--on-sigterm", agentOnSigterm,
                    "leave: the node leaves and the others go on (a node's preemption); stop: the "
                    "whole job checkpoints and stops, as on SIGUSR2 (every node signalled at once: "
                    "Slurm)")
      ->check(CLI::IsMember({"leave", "stop"}));

  worker = app.add_subcommand(
      "worker", "Run one rank (started by `cohort run`, mpirun, srun or a torchrun-style launcher)");
  worker->add_option("job", jobPath, "Job file (YAML)")->required();
  worker->add_option("--set", overrides, "Override a job key: key.path=value (repeatable)")
      ->allow_extra_args(false);
  worker->add_option("--run-dir", runDir, "Run directory (default: rank 0 creates one)");
  worker->add_option("--resume", resume,
                     "Resume from this checkpoint when the run directory has none of its own");

  validate = app.add_subcommand("validate", "Check a job file and print the resolved job");
  validate->add_option("job", jobPath, "Job file (YAML)")->required();
  validate->add_option("--set", overrides, "Override a job key: key.path=value (repeatable)")
      ->allow_extra_args(false);

}

void Cli::addCkpt(CLI::App& app) {
  ckpt = app.add_subcommand("ckpt", "List, verify or inspect checkpoints");
  ckpt->require_subcommand(1);
  ckptList = ckpt->add_subcommand(
      "list", "List checkpoints with step, position, size and status");
  ckptList->add_option("path", ckptPath, "Run directory, checkpoints directory or step-<N>")
      ->required();
  ckptVerify = ckpt->add_subcommand(
      "verify", "Verify every file's checksum; exit 1 naming each corrupt file");
  ckptVerify->add_option("path", ckptPath, "Run directory, checkpoints directory or step-<N>")
      ->required();
  ckptInspect = ckpt->add_subcommand("inspect", "Show what a checkpoint holds");
  ckptInspect->add_option("path", ckptPath,
                          "step-<N> directory (or a directory: its newest valid checkpoint)")
      ->required();
  ckptInspect->add_flag("--tensors", ckptTensors, "List every tensor's name, type and shape");
  ckptDecrypt = ckpt->add_subcommand(
      "decrypt", "Write the plain contents of an encrypted file (a checkpoint's .bin, model/final.pt)");
  ckptDecrypt->add_option("path", ckptPath, "The encrypted file, where it was written")->required();
  ckptDecrypt->add_option("out", decryptOut, "Where the plain copy goes (mode 0600)")->required();
  ckptConsolidate = ckpt->add_subcommand(
      "consolidate",
      "Write a checkpoint's model as one PyTorch state dict, whatever its ZeRO stage and world "
      "size (and its optimizer state in torch.optim's state_dict() layout)");
  ckptConsolidate->add_option("path", ckptPath,
                              "step-<N> directory (or a directory: its newest valid checkpoint)")
      ->required();
  ckptConsolidate->add_option("out", consolidateOut, "The model's state dict (.pt or .safetensors)")->required();
  ckptConsolidate->add_option("--format", consolidateFormat,
                              "pt or safetensors (default: safetensors for an OUT ending in .safetensors, else pt)")
      ->check(CLI::IsMember({"pt", "safetensors"}));
  ckptConsolidate->add_option("--optimizer", consolidateOptimizer,
                              "Also write the optimizer state here (.pt), as torch.optim's "
                              "state_dict(): parameters numbered in the model's order");
  for (CLI::App* sub : {ckptVerify, ckptInspect, ckptDecrypt, ckptConsolidate}) {
    sub->add_option("--key-file", keySources.keyFile,
                    "Encrypted checkpoints: the key file (64 hex digits, mode 0600)");
    sub->add_option("--previous-key-file", keySources.previousKeyFile,
                    "Encrypted checkpoints: the key before a rotation");
  }
  ckptDecrypt->get_option("--key-file")->required();

}

void Cli::addData(CLI::App& app) {
  data = app.add_subcommand("data", "Pack, tokenize, inspect or verify datasets of shards");
  data->require_subcommand(1);
  dataPack = data->add_subcommand(
      "pack", "Pack an ImageNet-style folder or IDX file into shards (local or blob storage)");
  dataPack->add_option("src", dataSrc,
                       "A folder with one subfolder of JPEG/PNG images per class, or an IDX images file")
      ->required();
  dataPack->add_option("dst", dataDst, "Output: a directory or blob URL (az://account/container/prefix)")
      ->required();
  dataPack->add_option("--shard-mb", shardMb, "Target shard size in MB")->capture_default_str()
      ->check(CLI::Range(0.001, 1e6));
  dataPack->add_option("--threads", packOptions.threads, "Packing threads; 0: one per core")
      ->capture_default_str();
  dataPack->add_option("--seed", packOptions.seed, "Seed of the record order across shards")
      ->capture_default_str();
  dataPack->add_option("--labels", packOptions.labels,
                       "IDX: the labels file (default: the images file's name with labels-idx1)");
  dataPack->add_option("--name", packOptions.name, "Dataset name (default: SRC's name)");
  dataPack->add_flag("--no-progress", noProgress, "No progress line");
  dataTokenize = data->add_subcommand(
      "tokenize", "Turn text into token datasets DST/train and DST/val (bytes, or a SentencePiece model)");
  dataTokenize->add_option("src", dataSrc,
                           "A text file, a folder of them (read in sorted order), or - for stdin")
      ->required();
  dataTokenize->add_option("dst", dataDst, "Output: a directory or blob URL; train/ and val/ go under it")
      ->required();
  dataTokenize->add_option("--val-fraction", tokenizeOptions.valFraction,
                           "Hold out this last fraction of the text as val/; 0: none")
      ->capture_default_str();
  dataTokenize->add_option("--shard-tokens", tokenizeOptions.shardTokens, "Tokens per shard file")
      ->capture_default_str();
  dataTokenize->add_option("--tokenizer", tokenizeOptions.tokenizer,
                           "bytes (each byte a token) or sentencepiece (a model trained on the training text, "
                           "or --tokenizer-model)")
      ->capture_default_str()->check(CLI::IsMember({"bytes", "sentencepiece"}));
  dataTokenize->add_option("--vocab-size", tokenizeOptions.vocabSize, "sentencepiece: the vocabulary to train")
      ->capture_default_str();
  dataTokenize->add_option("--model-type", tokenizeOptions.modelType, "sentencepiece: bpe or unigram")
      ->capture_default_str()->check(CLI::IsMember({"bpe", "unigram"}));
  dataTokenize->add_option("--tokenizer-model", tokenizeOptions.tokenizerModel,
                           "sentencepiece: an existing model file (.model) instead of training one");
  dataTokenize->add_flag("--no-progress", noProgress, "No progress line");
  dataInspect = data->add_subcommand("inspect", "Show what a packed dataset holds");
  dataInspect->add_option("path", dataPath, "Dataset directory or blob URL")->required();
  dataInspect->add_option("--records", inspectRecords, "Also list the first N records of the first shard");
  dataVerify = data->add_subcommand(
      "verify", "Check every shard, record and (with --decode) image; exit 1 naming each problem");
  dataVerify->add_option("path", dataPath, "Dataset directory or blob URL")->required();
  dataVerify->add_flag("--decode", decode, "Also decode every image");
  addKeyFile(dataPack, "Encrypt every shard with the key in this file (64 hex digits, mode 0600)");
  addKeyFile(dataInspect, "Encrypted shards: the key file");
  addKeyFile(dataVerify, "Encrypted shards: the key file (every chunk is authenticated)");
  for (CLI::App* sub : {dataPack, dataTokenize, dataInspect, dataVerify}) addStorageFlags(sub, so);

}

void Cli::addHealthLogsHelp(CLI::App& app) {
  health = app.add_subcommand(
      "health", "Measure matmul, memory, disk and allreduce speed on N local ranks against the "
                "health.* thresholds; exit 1 naming each failing rank and check");
  health->add_option("job", healthOptions.jobPath, "Job file (YAML); default: every key at its default");
  health->add_option("--set", healthOptions.overrides,
                     "Override a job key: key.path=value, e.g. health.min_matmul_gflops=5 (repeatable)")
      ->allow_extra_args(false);
  health->add_option("--procs", healthOptions.procs, "Ranks to start (default: distribution.procs_per_node)")
      ->check(CLI::Range(1, 4096));
  health->add_flag("--json", healthOptions.json, "Print a JSON array of per-rank reports");
  // Hidden: set in the rank processes `cohort health` starts.
  health->add_option("--rank", healthOptions.rank)->group("");
  health->add_option("--store-port", healthOptions.storePort)->group("");

  logs = app.add_subcommand(
      "logs", "Print a run's logs (launcher and ranks) merged in time order");
  logs->add_option("run_dir", logsOptions.runDir, "Run directory")->required();
  logs->add_option("--rank", logsOptions.rank, "Only this rank's log")->check(CLI::NonNegativeNumber);
  logs->add_flag("--follow,-f", logsOptions.follow,
                 "Keep printing lines as they are written until the run ends (summary.json) or "
                 "Ctrl-C");

  generate = app.add_subcommand("generate", "Sample text from a trained language model (model.arch: gpt)");
  generate->add_option("run_dir", generateOptions.runDir, "Run directory")->required();
  generate->add_option("--prompt", generateOptions.prompt, "Text to continue (default: a newline)");
  generate->add_option("--tokens", generateOptions.tokens, "Tokens to generate")->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  generate->add_option("--temperature", generateOptions.sampling.temperature,
                       "Divide the logits by this; 0 (below 1e-4) always takes the most likely token")
      ->capture_default_str()->check(CLI::Range(0.0, 100.0));
  generate->add_option("--top-k", generateOptions.sampling.topK, "Sample among the k most likely tokens; 0: all")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  generate->add_option("--top-p", generateOptions.sampling.topP,
                       "Sample among the most likely tokens whose probabilities reach p together; 1: all")
      ->capture_default_str();
  generate->add_option("--seed", generateOptions.sampling.seed, "Sampling seed")->capture_default_str();
  generate->add_option("--stop", generateOptions.stops, "End the text before this string (repeatable)");
  generate->add_flag("--no-kv-cache", generateNoCache,
                     "Run the whole window again for every token instead of keeping its keys and values");
  generate->add_flag("--timing", generateTiming, "Print tokens/s and the first token's latency on stderr");

  help = app.add_subcommand("help", "Show help for cohort or one of its commands");
  help->add_option("command", helpTopic, "Command to explain, or `job` for every job-file key");

}

void Cli::addDeploy(CLI::App& app) {
  const char* modelHelp =
      "A run directory, a weights file or checkpoint in one, or (serve, score) a TorchScript export";
  exportCmd = app.add_subcommand("export", "Write a trained model as ONNX, TorchScript, safetensors or Hugging Face's "
                                           "GPT-2 layout for other runtimes");
  exportCmd->add_option("model", exportOptions.model, modelHelp)->required();
  exportCmd->add_option("--format", exportOptions.format, "onnx, torchscript, safetensors or huggingface (gpt)")
      ->required()->check(CLI::IsMember({"onnx", "torchscript", "safetensors", "huggingface"}));
  exportCmd->add_option("--out", exportOptions.out, "Output file (default: beside the weights, in model/)");
  exportCmd->add_option("--batch", exportBatch, "`dynamic` (any batch size) or a fixed batch size")
      ->capture_default_str();
  exportCmd->add_option("--opset", exportOptions.opset, "ONNX opset")->capture_default_str()
      ->check(CLI::Range(int64_t{17}, int64_t{17}));
  exportCmd->add_option("--job", exportOptions.job, "Job file of a weights file outside a run directory");


  auto& so2 = serveOptions;
  serveCmd = app.add_subcommand("serve", "Answer predictions over HTTP, batching requests that arrive together");
  serveCmd->add_option("model", so2.model, modelHelp)->required();
  serveCmd->add_option("--host", so2.host, "Address to listen on (beyond loopback a bearer token is required)")
      ->capture_default_str();
  serveCmd->add_option("--port", so2.port, "Port; 0: a free one")->capture_default_str()
      ->check(CLI::Range(0, 65535));
  serveCmd->add_option("--port-file", so2.portFile, "Write the port listened on to this file");
  serveCmd->add_option("--max-batch", so2.maxBatch, "Inputs run together, at most; 1: no batching")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{4096}));
  serveCmd->add_option("--max-delay-ms", so2.maxDelayMs, "How long a batch waits for more requests")
      ->capture_default_str()->check(CLI::Range(0.0, 600000.0));
  serveCmd->add_option("--threads", so2.threads, "HTTP worker threads")->capture_default_str()
      ->check(CLI::Range(1, 1024));
  serveCmd->add_option("--compute-threads", so2.computeThreads, "Intra-op threads of the model; 0: all cores")
      ->capture_default_str()->check(CLI::Range(0, 1024));
  serveCmd->add_option("--max-body-bytes", so2.maxBodyBytes, "Largest request body in bytes (413 beyond)")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 32));
  serveCmd->add_option("--max-concurrency", so2.maxConcurrency, "Requests in flight at once (429 beyond)")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  serveCmd->add_option("--max-queue", so2.maxQueue, "Inputs waiting for the model (503 beyond)")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  serveCmd->add_option("--top-k", so2.topK, "Classes returned per image by default")->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  serveCmd->add_option("--max-new-tokens", so2.maxNewTokens, "Largest max_tokens of /v1/generate")
      ->capture_default_str()->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  serveCmd->add_option("--token-file", so2.tokenFile,
                       "File holding the bearer token clients must send (else $COHORT_SERVE_TOKEN)")
      ->check([](const std::string& path) {
        return path.empty() ? std::string("an empty path would leave the server without a token") : std::string();
      });
  serveCmd->add_option("--drain-seconds", so2.drainSeconds,
                       "After SIGTERM, how long requests in flight may take before they get 503")
      ->capture_default_str()->check(CLI::Range(0.0, 86400.0));
  serveCmd->add_option("--job", so2.job, "Job file of a weights file outside a run directory");

  scoreCmd = app.add_subcommand("score", "Predict over a whole dataset, data-parallel, resumable");
  scoreCmd->add_option("model", scoreOptions.model, modelHelp)->required();
  scoreCmd->add_option("--data", scoreOptions.data,
                       "Dataset: image folder, shards or token directory, blob URL, IDX file, or a YAML "
                       "dataset section")->required();
  scoreCmd->add_option("--out", scoreOptions.out, "Predictions, one JSON line per sample, in input order")
      ->required();
  scoreCmd->add_option("--procs", scoreOptions.procs, "Processes scoring in parallel")->capture_default_str()
      ->check(CLI::Range(1, 1024));
  scoreCmd->add_option("--batch-size", scoreOptions.batchSize, "Samples per forward")->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  scoreCmd->add_option("--top-k", scoreOptions.topK, "Classes per image")->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  scoreCmd->add_option("--job", scoreOptions.job, "Job file of a weights file outside a run directory");
  scoreCmd->add_option("--rank", scoreOptions.rank, "(internal) score one part")->group("");
  scoreCmd->add_option("--stall-seconds", scoreOptions.stallSeconds,
                       "A rank whose part has not grown for this long is hung: stop every rank (0: never)")
      ->capture_default_str()->check(CLI::Range(0.0, 1e9));
  addStorageFlags(scoreCmd, scoreOptions.storage);
}

int Cli::showHelp(CLI::App& app, int argc) const {
    if (helpTopic == "job") {
      // Every key of the job file, as the table in docs/job-spec.md.
      std::cout << "| key | type | default | description |\n|---|---|---|---|\n";
      for (const auto& k : cohort::describeJobKeys()) {
        std::cout << "| `" << k.path << "` | " << k.type << " | `" << k.defaultValue << "` | "
                  << k.description << " |\n";
      }
      return 0;
    }
    if (!helpTopic.empty()) {
      for (CLI::App* sub : {run, worker, validate, ckpt, data, generate, exportCmd, serveCmd, scoreCmd,
                            logs, health, cluster.submit, cluster.runs, cluster.status, cluster.cancel,
                            planCommand.plan}) {
        if (sub->get_name() == helpTopic) {
          std::cout << sub->help();
          return 0;
        }
      }
      std::cerr << "cohort: no help on '" << helpTopic
                << "' (try: run, worker, validate, ckpt, data, generate, export, serve, score, logs, "
                   "health, submit, runs, status, cancel, plan, job)\n";
      return 2;
    }
    std::cout << app.get_formatter()->make_help(&app, "cohort", CLI::AppFormatMode::Normal);
    return app.get_subcommands().empty() && argc > 1 ? 2 : 0;
}

int Cli::dispatch(CLI::App& app, int argc) {
  if (*help || app.get_subcommands().empty()) return showHelp(app, argc);
  if (*validate) {
    cohort::JobConfig job = cohort::loadJob(jobPath, overrides);
    cohort::checkRanks(job, cohort::requestedWorldSize(job));
    std::cout << cohort::toYaml(job);
    return 0;
  }
  cohort::security::installKeyring(cohort::security::loadKeyring(keySources));
  if (*ckptDecrypt) {
    const std::string plain = cohort::security::readSealedFile(ckptPath, cohort::security::installedKeyring());
    cohort::writeFileAtomic(decryptOut, plain);
    std::cout << "wrote " << plain.size() << " bytes to " << decryptOut << "\n";
    return 0;
  }
  if (*ckptList) return cohort::ckpt::listCommand(ckptPath, std::cout);
  if (*ckptVerify) return cohort::ckpt::verifyCommand(ckptPath, std::cout);
  if (*ckptInspect) return cohort::ckpt::inspectCommand(ckptPath, ckptTensors, std::cout);
  if (*ckptConsolidate) {
    const bool safetensors =
        consolidateFormat == "safetensors" ||
        (consolidateFormat.empty() && consolidateOut.size() > 12 &&
         consolidateOut.compare(consolidateOut.size() - 12, 12, ".safetensors") == 0);
    return cohort::ckpt::consolidateCommand(ckptPath, consolidateOut, consolidateOptimizer, std::cout,
                                            safetensors ? cohort::WeightsFormat::safetensors
                                                        : cohort::WeightsFormat::pt);
  }
  if (*dataPack) {
    packOptions.shardBytes = static_cast<int64_t>(shardMb * 1e6);
    packOptions.progress = !noProgress;
    if (const auto* keys = cohort::security::installedKeyring()) packOptions.key = &keys->current;
    const auto r = cohort::data::pack(dataSrc, dataDst, packOptions);
    std::cout << "packed " << r.manifest.records() << " records of " << r.manifest.classes.size()
              << " classes into " << r.manifest.shards.size() << " shards ("
              << r.manifest.bytes() / 1000000 << " MB) at " << cohort::storage::redactUrl(dataDst);
    if (r.skipped > 0) std::cout << "; " << r.skipped << " unreadable files left out (see warnings)";
    std::cout << "\n";
    return 0;
  }
  if (*dataTokenize) {
    tokenizeOptions.progress = !noProgress;
    tokenizeOptions.storage = so;
    const auto r = cohort::data::tokenize(dataSrc, dataDst, tokenizeOptions, std::cin);
    std::cout << "tokenized " << r.files << " file(s): " << r.train.records() << " training and "
              << r.val.records() << " validation tokens (tokenizer " << r.train.tokenizer
              << ", vocabulary " << r.train.vocabSize << ") at "
              << cohort::storage::redactUrl(dataDst) << "/{train,val}\n"
              << fmt::format("{:.1f} MB of text in {:.2f} s: {:.0f} tokens/s, {:.2f} bytes per token\n",
                             (r.train.textBytes + r.val.textBytes) / 1e6, r.seconds,
                             (r.train.records() + r.val.records()) / std::max(r.seconds, 1e-9),
                             double(r.train.textBytes + r.val.textBytes) /
                                 std::max<int64_t>(1, r.train.records() + r.val.records()));
    return 0;
  }
  if (*generate) {
    generateOptions.kvCache = !generateNoCache;
    if (generateTiming) generateOptions.timing = &std::cerr;
    return cohort::train::generateCommand(generateOptions, std::cout);
  }
  if (*exportCmd) {
    if (exportBatch != "dynamic") {
      try {
        size_t used = 0;
        exportOptions.batch = std::stoll(exportBatch, &used);
        if (used != exportBatch.size()) exportOptions.batch = 0;
      } catch (const std::exception&) {
        exportOptions.batch = 0;
      }
      if (exportOptions.batch < 1) {
        throw cohort::UsageError(fmt::format("--batch {}: expected `dynamic` or a size >= 1", exportBatch));
      }
    }
    return cohort::serve::exportCommand(exportOptions, std::cout);
  }
  if (*serveCmd) return cohort::serve::serveCommand(serveOptions);
  if (*scoreCmd) return cohort::serve::scoreCommand(scoreOptions);
  if (*dataInspect) return cohort::data::inspectCommand(dataPath, inspectRecords, so, std::cout);
  if (*dataVerify) return cohort::data::verifyCommand(dataPath, decode, so, std::cout);
  if (*logs) return cohort::cli::ClusterCommands::logs(logsOptions);
  if (auto code = cluster.dispatch()) return *code;
  if (auto code = planCommand.dispatch()) return *code;
  if (*run) {
    cohort::run::LaunchOptions o;
    o.jobPath = jobPath;
    o.overrides = overrides;
    if (timeline) o.overrides.push_back("output.timeline=true");
    if (metricsPort > 0) o.overrides.push_back(fmt::format("output.metrics_port={}", metricsPort));
    o.runDir = runDir;
    o.procs = procs;
    o.resume = resume;
    o.newRun = newRun;
    o.plan = planFile;
    return cohort::run::runLauncher(o);
  }
  if (*agent) {
    cohort::elastic::AgentOptions& o = agentOptions;
    o.jobPath = jobPath;
    o.overrides = overrides;
    o.runDir = runDir;
    o.procs = procs;
    const auto range = cohort::parseCountRange(nnodes);
    if (!range) throw cohort::UsageError(fmt::format("--nnodes {}: expected MIN:MAX or N", nnodes));
    o.minNodes = static_cast<int>(range->first);
    o.maxNodes = static_cast<int>(range->second);
    o.termStopsJob = agentOnSigterm == "stop";
    return cohort::elastic::runAgent(o);
  }
  if (*worker) {
    runWorkerAndExit({jobPath, overrides, runDir, resume});
  }
  if (*health) {
    if (healthOptions.rank >= 0) cohort::health::runHealthRankAndExit(healthOptions, std::cout);
    return cohort::health::healthCommand(healthOptions);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cohort: data-parallel deep-learning training", "cohort"};
  app.require_subcommand(0, 1);
  app.set_version_flag("--version",
                       std::string("cohort ") + cohort::version() + " (LibTorch " +
                           cohort::torchVersion() + ")");
  app.footer(
      "Exit codes: 0 success, 2 bad input (job file, data, arguments), 1 failure during "
      "training, 75 stopped on SIGTERM after a checkpoint (rerun to resume); a rank (`cohort "
      "worker`) also exits 3 when training diverged, 4 on a stalled collective, 5 on a failed "
      "preflight check.\nDocumentation: docs/job-spec.md, docs/launching.md, docs/monitoring.md");

  Cli cli;
  cli.addTraining(app);
  cli.addCkpt(app);
  cli.addData(app);
  cli.addHealthLogsHelp(app);
  cli.addDeploy(app);
  cli.cluster.add(app);
  cli.planCommand.add(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }

  // Run directories, checkpoints, logs and caches hold the job's data and
  // model: readable by this user only (0700 directories, 0600 files). A
  // dataset written by `cohort data pack` or `tokenize` keeps the user's
  // umask, as datasets are made to be shared.
  if (!*cli.dataPack && !*cli.dataTokenize) ::umask(077);

  try {
    return cli.dispatch(app, argc);
  } catch (...) {
    return reportCurrentException();
  }
}
