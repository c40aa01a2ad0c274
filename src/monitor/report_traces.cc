// The report page's reading of a run's traces: the ranks' timelines (step
// times, data wait, checkpoint blocking), TensorBoard's checkpoint scalars
// and the operator tables of a profiled run (monitor/report.h).

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "monitor/detail/report.h"

namespace fs = std::filesystem;

namespace cohort::monitor::detail {
namespace {

struct Span {
  std::string name;
  double ts = 0, dur = 0;  // microseconds
};

// The training thread's spans of one timeline file. Each event is a line of
// its own (monitor/timeline.h); a torn last line, or an array never closed
// (a rank that crashed), costs only that line.
std::vector<Span> trainingSpans(const std::string& path, int64_t& unreadable) {
  std::vector<Span> spans;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && (line.back() == ',' || line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty() || line == "[" || line == "]") continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) {
      ++unreadable;
      continue;
    }
    if (j.value("ph", "") != "X" || j.value("tid", -1) != 0) continue;
    spans.push_back({j.value("name", ""), j.value("ts", 0.0), j.value("dur", 0.0)});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.ts < b.ts; });
  return spans;
}

struct StepOfRank {
  int64_t step = 0;
  double startUs = 0, ms = 0;
  std::map<std::string, double> phasesMs;
};

// Steps from the training thread's spans: a step runs from its first span
// after the previous step's optimizer to the end of its own optimizer,
// evaluations taken out (a checkpoint's blocking stays in: training waited).
std::vector<StepOfRank> stepsOf(const std::vector<Span>& spans, int64_t firstStep,
                                std::vector<XY>* checkpointBlocked) {
  std::vector<StepOfRank> steps;
  StepOfRank current;
  bool open = false;
  double evalUs = 0;
  for (const Span& s : spans) {
    if (s.name == "evaluation") {
      if (open) evalUs += s.dur;
      continue;
    }
    if (s.name == "checkpoint (training blocked)" && checkpointBlocked != nullptr) {
      checkpointBlocked->push_back({double(firstStep + int64_t(steps.size()) - 1), s.dur / 1000});
    }
    if (!open) {
      current = StepOfRank{};
      current.startUs = s.ts;
      evalUs = 0;
      open = true;
    }
    // Nested spans (a bucket's allreduce inside backward) are not phases.
    if (s.name.find("bucket") == std::string::npos && s.name.find("shared memory") == std::string::npos) {
      current.phasesMs[s.name] += s.dur / 1000;
    }
    if (s.name == "optimizer") {
      current.step = firstStep + int64_t(steps.size());
      current.ms = std::max(0.0, (s.ts + s.dur - current.startUs - evalUs) / 1000);
      steps.push_back(current);
      open = false;
    }
  }
  return steps;
}

std::string describePhases(const std::map<std::string, double>& phases) {
  static const char* kOrder[] = {"data wait", "forward", "loss", "backward", "gradient exchange (wait)", "optimizer",
                                 "checkpoint (training blocked)"};
  std::string out;
  for (const char* name : kOrder) {
    const auto it = phases.find(name);
    if (it == phases.end() || it->second < 0.05) continue;
    out += fmt::format("{}{} {:.1f} ms", out.empty() ? "" : ", ", name, it->second);
  }
  // Then any other span of the training thread (a pipeline's waits, ZeRO's gathers), by name.
  for (const auto& phase : phases) {
    const std::string& name = phase.first;
    const bool known = std::any_of(std::begin(kOrder), std::end(kOrder), [&name](const char* k) { return name == k; });
    if (known || phase.second < 0.05) continue;
    out += fmt::format("{}{} {:.1f} ms", out.empty() ? "" : ", ", name, phase.second);
  }
  return out;
}

// Protobuf's wire format, as much of it as a scalar Event needs
// (monitor/tensorboard.cc writes it).
struct Wire {
  const unsigned char* p;
  const unsigned char* end;
  bool ok = true;

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p >= end) break;
      const unsigned char b = *p++;
      v |= uint64_t(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return v;
    }
    ok = false;
    return 0;
  }
  template <typename T>
  T fixed() {
    T v{};
    if (end - p < static_cast<std::ptrdiff_t>(sizeof(T))) {
      ok = false;
      p = end;
      return v;
    }
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return v;
  }
  Wire sub() {
    const uint64_t n = varint();
    if (!ok || n > uint64_t(end - p)) {
      ok = false;
      p = end;
      return {end, end, false};
    }
    Wire w{p, p + n};
    p += n;
    return w;
  }
  void skip(uint32_t type) {
    if (type == 0) {
      varint();
    } else if (type == 1) {
      fixed<uint64_t>();
    } else if (type == 2) {
      sub();
    } else if (type == 5) {
      fixed<uint32_t>();
    } else {
      ok = false;
      p = end;
    }
  }
};

// The value of `tag` in one Event, if it holds it.
std::optional<XY> scalarOfEvent(Wire event, const std::string& tag) {
  int64_t step = 0;
  std::optional<double> value;
  while (event.ok && event.p < event.end) {
    const uint64_t key = event.varint();
    const uint32_t field = uint32_t(key >> 3), type = uint32_t(key & 7);
    if (field == 2 && type == 0) {
      step = static_cast<int64_t>(event.varint());
    } else if (field == 5 && type == 2) {
      Wire summary = event.sub();
      while (summary.ok && summary.p < summary.end) {
        const uint64_t k = summary.varint();
        if ((k >> 3) != 1 || (k & 7) != 2) {
          summary.skip(uint32_t(k & 7));
          continue;
        }
        Wire v = summary.sub();
        std::string name;
        std::optional<float> simple;
        while (v.ok && v.p < v.end) {
          const uint64_t vk = v.varint();
          if ((vk >> 3) == 1 && (vk & 7) == 2) {
            Wire s = v.sub();
            name.assign(reinterpret_cast<const char*>(s.p), size_t(s.end - s.p));
          } else if ((vk >> 3) == 2 && (vk & 7) == 5) {
            simple = v.fixed<float>();
          } else {
            v.skip(uint32_t(vk & 7));
          }
        }
        if (name == tag && simple) value = *simple;
      }
    } else {
      event.skip(type);
    }
  }
  if (!event.ok || !value) return std::nullopt;
  return XY{double(step), *value};
}

}  // namespace

std::vector<XY> readTensorBoardScalars(const std::string& path, const std::string& tag) {
  std::vector<XY> out;
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string bytes = buffer.str();
  size_t at = 0;
  // Each record: length (8), its CRC (4), the Event, its CRC (4).
  while (at + 12 <= bytes.size()) {
    uint64_t length = 0;
    std::memcpy(&length, bytes.data() + at, 8);
    if (length > bytes.size() - at - 12 || bytes.size() - at - 12 - length < 4) break;  // torn
    const auto* data = reinterpret_cast<const unsigned char*>(bytes.data() + at + 12);
    if (const auto v = scalarOfEvent(Wire{data, data + length}, tag)) out.push_back(*v);
    at += 12 + length + 4;
  }
  return out;
}

void readTimelines(RunData& run) {
  std::error_code ec;
  const int64_t firstStep = run.resumes.empty() ? 1 : run.resumes.back().value("step", int64_t{0}) + 1;
  double samplesPerStep = double(run.samplesPerRankStep);
  if (run.summary && run.summary->contains("global_batch") && (*run.summary)["global_batch"].is_number() &&
      run.worldSize > 0) {
    samplesPerStep = (*run.summary)["global_batch"].get<double>() / run.worldSize;
  }
  std::vector<SlowStep> all;
  int files = 0;
  for (const auto& e : fs::directory_iterator(run.dir + "/timeline", ec)) {
    int rank = -1;
    if (std::sscanf(e.path().filename().c_str(), "rank-%d.json", &rank) != 1 || rank < 0) continue;
    ++run.timelineFiles;
    int64_t unreadable = 0;
    const auto spans = trainingSpans(e.path().string(), unreadable);
    if (unreadable > 1) run.warnings.push_back(fmt::format("{}: {} lines unreadable", e.path().string(), unreadable));
    const auto steps = stepsOf(spans, firstStep, rank == 0 ? &run.checkpointBlockedMs : nullptr);
    if (rank == 0 && !run.checkpointBlockedMs.empty()) {
      run.checkpointSource = "timeline/rank-0.json: \"checkpoint (training blocked)\"";
    }
    if (steps.empty()) continue;
    ++files;
    double totalMs = 0, waitMs = 0;
    std::vector<double> ms;
    for (const auto& s : steps) {
      totalMs += s.ms;
      ms.push_back(s.ms);
      run.stepMs.push_back(s.ms);
      const auto w = s.phasesMs.find("data wait");
      if (w != s.phasesMs.end()) waitMs += w->second;
      all.push_back({rank, s.step, s.ms, s.startUs / 1e6, describePhases(s.phasesMs)});
    }
    RankFigures& f = run.ranks[rank];
    f.steps = int64_t(steps.size());
    f.medianStepMs = medianOf(ms);
    if (totalMs > 0) {
      f.stepsPerS = 1000.0 * double(steps.size()) / totalMs;
      f.dataWaitFrac = waitMs / totalMs;
      if (samplesPerStep > 0) f.samplesPerS = f.stepsPerS * samplesPerStep;
    }
  }
  if (files == 0) return;
  std::sort(all.begin(), all.end(), [](const SlowStep& a, const SlowStep& b) { return a.ms > b.ms; });
  if (all.size() > 10) all.resize(10);
  run.slowest = std::move(all);
  run.stepSource = fmt::format("timeline/rank-<r>.json of {} rank(s): each step from its first span to the end of "
                               "its optimizer, evaluations left out",
                               files);
  if (!run.resumes.empty()) {
    run.stepSource += fmt::format("; steps from {} on only: a restart begins the timeline again", firstStep);
  }
  run.rankSource = samplesPerStep > 0
                       ? fmt::format("timeline/rank-<r>.json: steps per second x {} samples per rank and step",
                                     formatNumber(samplesPerStep))
                       : "timeline/rank-<r>.json: steps per second (samples per step not known)";
}

void readCheckpointScalars(RunData& run) {
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(run.dir + "/tensorboard", ec)) {
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(e.path().string());
  }
  // Named by Unix seconds first: in name order, a resumed run's file comes
  // after the one it continues, and its value of a repeated step wins.
  std::sort(files.begin(), files.end());
  std::map<double, double> byStep;
  for (const auto& f : files) {
    for (const auto& [step, ms] : readTensorBoardScalars(f, "checkpoint/blocked_ms")) byStep[step] = ms;
  }
  if (byStep.empty()) return;
  run.checkpointBlockedMs.assign(byStep.begin(), byStep.end());
  run.checkpointSource = "tensorboard/: checkpoint/blocked_ms";
}

void readOperators(RunData& run) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run.dir + "/profile", ec)) {
    int rank = -1;
    if (std::sscanf(e.path().filename().c_str(), "operators-rank-%d.json", &rank) != 1 || rank < 0) continue;
    std::ifstream in(e.path());
    const auto j = nlohmann::json::parse(in, nullptr, false);
    try {
      if (!j.is_object()) throw std::runtime_error("not a JSON object");
      RankOperators r;
      r.rank = j.value("rank", rank);
      if (j.contains("steps") && j["steps"].is_array() && j["steps"].size() == 2) {
        r.firstStep = j["steps"][0].get<int64_t>();
        r.lastStep = j["steps"][1].get<int64_t>();
      }
      for (const auto& o : j.at("operators")) {
        OperatorRow op;
        op.name = o.at("name").get<std::string>();
        op.calls = o.value("calls", int64_t{0});
        op.selfUs = o.value("self_us", 0.0);
        op.totalUs = o.value("total_us", 0.0);
        if (o.contains("input_shapes") && o["input_shapes"].is_string()) {
          op.inputShapes = o["input_shapes"].get<std::string>();
        }
        if (o.contains("flops") && o["flops"].is_number()) op.flops = o["flops"].get<double>();
        r.operators.push_back(std::move(op));
      }
      std::stable_sort(r.operators.begin(), r.operators.end(),
                       [](const OperatorRow& a, const OperatorRow& b) { return a.selfUs > b.selfUs; });
      run.operators.push_back(std::move(r));
    } catch (const std::exception& ex) {
      run.warnings.push_back(fmt::format("{}: not an operator table ({})", e.path().string(), ex.what()));
    }
  }
  std::sort(run.operators.begin(), run.operators.end(),
            [](const RankOperators& a, const RankOperators& b) { return a.rank < b.rank; });
}

}  // namespace cohort::monitor::detail
