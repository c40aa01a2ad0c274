#pragma once

// The report page's parts (monitor/report.h): what is read from a run
// (report_read.cc: records, summary, logs, events, the plan;
// report_traces.cc: timelines, TensorBoard scalars, operator tables), how a
// plot is drawn (report_svg.cc) and the page (report_page.cc).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/monitor/profiler.h"

namespace cohort::monitor::detail {

using XY = std::pair<double, double>;

// Something that happened to the run, on the wall clock.
struct RunEvent {
  double time = 0;   // Unix seconds
  std::string kind;  // start, failure, restart, stop, resume, round, reform, leave, ...
  std::string text;
};

// What one rank did, from its timeline or its log.
struct RankFigures {
  int64_t steps = 0;
  double samplesPerS = -1;   // -1: not known
  double stepsPerS = -1;
  double dataWaitFrac = -1;
  double peakRssMb = -1;
  double medianStepMs = -1;
};

struct SlowStep {
  int rank = 0;
  int64_t step = 0;
  double ms = 0;
  double start = 0;  // Unix seconds
  std::string phases;  // "data wait 3.1 ms, forward 20.4 ms, ..."
};

struct PlanRow {
  std::string what;  // "peak memory (MB)", ...
  double predicted = 0;
  double measured = -1;  // -1: not measured
};

struct RankOperators {
  int rank = 0;
  int64_t firstStep = 0, lastStep = 0;
  std::vector<OperatorRow> operators;  // sorted by self time
};

// Everything the page shows; a source string says where each part came from.
struct RunData {
  std::string dir;
  std::string job;
  std::string state;      // completed, stopped, running, failed, ended, started
  std::string stateNote;
  std::optional<nlohmann::json> summary;
  std::vector<nlohmann::json> train, eval, resumes, notices;  // metrics.jsonl by event
  int64_t tornLines = 0;  // metrics.jsonl lines that were not JSON (a line cut by a kill)
  int worldSize = 0;      // 0: not known
  int64_t samplesPerRankStep = 0;  // micro-batch x accumulation; 0: not known

  std::vector<RunEvent> events;

  std::map<int, RankFigures> ranks;
  std::string rankSource, memorySource;

  int timelineFiles = 0;         // timeline/rank-<r>.json files, complete steps or not
  std::vector<double> stepMs;    // every step of every rank
  std::string stepSource;
  std::vector<SlowStep> slowest;

  std::vector<XY> checkpointBlockedMs;  // (step, ms)
  std::string checkpointSource;

  std::vector<PlanRow> plan;
  std::string planSource, planNote;

  std::vector<RankOperators> operators;
  std::vector<std::string> warnings;  // files that were there but unreadable
};

// A run directory: job.yaml, logs/ or metrics.jsonl in it.
bool isRunDir(const std::string& dir);

// report_read.cc. Throws DataError for a planFile that is not a plan.
RunData readRun(const std::string& dir, const std::string& planFile);
// Lines of `text` "YYYY-MM-DD HH:MM:SS.mmm" (local time, as the logs are
// written) to Unix seconds; nullopt when it is not one.
std::optional<double> logLineTime(const std::string& line);

// report_traces.cc: fills ranks/step times/checkpoints from the timelines,
// checkpoint blocking from TensorBoard, and the operator tables.
void readTimelines(RunData& run);
void readCheckpointScalars(RunData& run);
void readOperators(RunData& run);
// The scalars of one TensorBoard event file with `tag`: (step, value); a
// torn or corrupt tail ends the file.
std::vector<XY> readTensorBoardScalars(const std::string& path, const std::string& tag);

// report_svg.cc
struct Series {
  std::string name;
  std::vector<XY> points;
};
struct Marker {
  double x = 0;
  std::string label;
  std::string kind;  // colours the line
};
struct LineChart {
  std::string id, title, xLabel, yLabel;
  std::vector<Series> series;
  std::vector<Marker> markers;
};
struct Bar {
  std::string label;
  std::vector<double> values;  // one per group (predicted, measured); < 0: none
};
struct BarChart {
  std::string id, title, yLabel;
  std::vector<std::string> groups;  // names of the values of each bar
  std::vector<Bar> bars;
};
std::string drawLines(const LineChart& chart);
std::string drawBars(const BarChart& chart);
// A histogram of `values` in `bins` equal bins.
std::string drawHistogram(const std::string& id, const std::string& title, const std::string& xLabel,
                          const std::vector<double>& values, int bins);
std::string escapeHtml(const std::string& s);
std::string formatNumber(double v);

// report_page.cc
struct Page {
  std::string html;
  std::vector<std::string> plots, missing;
};
Page renderPage(const RunData& run);

// The median of v; -1 when it is empty.
double medianOf(std::vector<double> v);

}  // namespace cohort::monitor::detail
