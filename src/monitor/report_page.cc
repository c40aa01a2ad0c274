// The report page (monitor/report.h): one HTML file, its style inline, its
// plots inline SVG, nothing fetched. Each section says where its figures
// come from, or why it is empty.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>

#include "monitor/detail/report.h"

namespace cohort::monitor::detail {
namespace {

const char* const kStyle = R"(
body { font: 14px/1.45 -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif; margin: 0;
       color: #1d2329; background: #f4f6f8; }
header { background: #1d2b3a; color: #fff; padding: 14px 24px; }
header h1 { margin: 0; font-size: 20px; }
header .dir { color: #b8c6d4; font-family: monospace; font-size: 12px; }
main { padding: 8px 20px 32px; max-width: 1900px; }
section { background: #fff; border: 1px solid #dde3ea; border-radius: 6px; margin: 14px 0; padding: 8px 16px 12px; }
section h2 { font-size: 16px; margin: 6px 0 4px; }
.source { color: #5d6b78; font-size: 12px; margin: 0 0 6px; }
.missing { color: #8a5a00; font-size: 13px; }
.plots { display: flex; flex-wrap: wrap; gap: 10px; }
.banner { padding: 10px 14px; border-radius: 6px; margin: 14px 0 0; font-weight: 600; }
.banner.completed { background: #e3f4e8; color: #1e6b37; }
.banner.other { background: #fff1d6; color: #7a4d00; }
.banner.failed { background: #fde2e0; color: #9c2418; }
table { border-collapse: collapse; font-size: 13px; margin: 6px 0; }
th, td { border-bottom: 1px solid #e6eaef; padding: 3px 10px 3px 0; text-align: left; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.kv td:first-child { color: #5d6b78; }
svg.plot { border: 1px solid #e6eaef; border-radius: 4px; }
svg .title { font-size: 13px; font-weight: 600; fill: #1d2329; }
svg .tick, svg .legend, svg .value { font-size: 11px; fill: #4a5560; }
svg .label { font-size: 12px; fill: #33404c; }
svg .mlabel { font-size: 10px; }
svg .grid { stroke: #edf0f3; stroke-width: 1; }
svg .axis { stroke: #8795a1; stroke-width: 1; }
)";

double num(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return NAN;
  return j[key].get<double>();
}

std::vector<XY> seriesOf(const std::vector<nlohmann::json>& records, const char* key) {
  std::vector<XY> out;
  for (const auto& r : records) {
    const double y = num(r, key);
    if (std::isfinite(y)) out.push_back({num(r, "step"), y});
  }
  return out;
}

std::string utcText(double unixSeconds) {
  const std::time_t t = static_cast<std::time_t>(unixSeconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

class PageBuilder {
 public:
  explicit PageBuilder(const RunData& run) : run_(run) {}

  Page build() {
    header();
    training();
    perRank();
    stepTimes();
    memory();
    checkpoints();
    events();
    plan();
    operators();
    page_.html = fmt::format(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{} - cohort report</title>\n"
        "<style>{}</style>\n</head>\n<body>\n<header><h1>{}</h1><div class=\"dir\">{}</div></header>\n<main>\n{}"
        "</main>\n</body>\n</html>\n",
        escapeHtml(run_.job), kStyle, escapeHtml(run_.job), escapeHtml(run_.dir), body_);
    return std::move(page_);
  }

 private:
  void section(const std::string& id, const std::string& title, const std::string& source, const std::string& inner) {
    body_ += fmt::format("<section id=\"{}\">\n<h2>{}</h2>\n", id, escapeHtml(title));
    if (!source.empty()) body_ += fmt::format("<p class=\"source\">from {}</p>\n", escapeHtml(source));
    body_ += inner + "</section>\n";
  }
  // A section with nothing to draw says why.
  void missing(const std::string& id, const std::string& title, const std::string& why) {
    page_.missing.push_back(title + ": " + why);
    section(id, title, "", fmt::format("<p class=\"missing\">{}</p>\n", escapeHtml(why)));
  }
  std::string plot(const std::string& svg, const std::string& id) {
    page_.plots.push_back(id);
    return svg;
  }

  void header() {
    const bool completed = run_.state == "completed";
    const char* cls = completed ? "completed" : (run_.state == "failed" || run_.state == "ended") ? "failed" : "other";
    body_ += fmt::format("<div class=\"banner {}\" id=\"state\" data-state=\"{}\">State: {}{}</div>\n", cls,
                         run_.state, escapeHtml(run_.state),
                         run_.stateNote.empty() ? "" : " &mdash; " + escapeHtml(run_.stateNote));
    std::string rows;
    auto row = [&rows](const std::string& k, const std::string& v) {
      rows += fmt::format("<tr><td>{}</td><td>{}</td></tr>\n", escapeHtml(k), escapeHtml(v));
    };
    if (run_.worldSize > 0) row("ranks", std::to_string(run_.worldSize));
    if (!run_.train.empty()) {
      const auto& last = run_.train.back();
      row("last train record", fmt::format("step {}, epoch {}, loss {}", formatNumber(num(last, "step")),
                                           formatNumber(num(last, "epoch")), formatNumber(num(last, "loss"))));
    }
    if (run_.summary) {
      const auto& s = *run_.summary;
      if (s.contains("steps")) row("steps", formatNumber(num(s, "steps")));
      if (s.contains("wall_time_s")) row("wall time", formatNumber(num(s, "wall_time_s")) + " s");
      if (s.contains("train_images_per_s")) row("samples per second", formatNumber(num(s, "train_images_per_s")));
      if (s.contains("data_wait_frac")) row("data wait", fmt::format("{:.2f}%", 100 * num(s, "data_wait_frac")));
      if (s.contains("best_top1")) row("best top-1", formatNumber(num(s, "best_top1")));
      if (s.contains("restart_count")) row("restarts", formatNumber(num(s, "restart_count")));
      if (s.contains("peak_rss_mb")) row("peak memory of rank 0", formatNumber(num(s, "peak_rss_mb")) + " MB");
    }
    if (!run_.eval.empty()) {
      const auto& e = run_.eval.back();
      row("last evaluation", fmt::format("step {}: top-1 {}, loss {}", formatNumber(num(e, "step")),
                                         formatNumber(num(e, "top1")), formatNumber(num(e, "loss"))));
    }
    if (run_.tornLines > 0) row("metrics.jsonl", fmt::format("{} torn line(s) left out", run_.tornLines));
    for (const auto& w : run_.warnings) row("not read", w);
    section("overview", "Overview", run_.summary ? "summary.json, metrics.jsonl" : "metrics.jsonl (no summary.json)",
            "<table class=\"kv\">\n" + rows + "</table>\n");
  }

  void training() {
    if (run_.train.empty() && run_.eval.empty()) {
      missing("training", "Training and evaluation", "metrics.jsonl holds no train or eval record yet");
      return;
    }
    std::string inner = "<div class=\"plots\">\n";
    auto lines = [&](const char* id, const char* title, const char* y, const std::vector<nlohmann::json>& records,
                     const char* key) {
      const auto points = seriesOf(records, key);
      if (points.empty()) return;
      inner += plot(drawLines({id, title, "step", y, {{key, points}}, {}}), id);
    };
    lines("plot-loss", "Training loss", "loss", run_.train, "loss");
    lines("plot-lr", "Learning rate", "lr", run_.train, "lr");
    lines("plot-throughput", "Throughput (all ranks)", "samples/s", run_.train, "images_per_s");
    lines("plot-data-wait", "Data wait (share of the time)", "fraction", run_.train, "data_wait_frac");
    lines("plot-eval-top1", "Evaluation top-1", "top-1", run_.eval, "top1");
    lines("plot-eval-loss", "Evaluation loss", "loss", run_.eval, "loss");
    section("training", "Training and evaluation",
            fmt::format("metrics.jsonl: {} train and {} eval records", run_.train.size(), run_.eval.size()),
            inner + "</div>\n");
  }

  void perRank() {
    BarChart rate{"plot-rank-throughput", "Throughput per rank", "samples/s", {}, {}};
    BarChart wait{"plot-rank-data-wait", "Data wait per rank (share of step time)", "fraction", {}, {}};
    bool samples = false;
    for (const auto& [rank, f] : run_.ranks) samples = samples || f.samplesPerS >= 0;
    if (!samples) rate.yLabel = "steps/s";
    std::string rows;
    for (const auto& [rank, f] : run_.ranks) {
      const double r = samples ? f.samplesPerS : f.stepsPerS;
      if (r >= 0) rate.bars.push_back({"rank " + std::to_string(rank), {r}});
      if (f.dataWaitFrac >= 0) wait.bars.push_back({"rank " + std::to_string(rank), {f.dataWaitFrac}});
      if (r < 0 && f.dataWaitFrac < 0) continue;
      rows += fmt::format("<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>"
                          "<td class=\"num\">{}</td></tr>\n",
                          rank, f.steps > 0 ? std::to_string(f.steps) : "-", formatNumber(r),
                          f.dataWaitFrac >= 0 ? fmt::format("{:.2f}%", 100 * f.dataWaitFrac) : "-",
                          f.medianStepMs >= 0 ? formatNumber(f.medianStepMs) : "-");
    }
    if (rate.bars.empty() && wait.bars.empty()) {
      missing("ranks", "Throughput and data wait per rank",
              run_.timelineFiles > 0
                  ? "no per-rank figures yet: the timelines hold no complete step (a rank writes its events every "
                    "second)"
                  : "no per-rank figures: run with --timeline (timeline/rank-<r>.json), or the ranks' epoch lines in "
                    "logs/rank-<r>.log once an epoch ends");
      return;
    }
    std::string inner = "<div class=\"plots\">\n";
    if (!rate.bars.empty()) inner += plot(drawBars(rate), rate.id);
    if (!wait.bars.empty()) inner += plot(drawBars(wait), wait.id);
    inner += "</div>\n";
    if (wait.bars.empty()) inner += "<p class=\"missing\">data wait per rank needs --timeline</p>\n";
    inner += fmt::format("<table><tr><th>rank</th><th class=\"num\">steps</th><th class=\"num\">{}</th>"
                         "<th class=\"num\">data wait</th><th class=\"num\">median step (ms)</th></tr>\n{}</table>\n",
                         rate.yLabel, rows);
    section("ranks", "Throughput and data wait per rank", run_.rankSource, inner);
  }

  void stepTimes() {
    if (run_.stepMs.empty()) {
      missing("steps", "Step times", "no step timed: no timeline and fewer than two train records");
      return;
    }
    const int bins = std::clamp(int(std::sqrt(double(run_.stepMs.size()))) + 1, 5, 40);
    std::string inner = plot(drawHistogram("plot-step-times", fmt::format("Step times ({} steps)", run_.stepMs.size()),
                                           "ms per step", run_.stepMs, bins),
                             "plot-step-times");
    std::string rows;
    for (const auto& s : run_.slowest) {
      rows += fmt::format("<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{:.1f}</td><td>{}</td>"
                          "<td>{}</td></tr>\n",
                          s.rank >= 0 ? std::to_string(s.rank) : "all", s.step, s.ms, utcText(s.start),
                          escapeHtml(s.phases));
    }
    inner += "<h3>Slowest steps</h3>\n<table id=\"slowest\"><tr><th>rank</th><th class=\"num\">step</th>"
             "<th class=\"num\">ms</th><th>started</th><th>where the time went</th></tr>\n" +
             rows + "</table>\n";
    section("steps", "Step times", run_.stepSource, inner);
  }

  void memory() {
    BarChart c{"plot-rank-memory", "Peak resident memory per rank", "MB", {}, {}};
    for (const auto& [rank, f] : run_.ranks) {
      if (f.peakRssMb >= 0) c.bars.push_back({"rank " + std::to_string(rank), {f.peakRssMb}});
    }
    if (c.bars.empty()) {
      missing("memory", "Memory per rank",
              "no figure yet: summary.json's peak_rss_mb_per_rank and the ranks' \"memory held\" lines are written "
              "when training ends");
      return;
    }
    section("memory", "Memory per rank", run_.memorySource, plot(drawBars(c), c.id));
  }

  void checkpoints() {
    if (run_.checkpointBlockedMs.empty()) {
      missing("checkpoints", "Checkpoint blocking", "no checkpoint was taken (or none recorded)");
      return;
    }
    double total = 0, most = 0;
    for (const auto& [step, ms] : run_.checkpointBlockedMs) {
      total += ms;
      most = std::max(most, ms);
    }
    std::string inner = plot(drawLines({"plot-checkpoint", "Training blocked by each checkpoint", "step", "ms",
                                        {{"blocked_ms", run_.checkpointBlockedMs}}, {}}),
                             "plot-checkpoint");
    inner += fmt::format("<p>{} checkpoints, blocked {:.1f} ms in all, {:.1f} ms at most.</p>\n",
                         run_.checkpointBlockedMs.size(), total, most);
    section("checkpoints", "Checkpoint blocking", run_.checkpointSource, inner);
  }

  void events() {
    double start = INFINITY;
    for (const auto& e : run_.events) start = std::min(start, e.time);
    for (const auto& t : run_.train) start = std::min(start, num(t, "time"));
    if (!std::isfinite(start)) {
      missing("events", "Restarts and elastic events", "no event and no timed record");
      return;
    }
    LineChart c{"plot-events", "Progress, restarts and elastic events", "seconds since " + utcText(start), "step",
                {}, {}};
    std::vector<XY> progress;
    for (const auto& t : run_.train) progress.push_back({num(t, "time") - start, num(t, "step")});
    c.series.push_back({"step", progress});
    std::string rows;
    for (const auto& e : run_.events) {
      c.markers.push_back({e.time - start, e.text, e.kind});
      rows += fmt::format("<tr><td class=\"num\">{:.1f}</td><td>{}</td><td>{}</td></tr>\n", e.time - start,
                          escapeHtml(e.kind), escapeHtml(e.text));
    }
    std::string inner = plot(drawLines(c), c.id);
    inner += "<table id=\"events\"><tr><th class=\"num\">s</th><th>event</th><th>what</th></tr>\n" + rows +
             "</table>\n";
    section("events", "Restarts and elastic events",
            "metrics.jsonl (train and resume records), logs/launcher.log, events/agent-*.jsonl", inner);
  }

  void plan() {
    if (run_.plan.empty()) {
      missing("plan", "The plan against the run",
              run_.planNote.empty() ? "no plan: `cohort plan` did not plan this job (or pass --plan FILE, the output "
                                      "of `cohort plan --json`)"
                                    : run_.planNote);
      return;
    }
    BarChart c{"plot-plan", "Predicted and measured (measured / predicted)", "ratio", {"predicted", "measured"}, {}};
    std::string rows;
    for (const auto& r : run_.plan) {
      // Figures of different units share one axis as ratios to the prediction.
      c.bars.push_back({r.what, {1.0, r.measured >= 0 && r.predicted > 0 ? r.measured / r.predicted : -1}});
      rows += fmt::format("<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>"
                          "</tr>\n",
                          escapeHtml(r.what), formatNumber(r.predicted),
                          r.measured >= 0 ? formatNumber(r.measured) : "-",
                          r.measured > 0 ? fmt::format("{:+.1f}%", 100 * (r.predicted - r.measured) / r.measured)
                                         : "-");
    }
    std::string inner = plot(drawBars(c), c.id);
    inner += "<table id=\"plan-table\"><tr><th>figure</th><th class=\"num\">predicted</th><th class=\"num\">measured"
             "</th><th class=\"num\">error (predicted - measured) / measured</th></tr>\n" +
             rows + "</table>\n";
    section("plan", "The plan against the run", run_.planSource, inner);
  }

  void operators() {
    if (run_.operators.empty()) {
      missing("operators", "Operators", "the run was not profiled (no profile/operators-rank-<r>.json)");
      return;
    }
    std::string inner;
    for (const auto& r : run_.operators) {
      BarChart c{fmt::format("plot-operators-rank-{}", r.rank), fmt::format("Self time of rank {}'s operators", r.rank),
                 "ms", {}, {}};
      for (size_t i = 0; i < r.operators.size() && i < 8; ++i) {
        std::string name = r.operators[i].name;
        if (name.rfind("aten::", 0) == 0) name = name.substr(6);
        if (name.size() > 16) name = name.substr(0, 15) + "\u2026";
        c.bars.push_back({name, {r.operators[i].selfUs / 1000}});
      }
      inner += plot(drawBars(c), c.id);
      inner += fmt::format("<table class=\"operators\" data-rank=\"{}\"><caption>rank {}, steps {} to {}</caption>"
                           "<tr><th>operator</th><th class=\"num\">calls</th><th class=\"num\">self (ms)</th>"
                           "<th class=\"num\">total (ms)</th><th class=\"num\">GFLOP</th><th>input shapes</th></tr>\n",
                           r.rank, r.rank, r.firstStep, r.lastStep);
      for (const auto& o : r.operators) {
        inner += fmt::format("<tr class=\"op\"><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{:.3f}</td>"
                             "<td class=\"num\">{:.3f}</td><td class=\"num\">{}</td><td>{}</td></tr>\n",
                             escapeHtml(o.name), o.calls, o.selfUs / 1000, o.totalUs / 1000,
                             o.flops >= 0 ? formatNumber(o.flops / 1e9) : "-", escapeHtml(o.inputShapes));
      }
      inner += "</table>\n";
    }
    section("operators", "Operators", "profile/operators-rank-<r>.json (cohort run --profile)", inner);
  }

  const RunData& run_;
  Page page_;
  std::string body_;
};

}  // namespace

Page renderPage(const RunData& run) { return PageBuilder(run).build(); }

}  // namespace cohort::monitor::detail
