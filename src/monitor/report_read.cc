// The report page's reading of a run directory: metrics.jsonl, summary.json,
// job.yaml, the logs, the agents' events and the plan (monitor/report.h).

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <regex>
#include <sstream>

#include "cohort/core/error.h"
#include "monitor/detail/report.h"

namespace fs = std::filesystem;

namespace cohort::monitor::detail {
namespace {

std::optional<std::string> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::optional<nlohmann::json> readObject(const std::string& path) {
  const auto text = slurp(path);
  if (!text) return std::nullopt;
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (!j.is_object()) return std::nullopt;
  return j;
}

double numberOr(const nlohmann::json& j, const char* key, double fallback) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return fallback;
  return j[key].get<double>();
}

void readMetricsFile(RunData& run) {
  std::ifstream in(run.dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) {
      ++run.tornLines;
      continue;
    }
    const std::string event = j.value("event", "");
    if (event == "train") {
      run.train.push_back(std::move(j));
    } else if (event == "eval") {
      run.eval.push_back(std::move(j));
    } else if (event == "resume") {
      run.resumes.push_back(std::move(j));
    } else {
      run.notices.push_back(std::move(j));
    }
  }
}

// name, the samples a rank takes per optimizer step and the ranks, from
// the resolved job.yaml.
void readJob(RunData& run) {
  const std::string path = run.dir + "/job.yaml";
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  try {
    const YAML::Node job = YAML::LoadFile(path);
    if (job["name"]) run.job = job["name"].as<std::string>();
    const YAML::Node t = job["training"];
    if (t && t["batch_size"]) {
      const int64_t accumulate = t["accumulate_steps"] ? t["accumulate_steps"].as<int64_t>() : 1;
      run.samplesPerRankStep = t["batch_size"].as<int64_t>() * std::max<int64_t>(1, accumulate);
    }
    const YAML::Node d = job["distribution"];
    if (d && d["procs_per_node"]) {
      const int nodes = d["nodes"] ? d["nodes"].as<int>() : 1;
      run.worldSize = nodes * d["procs_per_node"].as<int>();
    }
  } catch (const std::exception& e) {
    run.warnings.push_back(fmt::format("{}: not read ({})", path, e.what()));
  }
}

// Seconds since anything under logs/ changed; -1 without logs.
double logsQuietFor(const std::string& dir) {
  std::error_code ec;
  auto newest = fs::file_time_type::min();
  for (const auto& e : fs::directory_iterator(dir + "/logs", ec)) newest = std::max(newest, e.last_write_time(ec));
  if (newest == fs::file_time_type::min()) return -1;
  return std::chrono::duration<double>(fs::file_time_type::clock::now() - newest).count();
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// The launcher's log: starts, failures, restarts, stops; and whether the
// launcher said the run is over.
void readLauncherLog(RunData& run, std::string& lastVerdict) {
  const auto text = slurp(run.dir + "/logs/launcher.log");
  if (!text) return;
  for (const std::string& line : lines(*text)) {
    const auto t = logLineTime(line);
    if (!t) continue;
    const size_t bracket = line.find("] ");
    const std::string message = bracket == std::string::npos ? line : line.substr(bracket + 2);
    const bool error = line.find(" error [") != std::string::npos;
    std::string kind;
    if (message.rfind("starting ", 0) == 0 && message.find(" ranks of job") != std::string::npos) {
      kind = "start";
    } else if (message.rfind("restart ", 0) == 0) {
      kind = "restart";
    } else if (message.find("every rank stopped after writing a checkpoint") != std::string::npos) {
      kind = "stop";
      lastVerdict = "stopped: " + message;
    } else if (error) {
      kind = "failure";
      lastVerdict = message;
    } else if (message.rfind("received SIG", 0) == 0) {
      kind = "signal";
    }
    if (kind == "start" || kind == "restart") lastVerdict.clear();
    if (!kind.empty()) run.events.push_back({*t, kind, message});
  }
}

double isoTime(const std::string& s) {
  std::tm tm{};
  std::istringstream in(s);
  in >> std::get_time(&tm, "%Y-%m-%dT%H:%M:%S");
  if (in.fail()) return NAN;
  return static_cast<double>(timegm(&tm));
}

void readAgentEvents(RunData& run) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run.dir + "/events", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("agent-", 0) != 0 || e.path().extension() != ".jsonl") continue;
    std::ifstream in(e.path());
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object()) continue;
      const double t = isoTime(j.value("time", ""));
      if (!std::isfinite(t)) continue;
      const std::string kind = j.value("event", "");
      std::string text = fmt::format("node {}: {}", j.value("node", "?"), kind);
      if (j.contains("round")) text += fmt::format(" (round {})", j["round"].dump());
      if (j.contains("nodes")) text += fmt::format(", {} nodes", j["nodes"].dump());
      if (j.contains("cause") && j["cause"].is_string()) text += ": " + j["cause"].get<std::string>();
      run.events.push_back({t, kind, text});
    }
  }
}

// A resume record has no time: it is placed at the next train record's.
void placeResumes(RunData& run) {
  for (const auto& r : run.resumes) {
    const int64_t step = r.value("step", int64_t{0});
    for (const auto& t : run.train) {
      if (t.value("step", int64_t{0}) > step && t.contains("time") && t["time"].is_number()) {
        run.events.push_back({t["time"].get<double>(), "resume",
                              fmt::format("resumed at step {} from {}", step, r.value("from", "?"))});
        break;
      }
    }
  }
  std::stable_sort(run.events.begin(), run.events.end(),
                   [](const RunEvent& a, const RunEvent& b) { return a.time < b.time; });
}

// The ranks' own lines: each epoch's throughput, and the memory at the end.
void readRankLogs(RunData& run) {
  static const std::regex kEpoch(
      R"(\] epoch \d+/\d+: \d+ steps in ([0-9.]+) s, loss [-0-9.naif]+, ([0-9.]+) (img|tokens)/s)");
  static const std::regex kMemory(R"(\] memory held: .*; peak resident ([0-9.]+) MB)");
  std::error_code ec;
  int ranksSeen = 0;
  for (const auto& e : fs::directory_iterator(run.dir + "/logs", ec)) {
    const std::string name = e.path().filename().string();
    int rank = -1;
    if (std::sscanf(name.c_str(), "rank-%d.log", &rank) != 1 || rank < 0) continue;
    ++ranksSeen;
    const auto text = slurp(e.path().string());
    if (!text) continue;
    double seconds = 0, weighted = 0, peak = -1;
    for (const std::string& line : lines(*text)) {
      std::smatch m;
      if (std::regex_search(line, m, kEpoch)) {
        seconds += std::stod(m[1]);
        weighted += std::stod(m[1]) * std::stod(m[2]);
      } else if (std::regex_search(line, m, kMemory)) {
        peak = std::stod(m[1]);
      }
    }
    RankFigures& f = run.ranks[rank];
    if (seconds > 0) f.samplesPerS = weighted / seconds;
    if (peak >= 0) f.peakRssMb = peak;
  }
  if (run.worldSize == 0) run.worldSize = ranksSeen;
  bool any = false, anyPeak = false;
  for (const auto& [rank, f] : run.ranks) {
    any = any || f.samplesPerS >= 0;
    anyPeak = anyPeak || f.peakRssMb >= 0;
  }
  if (any) run.rankSource = "logs/rank-<r>.log: each rank's epoch lines (samples/s of the job as that rank timed it)";
  if (anyPeak) run.memorySource = "logs/rank-<r>.log: \"memory held ... peak resident\"";
}

void readMemoryFromSummary(RunData& run) {
  if (!run.summary || !run.summary->contains("peak_rss_mb_per_rank")) return;
  const auto& per = (*run.summary)["peak_rss_mb_per_rank"];
  if (!per.is_array()) return;
  for (size_t r = 0; r < per.size(); ++r) {
    if (per[r].is_number()) run.ranks[static_cast<int>(r)].peakRssMb = per[r].get<double>();
  }
  run.memorySource = "summary.json: peak_rss_mb_per_rank";
}

void decideState(RunData& run, const std::string& lastVerdict) {
  if (run.summary) {
    run.state = run.summary->value("status", "completed");
    if (run.state != "completed") run.stateNote = fmt::format("summary.json says {}", run.state);
    return;
  }
  const double quiet = logsQuietFor(run.dir);
  if (!lastVerdict.empty()) {
    run.state = lastVerdict.rfind("stopped", 0) == 0 ? "stopped" : "failed";
    run.stateNote = "no summary.json; the launcher's last word: " + lastVerdict;
  } else if (quiet >= 0 && quiet < 60) {
    run.state = "running";
    run.stateNote = fmt::format("no summary.json yet and its logs changed {:.0f} s ago: the run is still going; "
                                "this page shows it up to now",
                                quiet);
  } else if (!run.train.empty() || quiet >= 0) {
    run.state = "ended";
    run.stateNote = "no summary.json and the logs are quiet: the run crashed or was killed; this page shows "
                    "what it wrote before";
  } else {
    run.state = "started";
    run.stateNote = "nothing recorded yet (no logs, no metrics)";
  }
}

// The plan's setting of `world` ranks: its `predicted` row or one of
// `by_nodes`.
const nlohmann::json* planRow(const nlohmann::json& plan, int world) {
  auto ranksOf = [](const nlohmann::json& row) -> int64_t {
    if (!row.is_object() || !row.contains("setting") || !row["setting"].is_object()) return 0;
    const auto& r = row["setting"].value("ranks", nlohmann::json());
    return r.is_number_integer() ? r.get<int64_t>() : 0;
  };
  if (plan.contains("predicted") && (world == 0 || ranksOf(plan["predicted"]) == world)) return &plan["predicted"];
  if (plan.contains("by_nodes") && plan["by_nodes"].is_array()) {
    for (const auto& row : plan["by_nodes"]) {
      if (ranksOf(row) == world) return &row;
    }
  }
  return nullptr;
}


}  // namespace

double medianOf(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bool isRunDir(const std::string& dir) {
  std::error_code ec;
  return fs::exists(dir + "/job.yaml", ec) || fs::is_directory(dir + "/logs", ec) ||
         fs::exists(dir + "/metrics.jsonl", ec);
}

std::optional<double> logLineTime(const std::string& line) {
  if (line.size() < 23 || line[4] != '-' || line[10] != ' ' || line[19] != '.') return std::nullopt;
  std::tm tm{};
  int ms = 0;
  if (std::sscanf(line.c_str(), "%4d-%2d-%2d %2d:%2d:%2d.%3d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                  &tm.tm_min, &tm.tm_sec, &ms) != 7) {
    return std::nullopt;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  tm.tm_isdst = -1;
  const std::time_t t = std::mktime(&tm);
  if (t == -1) return std::nullopt;
  return static_cast<double>(t) + ms / 1000.0;
}

namespace {

// The plan against the run: summary.json's `plan` (what the ranks compared
// at the end), else a plan file (--plan, or <run>/plan.json) compared here
// with the run's figures.
void readPlan(RunData& run, const std::string& planFile) {
  const nlohmann::json* inSummary =
      run.summary && run.summary->contains("plan") && (*run.summary)["plan"].is_object() ? &(*run.summary)["plan"]
                                                                                         : nullptr;
  if (planFile.empty() && inSummary != nullptr && (*inSummary).contains("predicted")) {
    const auto& p = (*inSummary)["predicted"];
    const auto& m = (*inSummary).value("measured", nlohmann::json::object());
    run.plan.push_back({"peak memory of rank 0 (MB)", numberOr(p, "peak_rss_mb", 0), numberOr(m, "peak_rss_mb", -1)});
    run.plan.push_back({"samples per second", numberOr(p, "samples_per_s", 0), numberOr(m, "samples_per_s", -1)});
    if (numberOr(p, "step_ms", 0) > 0) {
      run.plan.push_back({"step time (ms, median)", numberOr(p, "step_ms", 0), medianOf(run.stepMs)});
    }
    run.planSource = fmt::format("summary.json: plan ({})", inSummary->value("file", "?"));
    return;
  }
  if (inSummary != nullptr && planFile.empty() && inSummary->contains("note")) {
    run.planNote = fmt::format("summary.json: {}", inSummary->value("note", ""));
  }
  std::string path = planFile;
  std::error_code ec;
  if (path.empty() && fs::exists(run.dir + "/plan.json", ec)) path = run.dir + "/plan.json";
  if (path.empty()) return;
  const auto text = slurp(path);
  if (!text) {
    if (!planFile.empty()) throw DataError(fmt::format("--plan {}: cannot read it", planFile));
    return;
  }
  const auto plan = nlohmann::json::parse(*text, nullptr, false);
  if (!plan.is_object() || !plan.contains("predicted")) {
    const std::string why = fmt::format("{}: not the JSON of `cohort plan --json` (no \"predicted\")", path);
    if (!planFile.empty()) throw DataError("--plan " + why);
    run.warnings.push_back(why);
    return;
  }
  const nlohmann::json* row = planRow(plan, run.worldSize);
  if (row == nullptr) {
    run.planNote = fmt::format("{} predicts no setting of {} ranks", path, run.worldSize);
    return;
  }
  double measuredPeak = -1, measuredRate = -1;
  if (run.summary) {
    measuredPeak = numberOr(*run.summary, "peak_rss_mb", -1);
    measuredRate = numberOr(*run.summary, "train_images_per_s", -1);
  }
  if (measuredPeak < 0 && run.ranks.count(0)) measuredPeak = run.ranks[0].peakRssMb;
  if (measuredRate < 0) {
    std::vector<double> rates;
    for (const auto& t : run.train) rates.push_back(numberOr(t, "images_per_s", NAN));
    rates.erase(std::remove_if(rates.begin(), rates.end(), [](double v) { return !std::isfinite(v); }),
                rates.end());
    measuredRate = medianOf(rates);
  }
  const auto memory = row->value("memory_mb", nlohmann::json::object());
  const auto speed = row->value("speed", nlohmann::json::object());
  run.plan.push_back({"peak memory of rank 0 (MB)", numberOr(memory, "peak", 0), measuredPeak});
  run.plan.push_back({"samples per second", numberOr(speed, "samples_per_s", 0), measuredRate});
  if (numberOr(speed, "step_ms", 0) > 0) {
    run.plan.push_back({"step time (ms, median)", numberOr(speed, "step_ms", 0), medianOf(run.stepMs)});
  }
  run.planSource = path + (planFile.empty() ? " (the run's plan.json)" : " (--plan)");
}

}  // namespace

RunData readRun(const std::string& dir, const std::string& planFile) {
  RunData run;
  run.dir = fs::absolute(dir).lexically_normal().string();
  while (run.dir.size() > 1 && run.dir.back() == '/') run.dir.pop_back();
  run.job = fs::path(run.dir).filename().string();
  readJob(run);
  readMetricsFile(run);
  run.summary = readObject(run.dir + "/summary.json");
  if (run.summary) {
    run.job = run.summary->value("job", run.job);
    run.worldSize = static_cast<int>(numberOr(*run.summary, "world_size", run.worldSize));
  }
  std::string lastVerdict;
  readLauncherLog(run, lastVerdict);
  readAgentEvents(run);
  placeResumes(run);
  readRankLogs(run);
  readMemoryFromSummary(run);
  decideState(run, lastVerdict);
  readTimelines(run);
  if (run.stepMs.empty() && run.train.size() >= 2) {
    // No timeline: the mean step time of each log_every window.
    for (size_t i = 1; i < run.train.size(); ++i) {
      const double dt = numberOr(run.train[i], "time", NAN) - numberOr(run.train[i - 1], "time", NAN);
      const double ds = numberOr(run.train[i], "step", NAN) - numberOr(run.train[i - 1], "step", NAN);
      if (!std::isfinite(dt) || ds <= 0 || dt < 0) continue;
      run.stepMs.push_back(1000 * dt / ds);
      run.slowest.push_back({-1, static_cast<int64_t>(numberOr(run.train[i], "step", 0)), 1000 * dt / ds,
                             numberOr(run.train[i - 1], "time", 0),
                             fmt::format("mean of steps {}..{}", int64_t(numberOr(run.train[i - 1], "step", 0)) + 1,
                                         int64_t(numberOr(run.train[i], "step", 0)))});
    }
    std::sort(run.slowest.begin(), run.slowest.end(), [](const SlowStep& a, const SlowStep& b) { return a.ms > b.ms; });
    if (run.slowest.size() > 10) run.slowest.resize(10);
    if (!run.stepMs.empty()) {
      run.stepSource = "metrics.jsonl: the mean step time between consecutive train records (rank 0's view of "
                       "all ranks; run with --timeline for every step of every rank)";
    }
  }
  readCheckpointScalars(run);
  readOperators(run);
  readPlan(run, planFile);
  return run;
}

}  // namespace cohort::monitor::detail
