#include "cohort/monitor/watchdog.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <vector>

#include "cohort/comm/comm.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/monitor/activity.h"
#include "cohort/monitor/timeline.h"
#include "cohort/core/time.h"
#include "cohort/core/net.h"

namespace cohort::monitor {
struct Watchdog::Impl {
  c10::intrusive_ptr<c10d::Store> store;
};

Watchdog::Watchdog(const comm::Comm& comm, const WatchdogOptions& options)
    : impl_(std::make_unique<Impl>()),
      options_(options),
      rank_(comm.rank),
      world_(comm.worldSize),
      host_(hostName()) {
  observeCollectives();  // the collective a rank waits in goes into its heartbeat
  // The training thread uses comm.store; a client of our own keeps the two
  // threads' requests apart.
  impl_->store = comm::openStoreClient(comm);
  beat();
  thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> g(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::loop() {
  const auto period = std::chrono::duration<double>(std::max(0.05, options_.heartbeatS));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, period, [this] { return stop_; })) {
    lock.unlock();
    try {
      beat();
      inspect();
    } catch (const std::exception& e) {
      // The store went away (the job is ending) or a heartbeat was bad:
      // the watchdog must never take the rank down for that.
      log::debug("watchdog: {}", e.what());
    }
    lock.lock();
  }
}

void Watchdog::beat() {
  const Activity a = activity();
  Heartbeat h;
  h.rank = rank_;
  h.step = a.step;
  h.phase = phaseName(a.phase);
  h.phaseSeconds = a.phaseSeconds;
  h.waitingIn = a.waitingIn;
  h.waitingSeconds = a.waitingSeconds;
  h.unixTime = unixSeconds();
  h.host = host_;
  h.pid = static_cast<int>(::getpid());
  const std::string v = encodeHeartbeat(h);
  impl_->store->set(heartbeatKey(rank_), std::vector<uint8_t>(v.begin(), v.end()));
}

void Watchdog::inspect() {
  const Activity a = activity();
  if (a.waitingIn.empty() || a.waitingSeconds < lastWaitSeconds_) reportedUpTo_ = 0;
  lastWaitSeconds_ = a.waitingIn.empty() ? 0 : a.waitingSeconds;
  if (a.waitingIn.empty()) return;
  const bool fail = options_.failS > 0 && a.waitingSeconds >= options_.failS;
  const bool warn = options_.warnS > 0 && a.waitingSeconds >= reportedUpTo_ + options_.warnS;
  if (!fail && !warn) return;
  reportedUpTo_ = a.waitingSeconds;
  std::string what;
  try {
    what = describeWait(a.waitingIn, a.step, a.waitingSeconds);
  } catch (const std::exception& e) {
    what = fmt::format("stall: rank {} has waited {:.0f} s in {} after step {} (the other ranks' "
                       "heartbeats are unreadable: {})",
                       rank_, a.waitingSeconds, a.waitingIn, a.step, e.what());
  }
  if (!fail) {
    log::warn("{}", what);
    return;
  }
  log::error("{}; giving up after {:.0f} s (distribution.stall_timeout_s): ending this rank "
             "(exit {}) so the job can restart from its last checkpoint",
             what, options_.failS, kExitStalled);
  log::flush();
  if (Timeline* t = timeline()) t->flush();  // the trace up to the stall
  std::_Exit(kExitStalled);
}

std::string Watchdog::describeWait(const std::string& what, int64_t step, double seconds) {
  const double now = unixSeconds();
  const double stale = std::max(5.0, 3 * options_.heartbeatS);
  std::vector<std::string> missing;
  int there = 0;
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    const std::string key = heartbeatKey(r);
    if (!impl_->store->check({key})) {
      missing.push_back(fmt::format("rank {}: no heartbeat yet", r));
      continue;
    }
    const auto bytes = impl_->store->get(key);
    const Heartbeat h = decodeHeartbeat(std::string(bytes.begin(), bytes.end()));
    const double age = now - h.unixTime;
    const std::string who = fmt::format("rank {} ({}, pid {})", r, h.host, h.pid);
    if (age > stale) {
      missing.push_back(fmt::format("{}: no heartbeat for {:.0f} s (dead or frozen?), last at step "
                                    "{} in {}", who, age, h.step, h.phase));
    } else if (h.waitingIn == what && h.step == step) {
      ++there;
    } else if (!h.waitingIn.empty()) {
      missing.push_back(fmt::format("{}: step {}, waiting in {} for {:.1f} s", who, h.step,
                                    h.waitingIn, h.waitingSeconds));
    } else {
      missing.push_back(fmt::format("{}: step {}, {} for {:.1f} s (heartbeat {:.1f} s ago)", who,
                                    h.step, h.phase, h.phaseSeconds, std::max(0.0, age)));
    }
  }
  std::string head = fmt::format("stall: rank {} has waited {:.0f} s in {} after step {}", rank_,
                                 seconds, what, step);
  if (missing.empty()) {
    return fmt::format("{}; every rank ({} of {}) waits in it too: the collective itself is stuck "
                       "(network?)", head, there + 1, world_);
  }
  return fmt::format("{}; not there: {}", head, fmt::join(missing, "; "));
}

}  // namespace cohort::monitor
