#include "base.h"

#include <sys/stat.h>

#include <fmt/format.h>

#include <algorithm>
#include <iostream>

#include "cohort/ckpt/tools.h"
#include "cohort/config/load.h"
#include "cohort/config/step_range.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/run/launcher.h"
#include "cohort/storage/storage.h"
#include "common.h"

namespace cohort::cli {

void BaseCommands::add(CLI::App& app) {
  addTraining(app);
  addCkpt(app);
  addData(app);
  addLogsHelp(app);
  cluster.add(app);
  planCommand.add(app);
}

void BaseCommands::addKeyFile(CLI::App* sub, const char* what) {
  sub->add_option("--key-file", keySources.keyFile, what);
  sub->add_option("--previous-key-file", keySources.previousKeyFile,
                  "Encrypted shards: the key before a rotation");
}

void BaseCommands::addTraining(CLI::App& app) {
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
  run->add_option("--profile", profile,
                  "Record LibTorch's operator profiler over these steps on every rank: FIRST-LAST or N "
                  "(<run>/profile/, a trace in <run>/tensorboard/plugins/profile/; output.profile)");
  run->add_option("--metrics-port", metricsPort,
                  "Serve Prometheus metrics at http://127.0.0.1:PORT/metrics (output.metrics_port)")
      ->check(CLI::Range(1, 65535));
  run->add_flag("--new-run", newRun,
                "Start a new run directory even if an interrupted run of the same job could be "
                "resumed");
  addDebugFlags(run, debug);

  validate = app.add_subcommand("validate", "Check a job file and print the resolved job");
  validate->add_option("job", jobPath, "Job file (YAML)")->required();
  validate->add_option("--set", overrides, "Override a job key: key.path=value (repeatable)")
      ->allow_extra_args(false);
}

void BaseCommands::addCkpt(CLI::App& app) {
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
  ckptDecrypt = ckpt->add_subcommand(
      "decrypt", "Write the plain contents of an encrypted file (a checkpoint's .bin, model/final.pt)");
  ckptDecrypt->add_option("path", ckptPath, "The encrypted file, where it was written")->required();
  ckptDecrypt->add_option("out", decryptOut, "Where the plain copy goes (mode 0600)")->required();
  for (CLI::App* sub : {ckptVerify, ckptDecrypt}) addCkptKeyFile(sub);
  ckptDecrypt->get_option("--key-file")->required();
}

void BaseCommands::addCkptKeyFile(CLI::App* sub) {
  sub->add_option("--key-file", keySources.keyFile,
                  "Encrypted checkpoints: the key file (64 hex digits, mode 0600)");
  sub->add_option("--previous-key-file", keySources.previousKeyFile,
                  "Encrypted checkpoints: the key before a rotation");
}

void BaseCommands::addData(CLI::App& app) {
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
      "tokenize", "Turn text into token datasets DST/train and DST/val (bytes, a SentencePiece model, or a "
                  "tokenizer file: tokenizer.json, vocab.json + merges.txt, vocab.txt)");
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
                           "bytes (each byte a token), sentencepiece (a model trained on the training text, "
                           "or --tokenizer-model), or a tokenizer file: a Hugging Face tokenizer.json, GPT-2's "
                           "vocab.json (merges.txt beside it, or --merges), BERT's vocab.txt, a SentencePiece "
                           ".model, or a model directory holding one")
      ->capture_default_str();
  dataTokenize->add_option("--merges", tokenizeOptions.merges,
                           "GPT-2's merges.txt for a --tokenizer vocab.json kept apart from it");
  dataTokenize->add_flag_callback("--cased", [this] { tokenizeOptions.lowercase = false; },
                                  "a --tokenizer vocab.txt keeps case and accents (bert-base-cased); lower-cased "
                                  "by default");
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

void BaseCommands::addLogsHelp(CLI::App& app) {
  logs = app.add_subcommand(
      "logs", "Print a run's logs (launcher and ranks) merged in time order");
  logs->add_option("run_dir", logsOptions.runDir, "Run directory")->required();
  logs->add_option("--rank", logsOptions.rank, "Only this rank's log")->check(CLI::NonNegativeNumber);
  logs->add_flag("--follow,-f", logsOptions.follow,
                 "Keep printing lines as they are written until the run ends (summary.json) or "
                 "Ctrl-C");

  report = app.add_subcommand(
      "report", "Write a run's report page (one HTML file: curves, per-rank figures, step times, memory, "
                "checkpoints, restarts, the plan against the run, operators) and print its path");
  report->add_option("run_dir", reportOptions.runDir, "Run directory")->required();
  report->add_option("-o,--output", reportOptions.output, "The page to write (default RUN_DIR/report.html)");
  report->add_option("--plan", reportOptions.planFile,
                     "Compare with this plan (`cohort plan --json` output) rather than the run's own");

  help = app.add_subcommand("help", "Show help for cohort or one of its commands");
  help->add_option("command", helpTopic, "Command to explain, or `job` for every job-file key");
}

int BaseCommands::showHelp(CLI::App& app, int argc) const {
  if (helpTopic == "job") {
    // Every key of the job file, as the table in docs/job-spec.md.
    std::cout << "| key | type | default | description |\n|---|---|---|---|\n";
    for (const auto& k : describeJobKeys()) {
      std::cout << "| `" << k.path << "` | " << k.type << " | `" << k.defaultValue << "` | "
                << k.description << " |\n";
    }
    return 0;
  }
  if (!helpTopic.empty()) {
    std::string topics;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App* a) { return !a->get_group().empty(); })) {
      if (sub->get_name() == helpTopic && sub != help) {
        std::cout << sub->help();
        return 0;
      }
      if (sub != help) topics += sub->get_name() + ", ";
    }
    std::cerr << "cohort: no help on '" << helpTopic << "' (try: " << topics << "job)\n";
    return 2;
  }
  std::cout << app.get_formatter()->make_help(&app, "cohort", CLI::AppFormatMode::Normal);
  return app.get_subcommands().empty() && argc > 1 ? 2 : 0;
}

void BaseCommands::setUmask() const {
  if (!*dataPack && !*dataTokenize) ::umask(077);
}

std::optional<int> BaseCommands::dispatch(CLI::App& app, int argc) {
  if (*help || app.get_subcommands().empty()) return showHelp(app, argc);
  if (*validate) {
    JobConfig job = loadJob(jobPath, overrides);
    checkRanks(job, requestedWorldSize(job));
    std::cout << toYaml(job);
    return 0;
  }
  security::installKeyring(security::loadKeyring(keySources));
  if (*ckptDecrypt) {
    const std::string plain = security::readSealedFile(ckptPath, security::installedKeyring());
    writeFileAtomic(decryptOut, plain);
    std::cout << "wrote " << plain.size() << " bytes to " << decryptOut << "\n";
    return 0;
  }
  if (*ckptList) return ckpt::listCommand(ckptPath, std::cout);
  if (*ckptVerify) return ckpt::verifyCommand(ckptPath, std::cout);
  if (*ckptList) return ckpt::listCommand(ckptPath, std::cout);
  if (*ckptVerify) return ckpt::verifyCommand(ckptPath, std::cout);
  if (*dataPack) {
    packOptions.shardBytes = static_cast<int64_t>(shardMb * 1e6);
    packOptions.progress = !noProgress;
    if (const auto* keys = security::installedKeyring()) packOptions.key = &keys->current;
    const auto r = data::pack(dataSrc, dataDst, packOptions);
    std::cout << "packed " << r.manifest.records() << " records of " << r.manifest.classes.size()
              << " classes into " << r.manifest.shards.size() << " shards ("
              << r.manifest.bytes() / 1000000 << " MB) at " << storage::redactUrl(dataDst);
    if (r.skipped > 0) std::cout << "; " << r.skipped << " unreadable files left out (see warnings)";
    std::cout << "\n";
    return 0;
  }
  if (*dataTokenize) {
    tokenizeOptions.progress = !noProgress;
    tokenizeOptions.storage = so;
    const auto r = data::tokenize(dataSrc, dataDst, tokenizeOptions, std::cin);
    std::cout << "tokenized " << r.files << " file(s): " << r.train.records() << " training and "
              << r.val.records() << " validation tokens (tokenizer " << r.train.tokenizer
              << ", vocabulary " << r.train.vocabSize << ") at "
              << storage::redactUrl(dataDst) << "/{train,val}\n"
              << fmt::format("{:.1f} MB of text in {:.2f} s: {:.0f} tokens/s, {:.2f} bytes per token\n",
                             (r.train.textBytes + r.val.textBytes) / 1e6, r.seconds,
                             (r.train.records() + r.val.records()) / std::max(r.seconds, 1e-9),
                             double(r.train.textBytes + r.val.textBytes) /
                                 std::max<int64_t>(1, r.train.records() + r.val.records()));
    return 0;
  }
  if (*dataInspect) return data::inspectCommand(dataPath, inspectRecords, so, std::cout);
  if (*dataVerify) return data::verifyCommand(dataPath, decode, so, std::cout);
  if (*logs) return cli::ClusterCommands::logs(logsOptions);
  if (*report) return monitor::printReport(reportOptions, std::cout);
  if (auto code = cluster.dispatch()) return *code;
  if (auto code = planCommand.dispatch()) return *code;
  if (*run) {
    run::LaunchOptions o;
    o.jobPath = jobPath;
    o.overrides = overrides;
    if (timeline) o.overrides.push_back("output.timeline=true");
    if (run->count("--profile") > 0) {
      try {
        parseStepRange(profile);
      } catch (const ConfigError& e) {
        throw ConfigError(fmt::format("--profile: {}", e.what()));
      }
      o.overrides.push_back("output.profile=" + profile);
    }
    if (metricsPort > 0) o.overrides.push_back(fmt::format("output.metrics_port={}", metricsPort));
    o.runDir = runDir;
    o.procs = procs;
    o.resume = resume;
    o.newRun = newRun;
    o.plan = planFile;
    o.debug = debug;
    return run::runLauncher(o);
  }
  return std::nullopt;
}

}  // namespace cohort::cli
