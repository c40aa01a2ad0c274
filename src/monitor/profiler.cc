#include "cohort/monitor/profiler.h"

#include <ATen/record_function.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"
#include "cohort/monitor/timeline.h"
#include "monitor/detail/profile_files.h"

// Design: LibTorch's profiler (torch::autograd::profiler::enableProfiler,
// the Kineto API, which Debian's 1.13 runs without Kineto: CPU operators
// only) is enabled on the training thread at the first step of the range
// and disabled after the last; while it records, each phase of cohort's
// step is a RecordFunction of user scope (ProfileRange) and each step one
// named ProfilerStep#N, as torch.profiler names them. Its events and the
// timeline's captured over the same steps make the trace; the operator
// table comes from the events alone.

namespace cohort::monitor {

namespace detail {
std::atomic<bool> profilerRecording{false};
}  // namespace detail

namespace {

namespace tp = torch::autograd::profiler;
namespace tpi = torch::profiler::impl;

// A named range's RecordFunction; inactive when LibTorch samples it out.
at::RecordFunction* openRecord(const char* name) {
  auto* r = new at::RecordFunction(at::RecordScope::USER_SCOPE);
  if (r->isActive()) r->before(name);
  return r;
}

std::string shapesText(const tp::KinetoEvent& e) {
  if (!e.hasShapes()) return "[]";
  std::string out = "[";
  bool firstInput = true;
  for (const std::vector<int64_t>& s : e.shapes()) {
    out += firstInput ? "[" : ", [";
    firstInput = false;
    out += fmt::format("{}", fmt::join(s, ", "));
    out += "]";
  }
  return out + "]";
}

std::string dtypesText(const tp::KinetoEvent& e) {
  if (!e.hasTypes()) return "";
  nlohmann::json j = nlohmann::json::array();
  for (const std::string& t : e.dtypes()) j.push_back(t);
  return j.dump();
}

// Trace rows of the profiler's threads, beside the timeline's (0..3).
constexpr int kProfilerTidBase = 100;

// Input shapes, and no with_flops: with both, LibTorch 1.13 keeps tensors
// alive until the profiler stops (a GPT rank grew by ~100 MB a step);
// matrix products' FLOPs are counted from the shapes instead.
tpi::ProfilerConfig profilerConfig() {
  return tpi::ProfilerConfig(tpi::ProfilerState::KINETO, /*report_input_shapes=*/true,
                             /*profile_memory=*/false, /*with_stack=*/false, /*with_flops=*/false,
                             /*with_modules=*/false);
}

const std::set<tpi::ActivityType> kCpuOnly{tpi::ActivityType::CPU};

}  // namespace

void ProfileRange::open(const char* name) { range_ = openRecord(name); }

void ProfileRange::close() { delete static_cast<at::RecordFunction*>(range_); }

Profiler::Profiler(ProfilerOptions options) : o_(std::move(options)) {
  tracePath_ = fmt::format("{}/tensorboard/plugins/profile/{}/{}_{}.pt.trace.json", o_.runDir, o_.traceTime,
                           o_.host, o_.rank);
}

Profiler::~Profiler() {
  if (!started_ || done_) return;
  // An error unwinds the loop: stop recording, keep nothing.
  closeStep();
  detail::profilerRecording.store(false);
  try {
    tp::disableProfiler();
  } catch (const std::exception& e) {
    log::warn("operator profiler: stopping it failed: {}", e.what());
  }
}

void Profiler::beforeStep(int64_t step) {
  if (done_ || step < o_.first || step > o_.last) return;
  if (!started_) start(step);
  if (openStep_ != step) openStep(step);
}

void Profiler::afterStep(int64_t step) {
  if (!started_ || done_) return;
  closeStep();
  lastRecorded_ = step;
  if (step >= o_.last) stop();
}

void Profiler::finish() {
  if (!started_ || done_) return;
  closeStep();
  log::warn("operator profiler: training ended after step {}, before the profiled steps' last ({}): the "
            "profile holds steps {}-{}",
            lastRecorded_, o_.last, firstRecorded_, lastRecorded_);
  stop();
}

void Profiler::start(int64_t step) {
  firstRecorded_ = step;
  lastRecorded_ = step - 1;
  tp::prepareProfiler(profilerConfig(), kCpuOnly);
  if (o_.timeline != nullptr) o_.timeline->startCapture();
  tp::enableProfiler(profilerConfig(), kCpuOnly, {at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                                                  at::RecordScope::USER_SCOPE});
  detail::profilerRecording.store(true);
  started_ = true;
  log::info("operator profiler: recording steps {}-{}", step, o_.last);
}

void Profiler::openStep(int64_t step) {
  closeStep();
  auto* r = new at::RecordFunction(at::RecordScope::USER_SCOPE);
  if (r->isActive()) r->before(fmt::format("ProfilerStep#{}", step));
  stepRecord_ = std::shared_ptr<void>(r, [](void* p) { delete static_cast<at::RecordFunction*>(p); });
  openStep_ = step;
}

void Profiler::closeStep() {
  stepRecord_.reset();
  openStep_ = 0;
}

void Profiler::stop() {
  const auto stopping = std::chrono::steady_clock::now();
  done_ = true;
  detail::profilerRecording.store(false);
  const std::unique_ptr<tp::ProfilerResult> result = tp::disableProfiler();
  std::vector<std::string> trace;
  if (o_.timeline != nullptr) trace = o_.timeline->takeCapture();
  std::vector<ProfiledEvent> events;
  std::set<uint64_t> threads;
  for (const tp::KinetoEvent& k : result->events()) {
    // CPU operators and ranges; without Kineto there is nothing else.
    if (k.deviceType() != c10::DeviceType::CPU) continue;
    ProfiledEvent e;
    e.name = k.name();
    e.thread = k.startThreadId();
    e.startUs = static_cast<int64_t>(k.startUs());
    e.durationUs = static_cast<int64_t>(k.durationUs());
    e.inputShapes = shapesText(k);
    if (k.hasShapes()) e.flops = detail::productFlops(e.name, k.shapes().vec());
    const bool range = k.scope() == static_cast<uint8_t>(at::RecordScope::USER_SCOPE);
    const int tid = kProfilerTidBase + static_cast<int>(e.thread);
    threads.insert(e.thread);
    trace.push_back(detail::traceEvent(e, range, o_.rank, tid, range ? "" : dtypesText(k)));
    events.push_back(std::move(e));
  }
  for (uint64_t t : threads) {
    trace.push_back(nlohmann::json{{"name", "thread_name"},
                                   {"ph", "M"},
                                   {"pid", o_.rank},
                                   {"tid", kProfilerTidBase + static_cast<int>(t)},
                                   {"args", {{"name", fmt::format("LibTorch operators (thread {})", t)}}}}
                        .dump());
  }
  const std::vector<OperatorRow> table = operatorTable(std::move(events));
  const std::string recorded = firstRecorded_ == lastRecorded_
                                   ? fmt::format("{}", firstRecorded_)
                                   : fmt::format("{}-{}", firstRecorded_, lastRecorded_);
  const std::string dir = o_.runDir + "/profile";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::filesystem::create_directories(std::filesystem::path(tracePath_).parent_path(), ec);
  const std::string csv = fmt::format("{}/operators-rank-{}.csv", dir, o_.rank);
  const std::string json = fmt::format("{}/operators-rank-{}.json", dir, o_.rank);
  writeFileAtomic(csv, detail::operatorCsv(table));
  writeFileAtomic(json, detail::operatorJson(o_.rank, firstRecorded_, lastRecorded_, table));
  writeFileAtomic(tracePath_, detail::traceText(o_.rank, o_.worldSize, trace));
  log::info("operator profile of steps {} on rank {} ({} operators and ranges, stopped and written in {:.2f} s; "
            "all in {}, trace {}):",
            recorded, o_.rank, table.size(),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - stopping).count(), csv, tracePath_);
  for (const std::string& line : detail::operatorLines(table, o_.printRows)) log::info("  {}", line);
}

}  // namespace cohort::monitor
