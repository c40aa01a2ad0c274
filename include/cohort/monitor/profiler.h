#pragma once

// The operator profiler (`cohort run --profile STEPS`, output.profile):
// LibTorch's profiler recorded on every rank over a range of steps, with
// cohort's phases as named ranges (ProfileRange: data, forward, loss,
// backward, exchange, optimizer, checkpoint) and each step as a range
// "ProfilerStep#N". At the range's last step each rank writes
//
//   <run>/profile/operators-rank-<r>.csv and .json   the operator table
//   <run>/tensorboard/plugins/profile/<time>/<host>_<rank>.pt.trace.json
//                                                     a Chrome trace, in the
//                                                     layout of TensorBoard's
//                                                     PyTorch profiler plugin
//
// The trace holds the profiler's events and the timeline's (monitor/timeline.h)
// over the same steps, on one clock (microseconds since the Unix epoch).
//
// Debian's LibTorch 1.13 is built without Kineto: the profiler used is the
// one behind torch.autograd.profiler's Kineto API (enableProfiler with CPU
// activities), which records the operators on the thread that starts it (and
// those LibTorch hands its state to, as autograd's); without Kineto it has
// no device activities and ProfilerResult::save is refused, so cohort writes
// the trace itself.
//
// Off (the default) nothing is installed: a ProfileRange is one relaxed
// atomic load, and LibTorch runs with no observer.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cohort::monitor {

class Timeline;

namespace detail {
extern std::atomic<bool> profilerRecording;
}  // namespace detail

// Whether the profiler records now (on this process).
inline bool profilerRecording() { return detail::profilerRecording.load(std::memory_order_relaxed); }

// A named range in the profile, [construction, destruction), on this
// thread; nothing when the profiler does not record. `name` must outlive
// it (a literal).
class ProfileRange {
 public:
  explicit ProfileRange(const char* name) {
    if (profilerRecording()) open(name);
  }
  ~ProfileRange() {
    if (range_ != nullptr) close();
  }
  ProfileRange(const ProfileRange&) = delete;
  ProfileRange& operator=(const ProfileRange&) = delete;

 private:
  void open(const char* name);
  void close();
  void* range_ = nullptr;  // an at::RecordFunction while recording
};

struct ProfilerOptions {
  int64_t first = 1;        // the steps recorded (from 1, both included), within the run's
  int64_t last = 1;
  std::string runDir;       // <run>
  std::string traceTime;    // the <time> directory of the trace, the same on every rank
  std::string host;         // this machine's name, for the trace's file name
  int rank = 0;
  int worldSize = 1;
  Timeline* timeline = nullptr;  // whose events the trace merges; may be null
  int printRows = 30;       // rows of the table logged at the end (info: rank 0's on the console)
};

// One row of the operator table: an operator (or a named range) with one
// list of input shapes, over the steps recorded on this rank.
struct OperatorRow {
  std::string name;
  int64_t calls = 0;
  double selfUs = 0;   // in it, not in the operators it called
  double totalUs = 0;
  std::string inputShapes;  // "[[64, 128], [128, 512]]"; "[]" for none
  double flops = -1;        // total over the calls; < 0: not known (counted for matrix products)
};

// Records the steps options.first..last on the thread that calls it (the
// training loop's). Not thread-safe: one thread calls every method.
class Profiler {
 public:
  explicit Profiler(ProfilerOptions options);
  // Stops recording, if it still does, writing nothing (an error path).
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Step `step` (from 1) begins: recording starts at the range's first step
  // (or the first one after it a resumed run trains). Cheap otherwise.
  void beforeStep(int64_t step);
  // Step `step` ended, its checkpoint included. At the range's last step,
  // recording stops and the files are written (throws IoError naming a
  // file it cannot write).
  void afterStep(int64_t step);
  // Training ended: a profile still recording is written with the steps it
  // has, with a warning.
  void finish();

  const std::string& traceFile() const { return tracePath_; }

 private:
  void start(int64_t step);
  void stop();
  void openStep(int64_t step);
  void closeStep();

  ProfilerOptions o_;
  std::string tracePath_;
  bool started_ = false;
  bool done_ = false;
  int64_t firstRecorded_ = 0;
  int64_t lastRecorded_ = 0;
  int64_t openStep_ = 0;              // the step whose range is open; 0: none
  std::shared_ptr<void> stepRecord_;  // its at::RecordFunction
};

// One event of the profiler: an operator's call or a named range. Events
// of one thread nest.
struct ProfiledEvent {
  std::string name;
  uint64_t thread = 0;
  int64_t startUs = 0;
  int64_t durationUs = 0;
  std::string inputShapes;
  double flops = -1;
};

// The operator table of `events`: a row per name and input shapes, self
// time being the time in an event outside the events nested in it; sorted
// by self time, descending (then by name).
std::vector<OperatorRow> operatorTable(std::vector<ProfiledEvent> events);

}  // namespace cohort::monitor
