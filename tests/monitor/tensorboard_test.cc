// TensorBoard event files, read back by tests/monitor/read_tfevents.py: its
// own CRC-32C and Debian's python3-protobuf, nothing of the writer's.

#include "cohort/monitor/tensorboard.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ctime>
#include <limits>
#include <thread>
#include <vector>

#include "cohort/core/error.h"
#include "monitor/detail/crc32c.h"
#include "test_paths.h"
#include "util/jobs.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;

struct Scalar {
  std::string tag;
  int64_t step;
  double value;
  double wallTime;
};

uint32_t floatBits(double v) {
  const float f = static_cast<float>(v);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

std::vector<std::string> eventFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

test::ProcessResult readEvents(const std::string& file) {
  return test::run({COHORT_PYTHON, test::sourceDir() + "/tests/monitor/read_tfevents.py", file},
                   {}, std::chrono::minutes(2));
}

class TensorBoard : public ::testing::Test {
 protected:
  void SetUp() override {
    auto r = test::run({COHORT_PYTHON, "-c", "import google.protobuf"}, {}, std::chrono::minutes(1));
    ASSERT_EQ(r.exitCode, 0) << COHORT_PYTHON
                             << " cannot import google.protobuf: run scripts/install-deps.sh "
                                "(it installs python3-protobuf)\n"
                             << r.describe();
  }
  test::TempDir dir;
};

TEST(TensorBoardCrc32c, KnownValues) {
  // The check value of CRC-32C, and RFC 3720's 32 zero bytes.
  EXPECT_EQ(monitor::detail::crc32c("123456789", 9), 0xE3069283u);
  const std::vector<unsigned char> zeros(32, 0);
  EXPECT_EQ(monitor::detail::crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(monitor::detail::crc32c("", 0), 0u);
}

TEST_F(TensorBoard, PythonReadsTagsStepsAndValues) {
  const std::string tbDir = dir.file("run/tensorboard");  // created with its parent
  const std::vector<Scalar> scalars = {
      {"train/loss", 0, 2.302585, 1795295984.25},
      {"train/lr", 0, 0.1, 1795295984.25},
      {"train/loss", 50, 0.4637, 1795295990.5},
      {"train/lr", 50, 1e-5, 1795295990.5},
      {"eval/top1", 469, 0.8735, 1795296035.125},
      {"debug/negative", -3, -1234.5, 1.0},
      {"debug/large", int64_t{1} << 40, 3.0e38, 2.0},
      {"debug/tiny", 7, -1.5e-30, 3.0},
      {"debug/zero", 8, 0.0, 4.0},
      {"debug/infinite", 9, std::numeric_limits<double>::infinity(), 5.0},
      {u8"unicode/\u00e9t\u00e9 and spaces", 10, 42.0, 6.0},
  };
  std::string path;
  {
    monitor::TensorBoardWriter w(tbDir);
    path = w.path();
    for (const auto& s : scalars) w.addScalar(s.tag, s.step, s.value, s.wallTime);
    w.flush();
    // Flushed: readable while the writer is still open.
    auto live = readEvents(path);
    ASSERT_EQ(live.exitCode, 0) << live.describe();
    EXPECT_EQ(nlohmann::json::parse(live.out)["scalars"].size(), scalars.size());
  }
  EXPECT_EQ(eventFiles(tbDir), std::vector<std::string>{path});
  const std::string name = fs::path(path).filename().string();
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_NE(name.find("." + std::to_string(getpid()) + "."), std::string::npos) << name;

  auto r = readEvents(path);
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["file_version"], "brain.Event:2");
  EXPECT_EQ(j["records"], scalars.size() + 1);
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_NEAR(j["first_wall_time"].get<double>(), now, 60.0);
  ASSERT_EQ(j["scalars"].size(), scalars.size());
  for (size_t i = 0; i < scalars.size(); ++i) {
    const auto& got = j["scalars"][i];
    const Scalar& want = scalars[i];
    EXPECT_EQ(got["tag"], want.tag) << i;
    EXPECT_EQ(got["step"], want.step) << want.tag;
    EXPECT_EQ(got["wall_time"], want.wallTime) << want.tag;
    // float32, as TensorBoard stores scalars: bit for bit.
    EXPECT_EQ(got["bits"], floatBits(want.value)) << want.tag;
    if (std::isfinite(want.value)) {
      EXPECT_EQ(got["value"].get<double>(), static_cast<double>(static_cast<float>(want.value)))
          << want.tag;
    }
  }
}

TEST_F(TensorBoard, ACorruptByteFailsTheReader) {
  std::string path;
  {
    monitor::TensorBoardWriter w(dir.path());
    path = w.path();
    for (int step = 0; step < 3; ++step) w.addScalar("loss", step, 1.0 / (step + 1));
  }
  ASSERT_EQ(readEvents(path).exitCode, 0);
  const std::string good = test::readText(path);

  // A flipped bit in the data of the last record, then in a length.
  struct Case {
    size_t offset;
    const char* message;
  };
  for (const Case c : {Case{good.size() - 6, "data CRC mismatch"}, Case{2, "length CRC mismatch"}}) {
    std::string bad = good;
    bad[c.offset] = static_cast<char>(bad[c.offset] ^ 0x10);
    test::writeText(path, bad);
    auto r = readEvents(path);
    EXPECT_EQ(r.exitCode, 1) << r.describe();
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.describe();
  }
  // A record cut short.
  test::writeText(path, good.substr(0, good.size() - 3));
  auto r = readEvents(path);
  EXPECT_EQ(r.exitCode, 1) << r.describe();
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.describe();
}

TEST_F(TensorBoard, WritersNeverShareAFile) {
  monitor::TensorBoardWriter a(dir.path());
  monitor::TensorBoardWriter b(dir.path());
  EXPECT_NE(a.path(), b.path());
  a.addScalar("x", 1, 1.0);
  b.addScalar("x", 1, 2.0);
  a.flush();
  b.flush();
  EXPECT_EQ(eventFiles(dir.path()).size(), 2u);
}

TEST_F(TensorBoard, ConcurrentWritersKeepRecordsWhole) {
  std::string path;
  {
    monitor::TensorBoardWriter w(dir.path());
    path = w.path();
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&w, t] {
        for (int step = 0; step < 200; ++step) {
          w.addScalar("thread" + std::to_string(t), step, step * 0.5);
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  auto r = readEvents(path);
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(nlohmann::json::parse(r.out)["scalars"].size(), 800u);
}

TEST(TensorBoardErrors, UncreatableDirectoryNamesThePath) {
  test::TempDir dir;
  test::writeText(dir.file("plain-file"), "x");
  const std::string bad = dir.file("plain-file/tensorboard");
  try {
    monitor::TensorBoardWriter w(bad);
    FAIL() << "no error for " << bad;
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
}

// A 2-rank run: rank 0 writes the run's scalars under <run>/tensorboard/,
// and the independent reader finds every tag at the steps metrics.jsonl has.
TEST_F(TensorBoard, TheTrainerWritesTheRunsScalars) {
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("board"));
  auto r = test::cohort({"run", dir.file("job.yaml"), "--procs", "2", "--run-dir",
                         dir.file("run"), "--set", "training.epochs=2", "--set",
                         "training.log_every=2", "--set", "data.eval.kind=synthetic", "--set",
                         "data.eval.size=32", "--set", "data.eval.shape=[1, 8, 8]"},
                        {}, std::chrono::minutes(3));
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const auto files = eventFiles(dir.file("run/tensorboard"));
  ASSERT_EQ(files.size(), 1u) << "rank 0 alone writes, one file per run";
  auto read = readEvents(files[0]);
  ASSERT_EQ(read.exitCode, 0) << read.describe();
  const auto decoded = nlohmann::json::parse(read.out);
  std::map<std::string, std::map<int64_t, double>> got;
  for (const auto& v : decoded["scalars"]) got[v["tag"]][v["step"]] = v["value"];
  for (const char* tag : {"train/loss", "train/lr", "train/images_per_s", "train/data_wait_frac",
                          "eval/top1", "eval/top5", "eval/loss", "checkpoint/blocked_ms"}) {
    EXPECT_FALSE(got[tag].empty()) << tag;
  }
  int compared = 0;
  for (const auto& j : test::readJsonLines(dir.file("run/metrics.jsonl"))) {
    const std::string event = j.value("event", "");
    const int64_t step = j.value("step", int64_t{-1});
    if (event == "train") {
      ASSERT_TRUE(got["train/loss"].count(step)) << step;
      EXPECT_FLOAT_EQ(got["train/loss"][step], j["loss"].get<float>());
      EXPECT_FLOAT_EQ(got["train/lr"][step], j["lr"].get<float>());
      ++compared;
    } else if (event == "eval") {
      EXPECT_FLOAT_EQ(got["eval/top1"][step], j["top1"].get<float>());
      ++compared;
    }
  }
  EXPECT_EQ(compared, 6 + 2) << "12 steps logged every 2, and 2 evaluations";
}

}  // namespace
}  // namespace cohort
