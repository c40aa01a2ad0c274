#include "engine.h"

#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <map>

#include "cohort/ckpt/tools.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/text.h"
#include "cohort/serve/model.h"
#include "cohort/train/worker.h"
#include "commands.h"
#include "common.h"

namespace cohort::cli {

namespace {

// A rank ends with _Exit once its log is flushed: static destructors of
// LibTorch and Gloo would race the rank's signal thread and background
// threads for nothing.
[[noreturn]] void runWorkerAndExit(const train::WorkerOptions& options) {
  int code = 0;
  try {
    code = train::runWorker(options);
  } catch (...) {
    code = reportEngineException();
    // A rank that failed before its training (or after): the same wait.
    launch::waitForDebuggerOnFailure("the error above");
  }
  log::flush();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

}  // namespace

int reportEngineException() {
  try {
    throw;
  } catch (const c10::Error& e) {
    return fail(e.what_without_backtrace(), 1);
  } catch (...) {
    return reportCurrentException();
  }
}

void TorchCommands::add(CLI::App& app, BaseCommands& base) {
  agent = app.add_subcommand("agent", engineCommandDescription("agent"));
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
  addDebugFlags(agent, agentOptions.debug);

  worker = app.add_subcommand("worker", engineCommandDescription("worker"));
  worker->add_option("job", jobPath, "Job file (YAML)")->required();
  worker->add_option("--set", overrides, "Override a job key: key.path=value (repeatable)")
      ->allow_extra_args(false);
  worker->add_option("--run-dir", runDir, "Run directory (default: rank 0 creates one)");
  worker->add_option("--resume", resume,
                     "Resume from this checkpoint when the run directory has none of its own");

  health = app.add_subcommand("health", engineCommandDescription("health"));
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

  generate = app.add_subcommand("generate", engineCommandDescription("generate"));
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
  generate->add_option("--procs", generateProcs,
                       "Split the model across N local processes, N pipeline stages (as cohort serve --procs)")
      ->capture_default_str();
  generate->add_flag("--tensor", generateTensor, "With --procs N: split every layer over them (tensor parallel)");

  CLI::App* ckpt = base.ckpt;
  ckptInspect = ckpt->add_subcommand("inspect", engineCommandDescription("inspect", true));
  ckptInspect->add_option("path", ckptPath,
                          "step-<N> directory (or a directory: its newest valid checkpoint)")
      ->required();
  ckptInspect->add_flag("--tensors", ckptTensors, "List every tensor's name, type and shape");
  ckptConsolidate = ckpt->add_subcommand("consolidate", engineCommandDescription("consolidate", true));
  ckptConsolidate->add_option("path", ckptPath,
                              "step-<N> directory (or a directory: its newest valid checkpoint)")
      ->required();
  ckptConsolidate->add_option("out", consolidateOut, "The model's state dict (.pt or .safetensors)");
  ckptConsolidate->add_option("--out", consolidateOutOption, "The same as OUT, as an option");
  ckptConsolidate->add_option("--format", consolidateFormat,
                              "pt or safetensors (default: safetensors for an OUT ending in .safetensors, else pt)")
      ->check(CLI::IsMember({"pt", "safetensors"}));
  ckptConsolidate->add_option("--optimizer", consolidateOptimizer,
                              "Also write the optimizer state here (.pt), as torch.optim's "
                              "state_dict(): parameters numbered in the model's order");
  for (CLI::App* sub : {ckptInspect, ckptConsolidate}) base.addCkptKeyFile(sub);

  const char* modelHelp =
      "A run directory, a weights file or checkpoint in one, or (serve, score) a TorchScript export";
  exportCmd = app.add_subcommand("export", engineCommandDescription("export"));
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
  serveCmd = app.add_subcommand("serve", engineCommandDescription("serve"));
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
  serveCmd->add_flag("--wait-alone", so2.waitAlone,
                     "Wait --max-delay-ms even when no other request is in flight to join the batch");
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
  serveCmd->add_option("--max-new-tokens", so2.maxNewTokens, "Largest max_tokens of /v1/generate and the OpenAI API")
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
  serveCmd->add_option("--model-name", so2.modelName,
                       "The model's name in the OpenAI API (/v1/models); default: MODEL's base name");
  serveCmd->add_option("--procs", so2.procs,
                       "Split a language model across N local processes, N pipeline stages (docs/deploy.md)")
      ->capture_default_str();
  serveCmd->add_flag("--tensor", so2.tensor,
                     "With --procs N: split every layer over the N processes (tensor parallel), not into stages");
  serveCmd->add_option("--split-rank", so2.splitRank, "(internal) run one rank of a split model")->group("");
  serveCmd->add_option("--split-store", so2.splitStorePort, "(internal) the split model's store port")->group("");
  serveCmd->add_option("--max-step-tokens", so2.maxStepTokens,
                       "Generation: tokens one step feeds the model beyond one per running generation "
                       "(longer prompts are fed over several steps)")
      ->capture_default_str()->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  serveCmd->add_option("--kv-block-tokens", so2.kvBlockTokens, "Generation: positions per key/value cache block")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{65536}));
  static const std::map<std::string, serve::TruncatePrompt> kTruncations{{"none", serve::TruncatePrompt::none},
                                                                        {"left", serve::TruncatePrompt::left}};
  serveCmd->add_option("--truncate-prompt", so2.truncatePrompt,
                       "A prompt longer than block_size: none (400) or left (keep its last block_size - 1 tokens)")
      ->transform(CLI::CheckedTransformer(kTruncations));

  scoreCmd = app.add_subcommand("score", engineCommandDescription("score"));
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
  scoreCmd->add_option("--split", scoreOptions.split,
                       "Split a gpt or llama across N local processes per rank, N pipeline stages (docs/deploy.md)")
      ->capture_default_str();
  scoreCmd->add_flag("--tensor", scoreOptions.tensor,
                     "With --split N: split every layer over the N processes (tensor parallel), not into stages");
  scoreCmd->add_option("--rank", scoreOptions.rank, "(internal) score one part")->group("");
  scoreCmd->add_option("--stall-seconds", scoreOptions.stallSeconds,
                       "A rank whose part has not grown for this long is hung: stop every rank (0: never)")
      ->capture_default_str()->check(CLI::Range(0.0, 1e9));
  addStorageFlags(scoreCmd, scoreOptions.storage);
}

std::optional<int> TorchCommands::dispatch() {
  if (*ckptInspect) return ckpt::inspectCommand(ckptPath, ckptTensors, std::cout);
  if (*ckptConsolidate) {
    // OUT, or --out OUT: both forms are in use (docs, older messages).
    if (!consolidateOutOption.empty()) {
      if (!consolidateOut.empty() && consolidateOut != consolidateOutOption) {
        throw UsageError(fmt::format("cohort ckpt consolidate: two outputs, {} and --out {}; give one",
                                     consolidateOut, consolidateOutOption));
      }
      consolidateOut = consolidateOutOption;
    }
    if (consolidateOut.empty()) {
      throw UsageError("cohort ckpt consolidate: where to write the model: OUT (or --out OUT), a .pt or "
                       ".safetensors file");
    }
    const bool safetensors =
        consolidateFormat == "safetensors" ||
        (consolidateFormat.empty() && consolidateOut.size() > 12 &&
         consolidateOut.compare(consolidateOut.size() - 12, 12, ".safetensors") == 0);
    return ckpt::consolidateCommand(ckptPath, consolidateOut, consolidateOptimizer, std::cout,
                                            safetensors ? WeightsFormat::safetensors
                                                        : WeightsFormat::pt);
  }
  if (*generate) {
    generateOptions.kvCache = !generateNoCache;
    if (generateProcs < 1) throw UsageError(fmt::format("--procs {}: must be >= 1", generateProcs));
    if (generateTensor && generateProcs < 2) {
      throw UsageError(fmt::format("--tensor: needs --procs 2 or more, got {}", generateProcs));
    }
    if (generateProcs > 1) {
      serve::SplitOptions so;
      so.procs = generateProcs;
      so.tensor = generateTensor;
      generateOptions.model = serve::predictorModel(serve::openSplitPredictor(generateOptions.runDir, "", so));
      generateOptions.modelWeights = fmt::format("{} split across {} processes{}", generateOptions.runDir,
                                                 generateProcs, generateTensor ? " (tensor parallel)" : "");
    }
    if (generateTiming) generateOptions.timing = &std::cerr;
    return infer::generateCommand(generateOptions, std::cout);
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
        throw UsageError(fmt::format("--batch {}: expected `dynamic` or a size >= 1", exportBatch));
      }
    }
    return serve::exportCommand(exportOptions, std::cout);
  }
  if (*serveCmd) return serve::serveCommand(serveOptions);
  if (*scoreCmd) return serve::scoreCommand(scoreOptions);
  if (*agent) {
    elastic::AgentOptions& o = agentOptions;
    o.jobPath = jobPath;
    o.overrides = overrides;
    o.runDir = runDir;
    o.procs = procs;
    const auto range = parseCountRange(nnodes);
    if (!range) throw UsageError(fmt::format("--nnodes {}: expected MIN:MAX or N", nnodes));
    o.minNodes = static_cast<int>(range->first);
    o.maxNodes = static_cast<int>(range->second);
    o.termStopsJob = agentOnSigterm == "stop";
    return elastic::runAgent(o);
  }
  if (*worker) {
    runWorkerAndExit({jobPath, overrides, runDir, resume});
  }
  if (*health) {
    if (healthOptions.rank >= 0) health::runHealthRankAndExit(healthOptions, std::cout);
    return health::healthCommand(healthOptions);
  }
  return std::nullopt;
}

}  // namespace cohort::cli
