// `cohort run --metrics-port`: while the ranks train, the launcher serves the
// run in Prometheus' text format, which Prometheus' own promtool accepts.

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <random>
#include <regex>
#include <thread>

#include "test_paths.h"
#include "util/jobs.h"

namespace cohort {
namespace {

using namespace std::chrono_literals;

std::string scrape(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(2);
  c.set_read_timeout(5);
  auto r = c.Get("/metrics");
  return r && r->status == 200 ? r->body : std::string();
}

// The value of the first sample whose line starts with `series`.
std::optional<double> sample(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return std::nullopt;
}

TEST(RunMetrics, TheLauncherServesTheRunToPrometheus) {
  ASSERT_EQ(access(COHORT_PROMTOOL, X_OK), 0)
      << COHORT_PROMTOOL << " is missing: run scripts/install-deps.sh";
  test::TempDir dir;
  std::random_device rd;
  const std::string tag = std::to_string(getpid()) + "-" + std::to_string(rd());
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("scraped"));
  const int port = test::freePort();
  test::Process launcher({test::cohortBin(), "run", job, "--procs", "2", "--run-dir",
                          dir.file("run"), "--metrics-port", std::to_string(port), "--set",
                          "training.epochs=100000", "--set", "checkpoint.every_steps=5", "--set",
                          "distribution.heartbeat_s=0.2"},
                         {{"COHORT_TEST_TAG", tag}});
  // Bounded: the ranks start, train, checkpoint and heartbeat.
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (std::chrono::steady_clock::now() < deadline) {
    text = scrape(port);
    if (sample(text, R"(cohort_rank_step{job="scraped",rank="1"})").value_or(0) > 0 &&
        sample(text, R"(cohort_step{job="scraped"})") && sample(text, R"(cohort_checkpoint_step{job="scraped"})")) {
      break;
    }
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(sample(text, R"(cohort_rank_step{job="scraped",rank="1"})").has_value())
      << text << launcher.stderrSoFar();
  EXPECT_EQ(sample(text, R"(cohort_world_size{job="scraped"})"), 2.0) << text;
  EXPECT_EQ(sample(text, R"(cohort_restarts_total{job="scraped"})"), 0.0) << text;
  EXPECT_GT(sample(text, R"(cohort_step{job="scraped"})").value_or(0), 0) << text;
  EXPECT_TRUE(std::isfinite(sample(text, R"(cohort_loss{job="scraped"})").value_or(NAN))) << text;
  EXPECT_GE(sample(text, R"(cohort_checkpoint_age_seconds{job="scraped"})").value_or(-1), 0) << text;
  for (int rank = 0; rank < 2; ++rank) {
    const auto age = sample(text, "cohort_rank_heartbeat_age_seconds{job=\"scraped\",rank=\"" +
                                      std::to_string(rank) + "\"}");
    ASSERT_TRUE(age.has_value()) << text;
    EXPECT_GE(*age, 0);
  }
  // Prometheus' own parser and linter.
  test::writeText(dir.file("metrics.txt"), text);
  auto check = test::run({"/bin/sh", "-c", "exec \"$0\" check metrics < \"$1\"", COHORT_PROMTOOL,
                          dir.file("metrics.txt")},
                         {}, 1min);
  EXPECT_EQ(check.exitCode, 0) << check.describe() << "\n" << text;

  launcher.signal(SIGINT);
  auto r = launcher.wait(120s);
  ASSERT_FALSE(r.timedOut) << r.describe();
  EXPECT_NE(r.err.find("Prometheus metrics at http://127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(scrape(port).empty()) << "the endpoint outlived the launcher";
  EXPECT_TRUE(test::processesWithEnv("COHORT_TEST_TAG=" + tag).empty());
}

}  // namespace
}  // namespace cohort
