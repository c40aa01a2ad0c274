#include "cohort/run/run_metrics.h"

#include "cohort/security/keys.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>

#include "cohort/ckpt/resume.h"
#include "cohort/comm/store.h"
#include "cohort/monitor/prometheus.h"
#include "cohort/monitor/heartbeat.h"
#include "cohort/core/time.h"

namespace cohort::run {
namespace fs = std::filesystem;
namespace {

// The last train and eval records of metrics.jsonl: only its tail is read.
struct LastRecords {
  nlohmann::json train, eval;
};

LastRecords lastRecords(const std::string& path, std::streamoff tail = 65536) {
  LastRecords out;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return out;
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - tail);
  in.seekg(from);
  std::string line;
  if (from > 0) std::getline(in, line);  // a partial line
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) continue;  // a line being written
    const std::string event = j.value("event", "");
    if (event == "train") out.train = j;
    if (event == "eval") out.eval = j;
  }
  // Many events after the last train record: look further back, once.
  if (!out.train.is_object() && from > 0 && tail < (16 << 20)) return lastRecords(path, 16 << 20);
  return out;
}

// Step and age of the newest committed checkpoint (step-N/manifest.json).
std::optional<std::pair<int64_t, double>> newestCheckpoint(const std::string& dir) {
  std::error_code ec;
  std::optional<std::pair<int64_t, double>> best;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("step-", 0) != 0) continue;
    const fs::path manifest = it->path() / "manifest.json";
    std::error_code e2;
    const auto mtime = fs::last_write_time(manifest, e2);
    if (e2) continue;
    int64_t step = 0;
    try {
      step = std::stoll(name.substr(5));
    } catch (const std::exception&) {
      continue;
    }
    const double age = std::chrono::duration<double>(fs::file_time_type::clock::now() - mtime).count();
    if (!best || step > best->first) best = std::make_pair(step, std::max(0.0, age));
  }
  return best;
}

}  // namespace

struct RunMetrics::Impl {
  std::string metricsPath;
  std::string checkpointDir;
  int world = 1;
  std::string job;
  comm::KeyValueTable* store = nullptr;
};

RunMetrics::RunMetrics(const JobConfig& job, const RunDir& runDir, comm::KeyValueTable& store)
    : impl_(std::make_unique<Impl>()) {
  impl_->metricsPath = runDir.metrics();
  impl_->checkpointDir = ckpt::checkpointDir(job, runDir);
  impl_->world = static_cast<int>(job.distribution.procsPerNode);
  impl_->job = job.name;
  impl_->store = &store;
}

RunMetrics::~RunMetrics() = default;

std::string RunMetrics::render() const {
  monitor::PrometheusText t;
  const monitor::PrometheusText::Labels job = {{"job", impl_->job}};
  const int attempt = attempt_.load();
  t.gauge("cohort_world_size", "Ranks of the job.", impl_->world, job);
  t.counter("cohort_restarts_total", "Restarts of the job by cohort run.", attempt, job);
  const LastRecords last = lastRecords(impl_->metricsPath);
  if (last.train.is_object()) {
    auto num = [&](const char* k) { return last.train.value(k, 0.0); };
    t.gauge("cohort_step", "Optimizer steps done (rank 0's last train record).", num("step"), job);
    t.gauge("cohort_epoch", "Epoch of the last train record.", num("epoch"), job);
    t.gauge("cohort_loss", "Training loss, mean over the steps since the previous record.",
            num("loss"), job);
    t.gauge("cohort_learning_rate", "Learning rate.", num("lr"), job);
    t.gauge("cohort_images_per_second", "Training images per second, all ranks.",
            num("images_per_s"), job);
    t.gauge("cohort_data_wait_ratio", "Share of the time the ranks waited for batches.",
            num("data_wait_frac"), job);
  }
  if (last.eval.is_object()) {
    t.gauge("cohort_eval_top1", "Top-1 accuracy of the last evaluation.",
            last.eval.value("top1", 0.0), job);
  }
  if (const auto ckpt = newestCheckpoint(impl_->checkpointDir)) {
    t.gauge("cohort_checkpoint_step", "Step of the newest committed checkpoint.",
            static_cast<double>(ckpt->first), job);
    t.gauge("cohort_checkpoint_age_seconds", "Seconds since the newest checkpoint was committed.",
            ckpt->second, job);
  }
  // Heartbeats of the current attempt (its ranks write under its prefix).
  // The ranks' keys are below "cohort/attempt-<N>/" (c10d's PrefixStore
  // joins a prefix and a key with '/').
  const std::string attemptPrefix = fmt::format("cohort/attempt-{}/", attempt);
  const double now = unixSeconds();
  for (int r = 0; r < impl_->world; ++r) {
    // One rank's unreadable heartbeat leaves out that rank, not the scrape.
    monitor::Heartbeat h;
    try {
      const std::string key = attemptPrefix + monitor::heartbeatKey(r);
      if (!impl_->store->check({key})) continue;
      const auto value = impl_->store->get(key, std::chrono::milliseconds(1));
      if (!value) continue;
      h = monitor::decodeHeartbeat(*value);
    } catch (const std::exception&) {
      continue;
    }
    monitor::PrometheusText::Labels labels = job;
    labels.emplace_back("rank", std::to_string(r));
    t.gauge("cohort_rank_heartbeat_age_seconds", "Seconds since the rank's last heartbeat.",
            std::max(0.0, now - h.unixTime), labels);
    t.gauge("cohort_rank_step", "Optimizer steps the rank has done.", static_cast<double>(h.step),
            labels);
    t.gauge("cohort_rank_collective_wait_seconds",
            "Seconds the rank has waited in its current collective (0: not waiting).",
            h.waitingIn.empty() ? 0.0 : h.waitingSeconds, labels);
  }
  return t.str();
}

monitor::MetricsServerConfig metricsServerConfig(const OutputConfig& o) {
  monitor::MetricsServerConfig c;
  c.host = o.metricsHost;
  c.port = static_cast<int>(o.metricsPort);
  if (!o.metricsTokenFile.empty()) {
    c.token = security::readSecretFile(o.metricsTokenFile, "output.metrics_token_file");
  }
  c.tlsCert = o.metricsTlsCert;
  c.tlsKey = o.metricsTlsKey;
  return c;
}

}  // namespace cohort::run
