#pragma once

// What `cohort run` serves at /metrics (output.metrics_port): the run as the
// launcher sees it, in Prometheus' text format (monitor/prometheus.h).
// Sources: rank 0's last train and eval records in metrics.jsonl, the newest
// committed checkpoint, each rank's heartbeat in the rendezvous store
// (monitor/watchdog.h), and the launcher's own restart count.

#include <atomic>
#include <memory>
#include <string>

#include "cohort/config/job.h"
#include "cohort/core/run_dir.h"
#include "cohort/monitor/prometheus.h"

namespace cohort::comm {
class KeyValueTable;
}

namespace cohort::run {

class RunMetrics {
 public:
  // `store` is the table of the rendezvous store the launcher hosts; it is
  // only read, and must outlive this object.
  RunMetrics(const JobConfig& job, const RunDir& runDir, comm::KeyValueTable& store);
  ~RunMetrics();

  // The attempt running now (0 for the first; restarts = attempt).
  void setAttempt(int attempt) { attempt_.store(attempt); }

  // The exposition text; safe to call from a server thread.
  std::string render() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<int> attempt_{0};
};

// The endpoint output.metrics_* describes (`cohort run`, `cohort agent`);
// the token is read from its file. Throws ConfigError for an unreadable one.
monitor::MetricsServerConfig metricsServerConfig(const OutputConfig& o);

}  // namespace cohort::run
