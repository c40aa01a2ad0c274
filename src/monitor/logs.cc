#include "cohort/monitor/logs.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string_view>
#include <tuple>

#include "cohort/core/error.h"
#include "cohort/core/exit_codes.h"
#include "cohort/core/run_dir.h"
#include "cohort/core/signals.h"

namespace cohort::monitor {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// "YYYY-MM-DD HH:MM:SS.mmm": fixed width, so text order is time order.
constexpr size_t kTimeLength = 23;

bool startsWithTime(std::string_view line) {
  static constexpr std::string_view kPattern = "dddd-dd-dd dd:dd:dd.ddd";
  if (line.size() < kTimeLength) return false;
  for (size_t i = 0; i < kTimeLength; ++i) {
    const bool ok = kPattern[i] == 'd' ? (line[i] >= '0' && line[i] <= '9') : line[i] == kPattern[i];
    if (!ok) return false;
  }
  return true;
}

// One logical log line: a timestamped line and its continuation lines.
struct Entry {
  std::string time;  // empty: before any timestamp of its file
  int source = 0;    // priority for equal times
  uint64_t seq = 0;  // order of reading
  std::string text;
};

void sortEntries(std::vector<Entry>& entries) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.time, a.source, a.seq) < std::tie(b.time, b.source, b.seq);
  });
}

// What splitting a file remembers from one read to the next.
struct LineState {
  std::string lastTime;  // of the last timestamped line
  std::string lastHead;  // that line
};

// Splits complete lines into entries: a timestamped line starts one, any
// other line joins the entry before it (or, first in `text`, starts one with
// the time of the last timestamped line before `text`). With `keep` false
// only `state` is updated.

void addLines(std::string_view text, int priority, bool keep, LineState& state,
              std::vector<Entry>& out, uint64_t& seq) {
  size_t current = std::string::npos;  // the entry continuations join
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    const std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (startsWithTime(line)) {
      state.lastTime = std::string(line.substr(0, kTimeLength));
      state.lastHead = std::string(line);
      if (!keep) continue;
      out.push_back({state.lastTime, priority, seq++, std::string(line)});
      current = out.size() - 1;
    } else if (!keep) {
      continue;
    } else if (current != std::string::npos) {
      out[current].text += '\n';
      out[current].text += line;
    } else {
      out.push_back({state.lastTime, priority, seq++, std::string(line)});
      current = out.size() - 1;
    }
  }
}

// A log file read incrementally: only what was appended since the last read.
class Source {
 public:
  Source(std::string path, int priority, bool print)
      : path_(std::move(path)), priority_(priority), print_(print) {}

  // Appends the lines written since the last call to `out` (if printed).
  // A last line without its newline waits for the next call unless `all`.
  // Returns whether anything was read.
  bool read(bool all, std::vector<Entry>& out, uint64_t& seq) {
    struct stat st {};
    if (::stat(path_.c_str(), &st) != 0) return false;
    const auto size = static_cast<uint64_t>(st.st_size);
    if (size < offset_) {  // truncated or replaced: start over
      offset_ = 0;
      partial_.clear();
    }
    std::string chunk;
    if (size > offset_) {
      std::ifstream in(path_, std::ios::binary);
      if (!in) return false;
      in.seekg(static_cast<std::streamoff>(offset_));
      chunk.resize(size - offset_);
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      chunk.resize(static_cast<size_t>(in.gcount()));
      offset_ += chunk.size();
    }
    if (chunk.empty() && !(all && !partial_.empty())) return false;
    partial_ += chunk;
    size_t end = all ? partial_.size() : partial_.rfind('\n');
    if (end == std::string::npos) return !chunk.empty();
    const std::string complete = partial_.substr(0, end);
    partial_.erase(0, std::min(partial_.size(), end + 1));
    addLines(complete, priority_, print_, lines_, out, seq);
    return true;
  }

  // The last timestamped line read.
  const std::string& lastHead() const { return lines_.lastHead; }

 private:
  std::string path_;
  int priority_;
  bool print_;
  uint64_t offset_ = 0;
  std::string partial_;
  LineState lines_;
};

// What the launcher writes when a run is over (src/run/launcher.cc):
// success ends with summary.json instead.
bool launcherLineEndsRun(const std::string& line) {
  if (line.empty()) return false;
  static const char* const kEndings[] = {
      "every rank stopped after writing a checkpoint", "interrupted: every rank stopped",
      "giving up after ", "; stopped the other ranks"};
  for (const char* e : kEndings) {
    if (line.find(e) != std::string::npos) return true;
  }
  const std::string_view level = std::string_view(line).substr(kTimeLength);
  return level.rfind(" error ", 0) == 0 || level.rfind(" critical ", 0) == 0;
}

struct SummaryState {
  bool exists = false;
  int64_t mtimeNs = 0;
  uint64_t size = 0;
  bool operator==(const SummaryState& o) const {
    return exists == o.exists && mtimeNs == o.mtimeNs && size == o.size;
  }
};

SummaryState summaryState(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return {true, static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
          static_cast<uint64_t>(st.st_size)};
}

bool summaryCompleted(const std::string& path) {
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in, nullptr, false);
  return j.is_object() && j.value("status", "") == "completed";
}

class Merger {
 public:
  Merger(const LogsOptions& o, std::ostream& out)
      : o_(o), out_(out), run_{o.runDir}, launcher_(run_.launcherLog(), 0, o.rank < 0) {}

  // Picks up rank logs that appeared since the last call.
  void discover() {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(run_.logsDir(), ec)) {
      const std::string name = e.path().filename().string();
      int rank = -1;
      if (name.size() > 9 && name.size() < 18 && name.rfind("rank-", 0) == 0 &&
          name.compare(name.size() - 4, 4, ".log") == 0) {
        const std::string digits = name.substr(5, name.size() - 9);
        if (std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
          rank = std::stoi(digits);
        }
      }
      if (rank < 0 || (o_.rank >= 0 && rank != o_.rank) || ranks_.count(rank) != 0) continue;
      ranks_.emplace(rank, std::make_unique<Source>(run_.rankLog(rank), 1 + rank, true));
    }
  }

  bool hasLogs() const { return !ranks_.empty() || (o_.rank < 0 && fs::exists(run_.launcherLog())); }
  std::vector<int> ranks() const {
    std::vector<int> r;
    for (const auto& [rank, s] : ranks_) r.push_back(rank);
    return r;
  }

  // Reads every source, prints what it read in time order; returns whether
  // any file grew.
  bool pass(bool all) {
    std::vector<Entry> entries;
    bool grew = launcher_.read(all, entries, seq_);
    for (auto& [rank, s] : ranks_) grew = s->read(all, entries, seq_) || grew;
    sortEntries(entries);
    for (const Entry& e : entries) out_ << e.text << '\n';
    out_.flush();
    if (!out_) throw IoError("cannot write the merged logs to the output");
    return grew;
  }

  const Source& launcher() const { return launcher_; }

 private:
  const LogsOptions& o_;
  std::ostream& out_;
  RunDir run_;
  Source launcher_;
  std::map<int, std::unique_ptr<Source>> ranks_;
  uint64_t seq_ = 0;
};

int follow(const LogsOptions& o, Merger& merger) {
  BlockedSignals signals({SIGINT, SIGTERM});  // taken between polls
  const RunDir run{o.runDir};
  const SummaryState atStart = summaryState(run.summary());
  const bool completedAtStart = atStart.exists && summaryCompleted(run.summary());
  bool endSeen = false;
  Clock::time_point endedAt;
  Clock::time_point quietSince = Clock::now();
  for (;;) {
    merger.discover();
    const bool grew = merger.pass(false);
    const auto now = Clock::now();
    if (grew) quietSince = now;
    const SummaryState summary = summaryState(run.summary());
    const bool ended = completedAtStart || (summary.exists && !(summary == atStart)) ||
                       launcherLineEndsRun(merger.launcher().lastHead());
    // A restart after the launcher's error line reopens the run.
    if (ended && !endSeen) endedAt = now;
    endSeen = ended;
    if (endSeen && (now - quietSince >= o.settle || now - endedAt >= 10 * o.settle)) {
      merger.pass(true);
      return 0;
    }
    if (const int sig = signals.wait(o.pollInterval)) {
      merger.discover();
      merger.pass(true);
      return exitCodeForSignal(sig);
    }
  }
}

}  // namespace

void LogsOptions::validate() const {
  if (rank < -1) throw UsageError(fmt::format("--rank must be >= 0, got {}", rank));
  if (pollInterval.count() <= 0 || settle.count() < 0) {
    throw UsageError("logs: the poll interval must be positive and the settle time not negative");
  }
}

int printLogs(const LogsOptions& o, std::ostream& out) {
  o.validate();
  const RunDir run{o.runDir};
  std::error_code ec;
  if (!fs::is_directory(o.runDir, ec)) {
    throw DataError(fmt::format("no such run directory: {}", o.runDir));
  }
  if (!fs::is_directory(run.logsDir(), ec) && !fs::exists(run.jobFile(), ec)) {
    throw DataError(fmt::format(
        "{} is not a run directory: it has neither logs/ nor job.yaml", o.runDir));
  }
  Merger merger(o, out);
  merger.discover();
  if (!o.follow) {
    if (o.rank >= 0 && merger.ranks().empty()) {
      throw DataError(fmt::format("no log of rank {}: {} does not exist", o.rank,
                                  run.rankLog(o.rank)));
    }
    if (!merger.hasLogs()) {
      throw DataError(fmt::format("no logs in {} (no launcher.log, no rank-<r>.log)",
                                  run.logsDir()));
    }
    merger.pass(true);
    return 0;
  }
  return follow(o, merger);
}

std::string mergeLogs(const std::vector<std::string>& texts) {
  std::vector<Entry> entries;
  uint64_t seq = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    LineState state;
    addLines(texts[i], static_cast<int>(i), true, state, entries, seq);
  }
  sortEntries(entries);
  std::string out;
  for (const Entry& e : entries) out += e.text + '\n';
  return out;
}

}  // namespace cohort::monitor
