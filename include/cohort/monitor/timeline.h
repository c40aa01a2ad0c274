#pragma once

// The timeline (`cohort run --timeline`, output.timeline): one Chrome trace
// per rank, <run>/timeline/rank-<r>.json, in the Trace Event Format that
// chrome://tracing and Perfetto load: a JSON array of complete events ("ph":
// "X") with microsecond timestamps since the Unix epoch, so the files of all
// ranks line up. pid is the rank; tid the thread (0 training, 1 checkpoint
// writer, ...).
//
// Recording an event is a clock read and a push under a mutex; the events
// are written when 512 are pending or a second has passed, and at close. The
// array is left open until then, which both viewers accept, so a crashed
// rank's trace still loads, up to its last second.
//
// The operator profiler (monitor/profiler.h) merges the events of the steps
// it records into its own trace: it captures them here (startCapture,
// takeCapture). A run with the profiler but without output.timeline has a
// timeline that writes no file, whose events only go to a capture.

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

namespace cohort::monitor {

class Timeline {
 public:
  using Clock = std::chrono::system_clock;

  // Creates `path` (and its directory). Throws IoError naming it.
  Timeline(const std::string& path, int rank);
  // A timeline that writes no file: its events only go to a capture.
  explicit Timeline(int rank);
  // Writes what is left and closes the array.
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // A complete event. `name` and `category` are copied; `args` is a JSON
  // object's text ("" for none). Bytes of a name (here and in nameThread)
  // that are not valid UTF-8 become U+FFFD. Thread-safe.
  void complete(const std::string& name, const char* category, Clock::time_point start,
                Clock::time_point end, int tid = 0, const std::string& args = "");
  // Names a thread in the viewer.
  void nameThread(int tid, const std::string& name);
  void flush();

  // From now on, every event recorded is also kept in memory, until
  // takeCapture returns them: the process and thread names first, then the
  // events since startCapture, each a JSON object's text. Thread-safe.
  void startCapture();
  std::vector<std::string> takeCapture();

  const std::string& path() const { return path_; }  // empty: no file

 private:
  void writeLocked(const std::string& event);
  void recordLocked(std::string event);
  void nameProcess();

  std::string path_;
  int rank_;
  std::FILE* file_ = nullptr;
  std::mutex mutex_;
  std::vector<std::string> pending_;
  std::chrono::steady_clock::time_point lastWrite_ = std::chrono::steady_clock::now();
  bool first_ = true;
  std::vector<std::string> names_;  // the metadata events: process and thread names
  bool capturing_ = false;
  std::vector<std::string> captured_;
};

// The process's timeline, or nullptr when there is none (the default).
// Components record into it without being handed one.
Timeline* timeline();
void setTimeline(Timeline* t);

// Records [construction, destruction) as an event on the process's
// timeline, if any. `name` and `category` must outlive it (literals).
class TimelineSpan {
 public:
  TimelineSpan(const char* name, const char* category, int tid = 0)
      : name_(name), category_(category), tid_(tid), on_(timeline() != nullptr) {
    if (on_) start_ = Timeline::Clock::now();
  }
  ~TimelineSpan() {
    if (!on_) return;
    if (Timeline* t = timeline()) t->complete(name_, category_, start_, Timeline::Clock::now(), tid_);
  }
  TimelineSpan(const TimelineSpan&) = delete;
  TimelineSpan& operator=(const TimelineSpan&) = delete;

 private:
  const char* name_;
  const char* category_;
  int tid_;
  bool on_;
  Timeline::Clock::time_point start_;
};

}  // namespace cohort::monitor
