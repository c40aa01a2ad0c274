// The report page of a real run, opened in headless Chromium: every plot
// rendered, with as many points as the run wrote records, and a screenshot
// that is not blank. Chromium is Debian's `chromium` (scripts/install-deps.sh).

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <png.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "monitor/report_util.h"
#include "util/jobs.h"
#include "util/process.h"
#include "util/skip.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;

bool domHas(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

std::string chromium() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser"}) {
    if (fs::exists(p)) return p;
  }
  return "";
}

// Chromium, headless, with a profile of its own in `profile` (a temporary
// directory the test removes).
test::ProcessResult runChromium(const std::string& profile, const std::vector<std::string>& args) {
  std::vector<std::string> argv{chromium(),           "--headless",         "--no-sandbox",
                                "--disable-gpu",      "--no-first-run",     "--disable-extensions",
                                "--user-data-dir=" + profile, "--disable-dev-shm-usage"};
  argv.insert(argv.end(), args.begin(), args.end());
  return test::run(argv, {{"HOME", profile}}, std::chrono::minutes(3));
}

struct Pixels {
  uint32_t width = 0, height = 0;
  size_t colours = 0;         // distinct RGB values
  double nonWhiteShare = 0;   // pixels that are not near-white
};

// Decodes a PNG with libpng; nullopt when it is not one.
std::optional<Pixels> readPng(const std::string& path) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&image, path.c_str())) return std::nullopt;
  image.format = PNG_FORMAT_RGB;
  std::vector<png_byte> rgb(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, rgb.data(), 0, nullptr)) return std::nullopt;
  Pixels p;
  p.width = image.width;
  p.height = image.height;
  std::set<uint32_t> colours;
  size_t nonWhite = 0;
  for (size_t i = 0; i + 2 < rgb.size(); i += 3) {
    colours.insert(uint32_t(rgb[i]) << 16 | uint32_t(rgb[i + 1]) << 8 | rgb[i + 2]);
    if (rgb[i] < 235 || rgb[i + 1] < 235 || rgb[i + 2] < 235) ++nonWhite;
  }
  p.colours = colours.size();
  p.nonWhiteShare = double(nonWhite) / double(std::max<size_t>(1, rgb.size() / 3));
  return p;
}

TEST(ReportPage, ARealRunRendersEveryPlotInChromium) {
  if (chromium().empty()) COHORT_SKIP("chromium is not installed (scripts/install-deps.sh installs it)");
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("report"));
  const std::string run = dir.file("run");
  const auto train = test::cohort({"run", dir.file("job.yaml"), "--procs", "2", "--timeline", "--run-dir", run,
                                   "--set", "training.epochs=2", "--set", "data.eval.kind=synthetic", "--set",
                                   "data.eval.size=32", "--set", "data.eval.shape=[1,8,8]", "--set",
                                   "checkpoint.every_steps=4", "--set", "checkpoint.every_epochs=0",
                                   "--profile", "2-3"});
  ASSERT_EQ(train.exitCode, 0) << train.describe();
  // The operators each rank's profiler recorded (cohort run --profile).
  std::vector<size_t> operators;
  for (int r = 0; r < 2; ++r) {
    const auto ops = nlohmann::json::parse(test::readText(run + "/profile/operators-rank-" + std::to_string(r) +
                                                          ".json"));
    operators.push_back(ops.at("operators").size());
    ASSERT_GT(operators.back(), 0u) << "rank " << r;
  }

  const auto report = test::cohort({"report", run});
  ASSERT_EQ(report.exitCode, 0) << report.describe();
  const std::string page = run + "/report.html";
  EXPECT_EQ(report.out.substr(0, report.out.find('\n')), fs::absolute(page).lexically_normal().string());
  EXPECT_TRUE(domHas(report.out, "state: completed")) << report.out;

  size_t trains = 0, evals = 0;
  for (const auto& r : test::readJsonLines(run + "/metrics.jsonl")) {
    trains += r.value("event", "") == "train";
    evals += r.value("event", "") == "eval";
  }
  const auto summary = nlohmann::json::parse(test::readText(run + "/summary.json"));
  const int64_t steps = summary.at("steps").get<int64_t>();
  // Each checkpoint the policy asked for blocked training, also one skipped
  // because the one before was still being written.
  const int64_t checkpoints = summary.at("checkpoints").at("taken").get<int64_t>() +
                              summary.at("checkpoints").at("skipped").get<int64_t>();
  ASSERT_EQ(trains, size_t(steps)) << "log_every 1";
  ASSERT_EQ(evals, 2u);
  ASSERT_GT(checkpoints, 0);

  // The DOM as Chromium built it from the file.
  test::TempDir profile;
  const auto dom = runChromium(profile.path(), {"--dump-dom", "file://" + page});
  ASSERT_EQ(dom.exitCode, 0) << dom.describe();
  const std::string& html = dom.out;
  ASSERT_TRUE(domHas(html, "data-state=\"completed\"")) << html.substr(0, 3000);
  for (const auto& [id, n] : std::vector<std::pair<std::string, size_t>>{{"plot-loss", trains},
                                                                         {"plot-lr", trains},
                                                                         {"plot-throughput", trains},
                                                                         {"plot-data-wait", trains},
                                                                         {"plot-events", trains},
                                                                         {"plot-eval-top1", evals},
                                                                         {"plot-eval-loss", evals},
                                                                         {"plot-checkpoint", size_t(checkpoints)}}) {
    const std::string svg = test::svgOf(html, id);
    ASSERT_FALSE(svg.empty()) << id << " is missing from the page";
    EXPECT_EQ(test::polylinePoints(svg), std::vector<size_t>{n}) << id;
    EXPECT_EQ(test::countOf(svg, "<circle class=\"pt\""), n) << id;
  }
  // Every step of both ranks, from their timelines.
  EXPECT_EQ(test::binTotal(test::svgOf(html, "plot-step-times")), 2 * steps);
  for (const char* id : {"plot-rank-throughput", "plot-rank-data-wait", "plot-rank-memory"}) {
    EXPECT_EQ(test::countOf(test::svgOf(html, id), "class=\"bar\""), 2u) << id;
  }
  // Each rank's eight slowest operators drawn, and every one in its table.
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(test::countOf(test::svgOf(html, "plot-operators-rank-" + std::to_string(r)), "class=\"bar\""),
              std::min<size_t>(8, operators[size_t(r)]))
        << "rank " << r;
  }
  EXPECT_EQ(test::countOf(html, "<tr class=\"op\">"), operators[0] + operators[1]);
  EXPECT_TRUE(domHas(test::svgOf(html, "plot-events"), "data-kind=\"start\""));

  // What it looks like: the size asked for, and drawn on.
  const std::string png = dir.file("report.png");
  const auto shot = runChromium(profile.path(), {"--screenshot=" + png, "--window-size=1000,1400",
                                                 "--hide-scrollbars", "file://" + page});
  ASSERT_EQ(shot.exitCode, 0) << shot.describe();
  const auto pixels = readPng(png);
  ASSERT_TRUE(pixels.has_value()) << png << " is not a PNG";
  EXPECT_EQ(pixels->width, 1000u);
  EXPECT_EQ(pixels->height, 1400u);
  EXPECT_GT(pixels->colours, 50u) << "a blank or single-colour page";
  EXPECT_GT(pixels->nonWhiteShare, 0.05);
}

}  // namespace
}  // namespace cohort
