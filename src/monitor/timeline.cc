#include "cohort/monitor/timeline.h"

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cohort/core/error.h"

namespace cohort::monitor {
namespace {

std::atomic<Timeline*> current{nullptr};

// Events are written in batches of this many.
constexpr size_t kBatch = 512;

// JSON text of a value; bytes that are not valid UTF-8 (in a name) become
// U+FFFD instead of throwing, so that any name leaves a loadable trace.
std::string jsonText(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

int64_t micros(Timeline::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

}  // namespace

Timeline* timeline() { return current.load(std::memory_order_acquire); }
void setTimeline(Timeline* t) { current.store(t, std::memory_order_release); }

Timeline::Timeline(const std::string& path, int rank) : path_(path), rank_(rank) {
  std::error_code ec;
  const auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr) {
    throw IoError(fmt::format("cannot create the timeline {}: {}", path, std::strerror(errno)));
  }
  std::fputs("[\n", file_);
  nameProcess();
}

Timeline::Timeline(int rank) : rank_(rank) { nameProcess(); }

void Timeline::nameProcess() {
  std::lock_guard<std::mutex> g(mutex_);
  names_.push_back(nlohmann::json{{"name", "process_name"}, {"ph", "M"}, {"pid", rank_},
                                  {"args", {{"name", fmt::format("rank {}", rank_)}}}}
                       .dump());
  names_.push_back(nlohmann::json{{"name", "process_sort_index"}, {"ph", "M"}, {"pid", rank_},
                                  {"args", {{"sort_index", rank_}}}}
                       .dump());
  for (const auto& n : names_) writeLocked(n);
}

Timeline::~Timeline() {
  if (timeline() == this) setTimeline(nullptr);
  flush();
  if (file_ == nullptr) return;
  std::fputs("\n]\n", file_);
  std::fclose(file_);
}

void Timeline::complete(const std::string& name, const char* category, Clock::time_point start,
                        Clock::time_point end, int tid, const std::string& args) {
  const int64_t ts = micros(start);
  const int64_t dur = std::max<int64_t>(0, micros(end) - ts);
  std::string e = fmt::format(R"({{"name":{},"cat":"{}","ph":"X","ts":{},"dur":{},"pid":{},"tid":{})",
                              jsonText(name), category, ts, dur, rank_, tid);
  if (!args.empty()) e += ",\"args\":" + args;
  e += "}";
  std::lock_guard<std::mutex> g(mutex_);
  recordLocked(std::move(e));
}

void Timeline::recordLocked(std::string event) {
  if (capturing_) captured_.push_back(event);
  if (file_ == nullptr) return;
  const auto now = std::chrono::steady_clock::now();
  pending_.push_back(std::move(event));
  // In batches, and at least every second: a rank that dies keeps its trace
  // up to then.
  if (pending_.size() >= kBatch || now - lastWrite_ > std::chrono::seconds(1)) {
    for (const auto& p : pending_) writeLocked(p);
    pending_.clear();
    std::fflush(file_);
    lastWrite_ = now;
  }
}

void Timeline::nameThread(int tid, const std::string& name) {
  std::lock_guard<std::mutex> g(mutex_);
  names_.push_back(jsonText({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", tid},
                             {"args", {{"name", name}}}}));
  writeLocked(names_.back());
}

void Timeline::startCapture() {
  std::lock_guard<std::mutex> g(mutex_);
  capturing_ = true;
  captured_.clear();
}

std::vector<std::string> Timeline::takeCapture() {
  std::lock_guard<std::mutex> g(mutex_);
  capturing_ = false;
  std::vector<std::string> out = names_;
  out.insert(out.end(), std::make_move_iterator(captured_.begin()), std::make_move_iterator(captured_.end()));
  captured_.clear();
  return out;
}

void Timeline::flush() {
  std::lock_guard<std::mutex> g(mutex_);
  if (file_ == nullptr) return;
  for (const auto& p : pending_) writeLocked(p);
  pending_.clear();
  std::fflush(file_);
}

void Timeline::writeLocked(const std::string& event) {
  if (file_ == nullptr) return;
  if (!first_) std::fputs(",\n", file_);
  first_ = false;
  std::fputs(event.c_str(), file_);
}

}  // namespace cohort::monitor
