#include "cohort/cluster/runs.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cohort/ckpt/manifest.h"
#include "cohort/cluster/command.h"
#include "cohort/cluster/record.h"
#include "cohort/core/error.h"
#include "cohort/core/text.h"

namespace fs = std::filesystem;

namespace cohort::cluster {
namespace {

constexpr auto kAsk = std::chrono::seconds(10);

std::optional<nlohmann::json> readJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  auto j = nlohmann::json::parse(text.str(), nullptr, false);
  if (!j.is_object()) return std::nullopt;
  return j;
}

// "KEY=value" of `scontrol show job -o` output.
std::string field(const std::string& line, const std::string& key) {
  const std::string k = " " + key + "=";
  const std::string padded = " " + line;
  const auto at = padded.find(k);
  if (at == std::string::npos) return "";
  const auto begin = at + k.size();
  return padded.substr(begin, padded.find(' ', begin) - begin);
}

bool active(const std::string& slurmState) {
  static const char* kActive[] = {"PENDING",   "RUNNING",      "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                                  "COMPLETING", "CONFIGURING", "SUSPENDED", "RESIZING",     "SIGNALING",
                                  "STAGE_OUT"};
  for (const char* s : kActive) {
    if (slurmState == s) return true;
  }
  return false;
}

// The last train step and loss, and the best eval, from metrics.jsonl.
void readMetrics(const std::string& path, RunInfo& r) {
  std::ifstream in(path);
  std::string line;
  double lastLoss = -1, bestTop1 = -1, bestEvalLoss = -1;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) continue;  // a line torn by a kill
    const std::string event = j.value("event", "");
    if (event == "train") {
      r.step = j.value("step", r.step);
      lastLoss = j.value("loss", lastLoss);
      r.samplesPerS = j.value("images_per_s", r.samplesPerS);
    } else if (event == "eval") {
      const double top1 = j.value("top1", 0.0);
      const double loss = j.value("loss", -1.0);
      if (top1 > 0) bestTop1 = std::max(bestTop1, top1);
      if (loss >= 0 && (bestEvalLoss < 0 || loss < bestEvalLoss)) bestEvalLoss = loss;
    }
  }
  if (bestTop1 > 0) {
    r.best = fmt::format("top1 {:.4f}", bestTop1);
  } else if (bestEvalLoss >= 0) {
    r.best = fmt::format("eval loss {:.4f}", bestEvalLoss);
  } else if (lastLoss >= 0) {
    r.best = fmt::format("loss {:.4f}", lastLoss);
  }
}

// The newest step-<N> with a manifest under the run's checkpoints (not
// verified: that reads every file; `cohort ckpt verify` does).
int64_t newestCheckpoint(const std::string& runDir, const nlohmann::json* summary) {
  std::string dir = runDir + "/checkpoints";
  if (summary != nullptr && summary->contains("checkpoints") && (*summary)["checkpoints"].is_object()) {
    dir = (*summary)["checkpoints"].value("dir", dir);
  }
  const auto dirs = ckpt::listCheckpointDirs(dir);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    std::error_code ec;
    if (fs::exists(it->path + "/manifest.json", ec)) return it->step;
  }
  return -1;
}

// Seconds since anything under logs/ changed; -1 without logs.
double logsQuietFor(const std::string& runDir) {
  std::error_code ec;
  auto newest = fs::file_time_type::min();
  for (const auto& e : fs::directory_iterator(runDir + "/logs", ec)) {
    newest = std::max(newest, e.last_write_time(ec));
  }
  if (newest == fs::file_time_type::min()) return -1;
  return std::chrono::duration<double>(fs::file_time_type::clock::now() - newest).count();
}

std::string lower(std::string s) { return lowerAscii(std::move(s)); }

// The top-level `name:` of a resolved job.yaml (toYaml writes it unquoted).
std::string jobName(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("name:", 0) == 0) return trimSpace(line.substr(5));
  }
  return "";
}

}  // namespace

namespace {

// The first line a Slurm client printed, split at '|'; nullopt when the
// client is not installed, failed or printed nothing.
std::optional<std::vector<std::string>> firstLine(const std::vector<std::string>& argv) {
  if (!findOnPath(argv[0])) return std::nullopt;
  const auto r = runCommand(argv, kAsk);
  const std::string line = trimSpace(r.out.substr(0, r.out.find('\n')));
  if (r.exitCode != 0 || line.empty()) return std::nullopt;
  std::vector<std::string> fields;
  for (size_t start = 0;;) {
    const size_t bar = line.find('|', start);
    fields.push_back(line.substr(start, bar == std::string::npos ? std::string::npos : bar - start));
    if (bar == std::string::npos) return fields;
    start = bar + 1;
  }
}

}  // namespace

SlurmState querySlurm(const std::string& ref) {
  SlurmState s;
  if (const auto f = firstLine({"squeue", "-h", "-t", "all", "-j", ref, "-o", "%T|%M|%r"}); f && f->size() == 3) {
    s = {(*f)[0], (*f)[2] == "None" ? "" : (*f)[2], (*f)[1], "squeue"};
  } else if (const auto g = firstLine({"sacct", "-n", "-P", "-X", "-j", ref, "-o", "State,ExitCode,Elapsed"});
             g && g->size() == 3) {
    // "CANCELLED by 0": the state is the first word.
    s = {(*g)[0].substr(0, (*g)[0].find(' ')), "exit code " + (*g)[1], (*g)[2], "sacct"};
  } else if (const auto h = firstLine({"scontrol", "-o", "show", "job", ref})) {
    const std::string line = fmt::format("{}", fmt::join(*h, "|"));  // a '|' in a path
    const std::string reason = field(line, "Reason");
    s = {field(line, "JobState"), reason == "None" || reason.empty() ? "exit code " + field(line, "ExitCode") : reason,
         field(line, "RunTime"), "scontrol"};
  }
  return s;
}

RunInfo describeRun(const std::string& runDir, bool askSlurm) {
  RunInfo r;
  r.path = runDir;
  const auto summary = readJson(runDir + "/summary.json");
  r.job = jobName(runDir + "/job.yaml");
  readMetrics(runDir + "/metrics.jsonl", r);
  r.checkpointStep = newestCheckpoint(runDir, summary ? &*summary : nullptr);
  std::error_code ec;
  r.hasReport = fs::is_regular_file(runDir + "/report.html", ec);
  const auto record = readSlurmRecord(runDir);
  if (record) {
    r.slurmRef = record->ref();
    r.overrides = record->overrides;
    if (askSlurm) r.slurm = querySlurm(r.slurmRef);
  }
  if (summary) {
    r.job = summary->value("job", r.job);
    r.seconds = summary->value("wall_time_s", -1.0);
    r.samplesPerS = summary->value("train_images_per_s", r.samplesPerS);
    r.step = std::max<int64_t>(r.step, summary->value("steps", int64_t{-1}));
  }
  if (!r.slurm.state.empty() && active(r.slurm.state)) {
    r.state = lower(r.slurm.state);
  } else if (summary) {
    r.state = summary->value("status", "completed");
  } else if (!r.slurm.state.empty()) {
    r.state = lower(r.slurm.state);
  } else {
    const double quiet = logsQuietFor(runDir);
    r.state = quiet < 0                              ? (record ? "submitted" : "created")
              : quiet < 60                           ? "running"
              : r.checkpointStep >= 0                ? "interrupted"
                                                     : "failed";
  }
  return r;
}

std::vector<std::string> findRuns(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw DataError(fmt::format("{}: no such directory", dir));
  // What openRunDir makes: a job file beside logs/ (a job file alone is a
  // user's directory of jobs).
  auto isRun = [](const fs::path& p) {
    std::error_code e;
    return fs::exists(p / "job.yaml", e) && fs::is_directory(p / "logs", e);
  };
  if (isRun(dir)) return {fs::absolute(dir).lexically_normal().string()};
  std::vector<std::string> runs;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_directory(ec)) continue;
    if (isRun(e.path())) {
      runs.push_back(fs::absolute(e.path()).lexically_normal().string());
      continue;
    }
    for (const auto& g : fs::directory_iterator(e.path(), ec)) {
      if (g.is_directory(ec) && isRun(g.path())) runs.push_back(fs::absolute(g.path()).lexically_normal().string());
    }
  }
  std::sort(runs.begin(), runs.end());
  return runs;
}

namespace {

std::string describeTime(double seconds) {
  if (seconds < 0) return "-";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  return s >= 3600 ? fmt::format("{}h{:02}m", s / 3600, s / 60 % 60) : fmt::format("{}m{:02}s", s / 60, s % 60);
}

// The path as the table shows it: relative to the listed directory.
std::string shown(const std::string& path, const std::string& base) {
  const std::string rel = fs::relative(path, fs::absolute(base)).string();
  return rel.empty() || rel == "." ? fs::path(path).filename().string() : rel;
}

// The path of a run as the user can open it: below the directory they
// named, as they named it.
std::string userPath(const std::string& path, const std::string& base) {
  const std::string rel = fs::relative(path, fs::absolute(base)).string();
  if (rel.empty() || rel == ".") return base;
  return (fs::path(base) / rel).lexically_normal().string();
}

// The run's report page, or the command that writes it.
std::string reportOf(const RunInfo& r, const std::string& base) {
  const std::string path = userPath(r.path, base);
  return r.hasReport ? path + "/report.html" : "cohort report " + path;
}

std::string describeRate(double perS) { return perS < 0 ? "-" : fmt::format("{:.0f}", perS); }

}  // namespace

int printRuns(const std::string& dir, std::ostream& out, bool askSlurm) {
  const auto runs = findRuns(dir);
  if (runs.empty()) {
    out << fmt::format("no runs under {}\n", dir);
    return 0;
  }
  std::vector<RunInfo> infos;
  size_t width = 3;
  for (const auto& path : runs) {
    infos.push_back(describeRun(path, askSlurm));
    width = std::max(width, shown(path, dir).size());
  }
  out << fmt::format("{:<{}}  {:<12} {:>8}  {:<18} {:>9} {:>8}  {:<8} {}\n", "RUN", width, "STATE", "STEP", "BEST",
                     "SAMPLES/S", "TIME", "SLURM", "REPORT");
  for (const auto& r : infos) {
    out << fmt::format("{:<{}}  {:<12} {:>8}  {:<18} {:>9} {:>8}  {:<8} {}\n", shown(r.path, dir), width, r.state,
                       r.step >= 0 ? std::to_string(r.step) : "-", r.best.empty() ? "-" : r.best,
                       describeRate(r.samplesPerS), describeTime(r.seconds), r.slurmRef.empty() ? "-" : r.slurmRef,
                       reportOf(r, dir));
  }
  return 0;
}

int printStatus(const std::string& runDir, std::ostream& out) {
  const auto runs = findRuns(runDir);
  if (runs.empty()) {
    throw DataError(fmt::format("{}: not a run directory (no job.yaml and logs/) and no runs under it", runDir));
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunInfo r = describeRun(runs[i]);
    if (i > 0) out << "\n";
    out << fmt::format("run         {}\n", r.path);
    if (!r.overrides.empty()) out << fmt::format("point       {}\n", fmt::join(r.overrides, " "));
    out << fmt::format("state       {}\n", r.state);
    if (!r.slurmRef.empty()) {
      if (r.slurm.state.empty()) {
        out << fmt::format("slurm       job {}: no longer known to Slurm\n", r.slurmRef);
      } else {
        out << fmt::format("slurm       job {}: {}{}{} ({})\n", r.slurmRef, r.slurm.state,
                           r.slurm.reason.empty() ? "" : ", " + r.slurm.reason,
                           r.slurm.elapsed.empty() ? "" : ", " + r.slurm.elapsed, r.slurm.from);
      }
    }
    out << fmt::format("step        {}\n", r.step >= 0 ? std::to_string(r.step) : "-");
    if (!r.best.empty()) out << fmt::format("best        {}\n", r.best);
    if (r.seconds >= 0) out << fmt::format("time        {}\n", describeTime(r.seconds));
    out << fmt::format("checkpoint  {}\n", r.checkpointStep >= 0 ? "step " + std::to_string(r.checkpointStep) : "none");
    if (r.samplesPerS >= 0) out << fmt::format("samples/s   {}\n", describeRate(r.samplesPerS));
    out << fmt::format("report      {}\n", reportOf(r, runs[i]));
  }
  return 0;
}

int cancelRun(const std::string& runDir, std::ostream& out) {
  const auto record = readSlurmRecord(runDir);
  if (!record) {
    throw UsageError(fmt::format("{}: not submitted to Slurm (no slurm.json); a local `cohort run` stops on "
                                 "SIGTERM (after a checkpoint) or Ctrl-C",
                                 runDir));
  }
  const auto r = runCommand({"scancel", record->ref()}, kAsk);
  if (r.exitCode != 0) throw UsageError(fmt::format("cannot cancel Slurm job {}: {}", record->ref(), r.describe("scancel")));
  out << fmt::format("cancelled Slurm job {}: its ranks get SIGTERM, write a checkpoint and stop\n", record->ref());
  return 0;
}

}  // namespace cohort::cluster
