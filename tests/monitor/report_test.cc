// `cohort report`: the page of small run directories written here, as a
// completed run, a crashed one, a running one, and directories that are not
// runs (exit 2). The page's plots are counted against the records written.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>

#include "cohort/core/error.h"
#include "cohort/monitor/report.h"
#include "cohort/monitor/tensorboard.h"
#include "monitor/report_util.h"
#include "util/jobs.h"
#include "util/process.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;

constexpr double kStart = 1795295984.0;  // Unix seconds of the first record

bool pageHas(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// A log line's time as the logger writes it: local time.
std::string logTime(double unixSeconds) {
  const std::time_t t = static_cast<std::time_t>(unixSeconds);
  std::tm tm{};
  localtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S", &tm);
  return fmt::format("{}.{:03d}", text, int((unixSeconds - double(t)) * 1000));
}

void appendText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::app | std::ios::binary);
  out << text;
}

// One rank's timeline of `steps` steps: data wait, forward, backward,
// optimizer; step k takes 10 + k ms (rank 1: twice as long), and a
// checkpoint blocks after step 2 (rank 0).
void writeTimeline(const std::string& path, int rank, int steps, bool close) {
  std::string text = "[\n" + fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"args":{{"name":"rank {}"}}}})",
                                         rank, rank);
  double ts = kStart * 1e6;
  auto span = [&](const char* name, double us, int tid = 0) {
    text += fmt::format(",\n{{\"name\":\"{}\",\"cat\":\"c\",\"ph\":\"X\",\"ts\":{:.0f},\"dur\":{:.0f},\"pid\":{},"
                        "\"tid\":{}}}",
                        name, ts, us, rank, tid);
    ts += us;
  };
  for (int k = 1; k <= steps; ++k) {
    const double ms = (10.0 + k) * (rank + 1);
    span("data wait", 1000 * ms * 0.1);
    span("forward", 1000 * ms * 0.3);
    span("backward", 1000 * ms * 0.4);
    span("optimizer", 1000 * ms * 0.2);
    if (k == 2 && rank == 0) span("checkpoint (training blocked)", 1500);
    if (k == 2) span("checkpoint write", 5000, 3);  // another thread: not a step
  }
  text += close ? "\n]\n" : ",\n{\"name\":\"forw";  // a crashed rank: unterminated, torn
  test::writeText(path, text);
}

struct RunFixture {
  test::TempDir dir;
  int trains = 6, evals = 2;

  std::string path(const std::string& p) const { return dir.file(p); }

  void writeCommon(bool completed) {
    test::writeText(path("job.yaml"), "name: fixture\ntraining:\n  batch_size: 8\n  accumulate_steps: 1\n"
                                      "distribution:\n  nodes: 1\n  procs_per_node: 2\n");
    std::string metrics;
    for (int i = 1; i <= trains; ++i) {
      metrics += fmt::format(R"({{"event":"train","time":{},"step":{},"epoch":1,"loss":{},"lr":{},"images_per_s":{},)"
                             R"("data_wait_frac":{}}})"
                             "\n",
                             kStart + i, i * 2, 2.0 / i, 0.1 * i, 1000 + 10 * i, 0.01 * i);
      if (i == 3) {
        metrics += R"({"event":"straggler","step":6,"rank":1,"compute_ms_per_step":30,"median_ms_per_step":12})"
                   "\n";
      }
    }
    for (int i = 1; i <= evals; ++i) {
      metrics += fmt::format(R"({{"event":"eval","time":{},"step":{},"epoch":{},"top1":{},"top5":0.99,"loss":{},)"
                             R"("samples":64,"seconds":0.5}})"
                             "\n",
                             kStart + 3 * i, 6 * i, i, 0.5 + 0.1 * i, 1.0 / i);
    }
    test::writeText(path("metrics.jsonl"), metrics);
    test::writeText(path("logs/launcher.log"),
                    logTime(kStart - 2) + " info [launcher] starting 2 ranks of job 'fixture'; run directory x\n");
    for (int r = 0; r < 2; ++r) {
      std::string log = logTime(kStart - 1) + fmt::format(" info [rank {}/2] cohort worker: rank {}/2 started\n", r, r);
      if (completed) {
        log += logTime(kStart + 7) +
               fmt::format(" info [rank {}/2] epoch 1/1: 12 steps in 1.5 s, loss 0.3000, {} img/s\n", r, 900 + 50 * r);
        log += logTime(kStart + 8) +
               fmt::format(" info [rank {}/2] memory held: parameters 0.1 MB, gradients 0.1 MB, optimizer state "
                           "0.1 MB (ZeRO stage 0); peak resident {} MB\n",
                           r, 200 + r);
      }
      test::writeText(path(fmt::format("logs/rank-{}.log", r)), log);
    }
  }
};

TEST(Report, ACompletedRunDrawsEveryPlotWithTheRecordsItHolds) {
  RunFixture f;
  f.writeCommon(true);
  test::writeText(f.path("summary.json"), R"({"job":"fixture","status":"completed","world_size":2,"steps":12,
    "global_batch":16,"wall_time_s":9.5,"train_images_per_s":1040,"peak_rss_mb":210,
    "peak_rss_mb_per_rank":[210,230],"restart_count":1,
    "plan":{"file":"p.json","predicted":{"peak_rss_mb":250,"samples_per_s":1200,"step_ms":14},
            "measured":{"peak_rss_mb":210,"samples_per_s":1040},"error_pct":{}}})");
  writeTimeline(f.path("timeline/rank-0.json"), 0, 5, true);
  writeTimeline(f.path("timeline/rank-1.json"), 1, 5, true);
  {
    monitor::TensorBoardWriter board(f.path("tensorboard"));
    board.addScalar("train/loss", 2, 1.0);
    board.addScalar("checkpoint/blocked_ms", 4, 1.5);
    board.addScalar("checkpoint/blocked_ms", 8, 2.5);
    board.addScalar("checkpoint/blocked_ms", 12, 0.5);
    board.flush();
  }
  appendText(f.path("metrics.jsonl"), R"({"event":"resume","step":0,"from":"x/step-0","restart_count":1})" "\n");
  test::writeText(f.path("events/agent-n0.jsonl"),
                  R"({"event":"round","round":1,"nodes":2,"time":"2026-11-21T21:19:45Z","node":"n0"})" "\n"
                  R"({"event":"reform","round":1,"cause":"node n1 left","time":"2026-11-21T21:19:47Z","node":"n0"})"
                  "\n");
  test::writeText(f.path("profile/operators-rank-0.json"),
                  R"({"rank":0,"steps":[3,5],"operators":[
      {"name":"aten::addmm","calls":30,"self_us":900.5,"total_us":1200,"input_shapes":"[[8,16],[16,4]]","flops":1e6},
      {"name":"aten::convolution_backward","calls":30,"self_us":1500,"total_us":1600,"input_shapes":"","flops":null},
      {"name":"aten::relu","calls":60,"self_us":50,"total_us":50,"input_shapes":"[[8,16]]","flops":null}]})");

  const auto r = monitor::writeReport({f.dir.path(), "", ""});
  EXPECT_EQ(r.path, fs::absolute(f.path("report.html")).lexically_normal().string());
  EXPECT_EQ(r.state, "completed");
  EXPECT_TRUE(r.missing.empty()) << r.missing.front();
  const std::string html = test::readText(r.path);
  EXPECT_FALSE(pageHas(html, "<script")) << "no script is needed";
  EXPECT_FALSE(pageHas(html, "http://") && !pageHas(html, "xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_FALSE(pageHas(html, "https://")) << "nothing is fetched";

  // One series per curve, one point per record.
  for (const auto& [id, n] : std::vector<std::pair<std::string, size_t>>{
           {"plot-loss", 6}, {"plot-lr", 6}, {"plot-throughput", 6}, {"plot-data-wait", 6},
           {"plot-eval-top1", 2}, {"plot-eval-loss", 2}, {"plot-checkpoint", 3}, {"plot-events", 6}}) {
    const std::string svg = test::svgOf(html, id);
    ASSERT_FALSE(svg.empty()) << id;
    EXPECT_EQ(test::polylinePoints(svg), std::vector<size_t>{n}) << id;
    EXPECT_EQ(test::countOf(svg, "<circle class=\"pt\""), n) << id;
  }
  // Markers: the launcher's start, the resume, the agent's round and re-form.
  EXPECT_EQ(test::countOf(test::svgOf(html, "plot-events"), "class=\"marker\""), 4u);
  EXPECT_TRUE(pageHas(html, "node n1 left"));
  // 5 steps on each of 2 ranks; the slowest is rank 1's last (2 x 15 ms).
  EXPECT_EQ(test::binTotal(test::svgOf(html, "plot-step-times")), 10);
  const std::string slowest = html.substr(html.find("<table id=\"slowest\""));
  EXPECT_TRUE(pageHas(slowest.substr(0, slowest.find("</tr>", slowest.find("</tr>") + 5)),
                  "<td>1</td><td class=\"num\">5</td><td class=\"num\">30.0</td>"))
      << slowest.substr(0, 600);
  // Per rank: throughput and data wait from the timelines (8 samples a step),
  // memory from summary.json.
  const std::string rate = test::svgOf(html, "plot-rank-throughput");
  EXPECT_EQ(test::countOf(rate, "class=\"bar\""), 2u);
  EXPECT_EQ(test::countOf(test::svgOf(html, "plot-rank-data-wait"), "class=\"bar\""), 2u);
  const auto values = test::attributes(test::svgOf(html, "plot-rank-memory"), "data-value");
  EXPECT_EQ(values, (std::vector<std::string>{"210", "230"}));
  EXPECT_GT(std::stod(test::attributes(rate, "data-value")[0]), std::stod(test::attributes(rate, "data-value")[1]));
  // Rank 0's checkpoint span is in its step: the steps' median stays, the plan
  // is the summary's.
  EXPECT_EQ(test::countOf(test::svgOf(html, "plot-plan"), "class=\"bar\""), 6u);
  EXPECT_TRUE(pageHas(html, "+19.0%")) << "peak memory: (250 - 210) / 210";
  // The operator table, by self time.
  EXPECT_EQ(test::countOf(html, "<tr class=\"op\">"), 3u);
  const std::string table = html.substr(html.find("<table class=\"operators\""));
  EXPECT_LT(table.find("aten::convolution_backward"), table.find("aten::addmm"));
  EXPECT_EQ(test::countOf(test::svgOf(html, "plot-operators-rank-0"), "class=\"bar\""), 3u);
  EXPECT_EQ(r.plots.size(), 14u);
}

TEST(Report, ACrashedRunShowsWhatItWroteAndSaysSo) {
  RunFixture f;
  f.trains = 4;
  f.evals = 0;
  f.writeCommon(false);
  appendText(f.path("metrics.jsonl"), R"({"event":"train","time":17952959)");  // torn by a kill
  appendText(f.path("logs/launcher.log"),
         logTime(kStart + 5) + " error [launcher] rank 1 (pid 42) was killed by signal 9 (SIGKILL); stopped the "
                               "other ranks. Its log: x\n");
  writeTimeline(f.path("timeline/rank-0.json"), 0, 3, false);
  const auto r = test::cohort({"report", f.dir.path(), "-o", f.path("page/crashed.html")});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_TRUE(pageHas(r.out, f.path("page/crashed.html"))) << r.out;
  EXPECT_TRUE(pageHas(r.out, "state: failed (no summary.json; the launcher's last word: rank 1")) << r.out;
  EXPECT_TRUE(pageHas(r.out, "not shown: Memory per rank")) << r.out;
  const std::string html = test::readText(f.path("page/crashed.html"));
  EXPECT_TRUE(pageHas(html, "data-state=\"failed\"")) << html.substr(0, 2000);
  EXPECT_EQ(test::polylinePoints(test::svgOf(html, "plot-loss")), std::vector<size_t>{4});
  EXPECT_TRUE(test::svgOf(html, "plot-eval-top1").empty());
  EXPECT_TRUE(pageHas(html, "1 torn line(s) left out"));
  // The unterminated timeline's complete steps.
  EXPECT_EQ(test::binTotal(test::svgOf(html, "plot-step-times")), 3);
  EXPECT_EQ(test::countOf(test::svgOf(html, "plot-events"), "data-kind=\"failure\""), 1u);
  EXPECT_FALSE(fs::exists(f.path("report.html")));
}

TEST(Report, ARunStillGoingIsDrawnAsFarAsItGot) {
  RunFixture f;
  f.trains = 3;
  f.evals = 0;
  f.writeCommon(false);  // its logs were just written
  const auto r = monitor::writeReport({f.dir.path(), "", ""});
  EXPECT_EQ(r.state, "running");
  EXPECT_TRUE(pageHas(r.stateNote, "still going")) << r.stateNote;
  const std::string html = test::readText(r.path);
  EXPECT_EQ(test::polylinePoints(test::svgOf(html, "plot-loss")), std::vector<size_t>{3});
  // No timeline: step times from the records, rank 0's view.
  EXPECT_EQ(test::binTotal(test::svgOf(html, "plot-step-times")), 2);
  EXPECT_TRUE(pageHas(html, "from metrics.jsonl: the mean step time between consecutive train records"));

  // Quiet for an hour and no summary: it ended without one.
  for (const auto& e : fs::directory_iterator(f.path("logs"))) {
    fs::last_write_time(e.path(), fs::file_time_type::clock::now() - std::chrono::hours(1));
  }
  EXPECT_EQ(monitor::writeReport({f.dir.path(), "", ""}).state, "ended");
}

TEST(Report, APlanFileIsComparedWithTheRun) {
  RunFixture f;
  f.writeCommon(true);
  test::writeText(f.path("plan.json"), R"({"predicted":{"setting":{"ranks":4},"memory_mb":{"peak":100},
      "speed":{"samples_per_s":500,"step_ms":20}},
    "by_nodes":[{"setting":{"ranks":2},"memory_mb":{"peak":190},"speed":{"samples_per_s":1000,"step_ms":12}}]})");
  const auto r = monitor::writeReport({f.dir.path(), "", ""});
  const std::string html = test::readText(r.path);
  // The setting of the run's 2 ranks; the memory measured from rank 0's log.
  EXPECT_TRUE(pageHas(html, "<td>peak memory of rank 0 (MB)</td><td class=\"num\">190</td><td class=\"num\">200</td>"))
      << html.substr(html.find("id=\"plan\""), 1500);
  EXPECT_TRUE(pageHas(html, "plan.json (the run&#39;s plan.json)"));

  const auto bad = test::cohort({"report", f.dir.path(), "--plan", f.path("job.yaml")});
  EXPECT_EQ(bad.exitCode, 2) << bad.describe();
  EXPECT_TRUE(pageHas(bad.err, f.path("job.yaml"))) << bad.err;
  const auto none = test::cohort({"report", f.dir.path(), "--plan", f.path("nowhere.json")});
  EXPECT_EQ(none.exitCode, 2) << none.describe();
  EXPECT_TRUE(pageHas(none.err, "nowhere.json: no such file")) << none.err;
}

TEST(Report, ADirectoryThatIsNotARunIsRefused) {
  test::TempDir dir;
  test::writeText(dir.file("notes.txt"), "not a run\n");
  const auto r = test::cohort({"report", dir.path()});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_TRUE(pageHas(r.err, dir.path() + ": not a run directory")) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("report.html")));
  const auto missing = test::cohort({"report", dir.file("nowhere")});
  EXPECT_EQ(missing.exitCode, 2) << missing.describe();
  EXPECT_TRUE(pageHas(missing.err, dir.file("nowhere") + ": no such directory")) << missing.err;
  EXPECT_THROW(monitor::writeReport({dir.path(), "", ""}), DataError);
}

TEST(Report, RunsListsTheReportOrTheCommandThatWritesIt) {
  RunFixture f;
  f.writeCommon(true);
  test::writeText(f.path("summary.json"), R"({"job":"fixture","status":"completed","train_images_per_s":1040.4})");
  auto before = test::cohort({"status", f.dir.path()});
  ASSERT_EQ(before.exitCode, 0) << before.describe();
  EXPECT_TRUE(pageHas(before.out, "report      cohort report " + f.dir.path())) << before.out;
  EXPECT_TRUE(pageHas(before.out, "samples/s   1040")) << before.out;
  ASSERT_EQ(test::cohort({"report", f.dir.path()}).exitCode, 0);
  const auto after = test::cohort({"status", f.dir.path()});
  EXPECT_TRUE(pageHas(after.out, "report      " + f.dir.path() + "/report.html")) << after.out;
  const auto runs = test::cohort({"runs", f.dir.path()});
  ASSERT_EQ(runs.exitCode, 0) << runs.describe();
  EXPECT_TRUE(pageHas(runs.out, "SAMPLES/S")) << runs.out;
  EXPECT_TRUE(pageHas(runs.out, " 1040 ")) << runs.out;
  EXPECT_TRUE(pageHas(runs.out, f.dir.path() + "/report.html")) << runs.out;
}

}  // namespace
}  // namespace cohort
