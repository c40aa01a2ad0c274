// `cohort score`: the command that splits DATA into contiguous parts, starts
// one rank process per part (`cohort score ... --rank r`, score_rank.cc),
// waits for them, and merges their parts into OUT in input order.
//
// Design: everything a rerun needs is on disk in OUT.run/ (score_run.h).
// The command records what it scores first (score.json) and refuses a rerun
// that differs from it; each rank appends whole batches to its part, so a
// rerun keeps what any earlier run finished and each rank only scores the
// rest. OUT appears only complete (a rename), and only after every rank
// succeeded; a rank that fails stops the others (their parts stay).

#include "cohort/serve/score.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"
#include "cohort/launch/spawn.h"
#include "cohort/launch/supervisor.h"
#include "cohort/serve/model.h"
#include "cohort/core/fd.h"
#include "serve/detail/score_data.h"
#include "serve/detail/score_rank.h"
#include "serve/detail/score_run.h"

namespace cohort::serve {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::string absolutePath(const std::string& p) {
  if (p.find("://") != std::string::npos) return p;
  fs::path a = fs::absolute(p).lexically_normal();
  if (a.filename().empty()) a = a.parent_path();  // "images/" -> "images"
  return a.string();
}

// What this run scores, and how it is cut into parts.
detail::ScoreRecord describeRun(const ScoreOptions& o) {
  detail::ScoreRecord r;
  r.model = absolutePath(o.model);
  r.data = absolutePath(o.data);
  // A split model is never built here: its names and shapes are enough.
  std::unique_ptr<Predictor> predictor;
  ModelInfo splitInfo;
  if (o.split > 1) {
    splitInfo = loadTrainedModel(r.model, o.job, /*weightsOnly=*/true).info;
    if (splitInfo.arch != "gpt" && splitInfo.arch != "llama") {
      throw UsageError(fmt::format("--split {}: {} is {}; only gpt and llama are split", o.split, r.model,
                                   splitInfo.arch));
    }
  } else {
    predictor = openPredictor(r.model, o.job);
  }
  const ModelInfo& info = o.split > 1 ? splitInfo : predictor->info();
  const std::unique_ptr<detail::ScoreData> data = detail::openScoreData(r.data, info, o.storage);
  log::info("model {} ({}), data {}", r.model, info.arch, data->describe());
  // A TorchScript export holds its weights: info.weights is only where they
  // came from when it was exported.
  r.modelFingerprint = detail::modelFingerprint(r.model, isScriptExport(r.model) ? "" : info.weights);
  r.dataFingerprint = data->fingerprint();
  r.samples = data->size();
  r.tokens = data->tokens();
  r.topK = r.tokens ? 0 : std::min(o.topK, info.numClasses);
  r.procs = o.procs;
  r.batchSize = o.batchSize;
  r.parts = detail::splitParts(r.samples, o.batchSize, o.procs);
  return r;
}

// One command per OUT at a time: two would append to the same parts. Held
// until it is destroyed, when scoreCommand returns (the ranks do not inherit
// it).
class RunLock {
 public:
  explicit RunLock(const detail::ScorePaths& paths)
      : fd_(::open(paths.lock().c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (!fd_.valid()) {
      throw UsageError(
          fmt::format("--out {}: cannot create {}: {}", paths.out, paths.lock(), std::strerror(errno)));
    }
    if (::flock(fd_.get(), LOCK_EX | LOCK_NB) != 0) {
      throw UsageError(fmt::format("--out {}: another `cohort score` is writing it ({} is locked)", paths.out,
                                   paths.lock()));
    }
  }

 private:
  UniqueFd fd_;
};

// Creates OUT.run/ (or checks the record in it) and locks it. Returns the
// lock, or null when OUT is complete already.
std::unique_ptr<RunLock> prepare(const detail::ScorePaths& paths, const detail::ScoreRecord& record) {
  std::error_code ec;
  const bool outExists = fs::exists(paths.out, ec);
  if (outExists && fs::is_directory(paths.out, ec)) {
    throw UsageError(fmt::format("--out {}: is a directory; expected a file name", paths.out));
  }
  if (fs::exists(paths.record(), ec)) {
    const detail::ScoreRecord before = detail::readRecord(paths.record());
    detail::ScoreRecord now = record;
    if (outExists) {  // complete: how it was cut into parts no longer matters
      now.procs = before.procs;
      now.batchSize = before.batchSize;
      now.parts = before.parts;
    }
    const std::vector<std::string> diff = now.differences(before);
    if (!diff.empty()) {
      throw UsageError(fmt::format("{} {} scored with other inputs ({}); remove {} and {} to score again",
                                   paths.out, outExists ? "was" : "is being",
                                   fmt::join(diff, "; "), paths.out, paths.dir()));
    }
    if (outExists) return nullptr;
    return std::make_unique<RunLock>(paths);
  }
  if (outExists) {
    throw UsageError(fmt::format("--out {}: exists, and {} does not say what it holds; remove it or choose "
                                 "another --out",
                                 paths.out, paths.record()));
  }
  fs::create_directories(paths.dir(), ec);
  if (ec) throw UsageError(fmt::format("--out {}: cannot create {}: {}", paths.out, paths.dir(), ec.message()));
  auto lock = std::make_unique<RunLock>(paths);
  // Parts without a record are of unknown inputs: not kept.
  for (const auto& entry : fs::directory_iterator(paths.dir(), ec)) {
    if (entry.path().filename().string().rfind("part-", 0) == 0) fs::remove(entry.path(), ec);
  }
  try {
    writeFileAtomic(paths.record(), record.toJson().dump(2) + "\n");
  } catch (const IoError& e) {
    throw UsageError(fmt::format("--out {}: {}", paths.out, e.what()));
  }
  return lock;
}

std::vector<std::string> rankArgs(const std::string& exe, const ScoreOptions& o,
                                  const detail::ScoreRecord& record, const std::string& out, int rank) {
  std::vector<std::string> args = {exe,          "score",
                                   record.model, "--data",
                                   record.data,  "--out",
                                   out,          "--procs",
                                   std::to_string(o.procs), "--batch-size",
                                   std::to_string(record.batchSize), "--rank",
                                   std::to_string(rank)};
  if (!o.job.empty()) {
    args.push_back("--job");
    args.push_back(absolutePath(o.job));
  }
  if (o.split > 1) {
    args.push_back("--split");
    args.push_back(std::to_string(o.split));
    if (o.tensor) args.push_back("--tensor");
  }
  const storage::StorageOptions& so = o.storage;
  for (const auto& [flag, value] : {std::pair<const char*, std::string>{"--credentials-file", so.credentialsFile},
                                    {"--endpoint", so.endpoint},
                                    {"--ca-file", so.caFile}}) {
    if (value.empty()) continue;
    args.push_back(flag);
    args.push_back(std::string(flag) == "--endpoint" ? value : absolutePath(value));
  }
  if (so.allowInsecure) args.push_back("--allow-insecure");
  return args;
}

// Starts the ranks and waits for them all. Returns 0, or the exit code of
// the command when a rank failed (it is named, with the end of its log).
int runRanks(const ScoreOptions& o, const detail::ScoreRecord& record, const detail::ScorePaths& paths) {
  // An inherited "ignore SIGCHLD" would have the kernel reap the ranks.
  signal(SIGCHLD, SIG_DFL);
  const std::string exe = launch::selfExecutable();
  launch::Supervisor ranks;  // kills and reaps whatever is left, whatever happens
  for (int r = 0; r < o.procs; ++r) {
    ranks.start(r, exe, rankArgs(exe, o, record, paths.out, r), nullptr, nullptr,
                "the cohort binary for a score rank");
  }
  std::optional<launch::Supervisor::Child> failed;
  // The stall watch: each rank's part size and when it last changed.
  std::vector<std::pair<std::uintmax_t, Clock::time_point>> progress(
      static_cast<size_t>(o.procs), {std::uintmax_t{0}, Clock::now()});
  std::optional<int> stalled;
  const auto now = std::chrono::milliseconds(0);
  launch::Supervisor::Watch w;
  w.ended = [&](const launch::Supervisor::Child& c) {
    if (WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0) return;
    if (!failed) {
      failed = c;
      ranks.stop(SIGKILL, now);  // what they finished stays in their parts
    }
  };
  w.lost = [&](int rank) {
    if (failed) return;
    failed = launch::Supervisor::Child{rank, -1, false, false, -1};
    ranks.stop(SIGKILL, now);
  };
  // The stall hook: a rank whose part stops growing for --stall-seconds.
  w.tick = [&] {
    for (const launch::Supervisor::Child& c : ranks.children()) {
      if (!c.running || failed || o.stallSeconds <= 0) continue;
      std::error_code ec;
      const std::uintmax_t size = fs::file_size(paths.part(c.rank), ec);
      auto& [last, since] = progress[static_cast<size_t>(c.rank)];
      if (!ec && size != last) {
        last = size;
        since = Clock::now();
      } else if (std::chrono::duration<double>(Clock::now() - since).count() > o.stallSeconds) {
        stalled = c.rank;
        failed = c;
        ranks.stop(SIGKILL, now);
      }
    }
  };
  ranks.watch(w);
  if (stalled) {
    std::error_code ec;
    const bool started = fs::file_size(paths.part(*stalled), ec) > 0 && !ec;
    log::error("rank {} scored nothing for {} s (--stall-seconds; its part {} did not grow{}); stopped every "
               "rank. Its log, {}, ends with:\n{}Rerun the same command to resume: the predictions made so far "
               "are kept.",
               *stalled, o.stallSeconds, paths.part(*stalled),
               started ? "" : ", nor was its first batch written: raise --stall-seconds if loading takes longer",
               paths.log(*stalled), tailOfFile(paths.log(*stalled), 8));
    return 1;
  }
  if (!failed) return 0;
  const int st = failed->status;
  const std::string how = st < 0 ? "could not be waited for" : launch::describeStatus(st);
  log::error("rank {} {}; stopped the other ranks. Its log, {}, ends with:\n{}Rerun the same command to "
             "resume: the predictions made so far are kept.",
             failed->rank, how, paths.log(failed->rank), tailOfFile(paths.log(failed->rank), 8));
  return st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 2 ? 2 : 1;
}

}  // namespace

int scoreCommand(const ScoreOptions& o) {
  if (o.rank >= 0) detail::runScoreRankAndExit(o);
  log::Options lo;
  lo.tag = "score";
  log::init(lo);
  if (o.procs < 1) throw UsageError(fmt::format("--procs must be >= 1, got {}", o.procs));
  if (o.split < 1) throw UsageError(fmt::format("--split must be >= 1, got {}", o.split));
  if (o.tensor && o.split < 2) throw UsageError(fmt::format("--tensor: needs --split 2 or more, got {}", o.split));
  if (o.batchSize < 1) throw UsageError(fmt::format("--batch-size must be >= 1, got {}", o.batchSize));
  if (o.topK < 1) throw UsageError(fmt::format("--top-k must be >= 1, got {}", o.topK));
  if (!(o.stallSeconds >= 0)) throw UsageError(fmt::format("--stall-seconds must be >= 0, got {}", o.stallSeconds));
  // DATA goes into every rank's command line (which `ps` shows anyone),
  // score.json and summary.json: no secret may be in it.
  if (o.data.find("://") != std::string::npos && o.data.find('?') != std::string::npos) {
    throw UsageError(fmt::format("--data {}?...: a SAS token in the URL would be written to OUT.run/ and shown "
                                 "in the ranks' command lines; give it with --credentials-file (sas = ...) "
                                 "or $AZURE_STORAGE_SAS_TOKEN",
                                 storage::redactUrl(o.data)));
  }
  const detail::ScorePaths paths{absolutePath(o.out)};
  const detail::ScoreRecord record = describeRun(o);
  const std::unique_ptr<RunLock> lock = prepare(paths, record);
  if (!lock) {
    std::cout << fmt::format("{} is complete: {} predictions ({}); remove it to score again\n", paths.out,
                             record.samples, paths.summary());
    return 0;
  }
  int64_t resumed = 0;
  for (int r = 0; r < record.procs; ++r) {
    const auto [begin, end] = record.parts[static_cast<size_t>(r)];
    resumed += detail::keptLines(paths.part(r), begin, end - begin);
  }
  if (resumed > 0) log::info("resuming: {} of {} samples were scored by an earlier run", resumed, record.samples);

  const auto start = Clock::now();
  const int code = runRanks(o, record, paths);
  if (code != 0) return code;
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const int64_t errors = detail::mergeParts(paths, record);
  const int64_t scored = record.samples - resumed;
  nlohmann::json summary = {
      {"samples", record.samples}, {"scored", scored}, {"resumed", resumed}, {"errors", errors},
      {"seconds", seconds}, {"samples_per_s", seconds > 0 ? static_cast<double>(scored) / seconds : 0.0},
      {"procs", record.procs}, {"batch_size", record.batchSize}, {"model", record.model}, {"data", record.data},
      {"out", paths.out}};
  if (!record.tokens) summary["top_k"] = record.topK;
  writeFileAtomic(paths.summary(), summary.dump(2) + "\n");
  std::error_code ec;
  for (int r = 0; r < record.procs; ++r) fs::remove(paths.part(r), ec);
  if (errors > 0) {
    log::warn("{} sample(s) could not be read: their lines hold an \"error\" instead of predictions", errors);
  }
  std::cout << fmt::format("scored {} samples ({} resumed) in {:.1f} s ({:.1f} samples/s) with {} process{}: {}\n",
                           record.samples, resumed, seconds, summary["samples_per_s"].get<double>(), record.procs,
                           record.procs == 1 ? "" : "es", paths.out);
  return 0;
}

}  // namespace cohort::serve
