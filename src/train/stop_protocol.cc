#include "train/detail/stop_protocol.h"

#include <signal.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "cohort/core/exit_codes.h"
#include "cohort/core/log.h"
#include "cohort/train/stop.h"

namespace cohort::train::detail {

namespace {
constexpr const char* kCountKey = "stop/count";
constexpr const char* kAtKey = "stop/at";
}  // namespace

StopProtocol::StopProtocol(const comm::Comm& comm, bool enabled) : comm_(comm), enabled_(enabled) {
  StopRequest& stop = stopRequest();
  std::lock_guard<std::mutex> g(stop.mutex);
  stop.graceful = enabled;
  stop.abrupt = !enabled;
  if (enabled || stop.signal.load() == 0) return;
  // Taken while the rank started, with nothing to checkpoint into.
  if (stop.signal.load() == SIGTERM) {
    log::warn("stopping on the SIGTERM taken while starting (checkpoints are off)");
    log::flush();
    std::_Exit(exitCodeForSignal(SIGTERM));
  }
  log::warn("the SIGUSR2 taken while starting asks for a checkpoint; checkpoints are off "
            "(checkpoint.enabled): the rank goes on until it is ended");
  stop.signal = 0;
}

bool StopProtocol::due(int64_t step) {
  if (!enabled_) return false;
  const bool alone = comm_.worldSize == 1;
  if (!published_ && stopRequest().signal.load() != 0) {
    published_ = true;
    if (alone) {
      stopAt_ = step;
      reform_ = stopRequest().reform.load();
    } else if (comm_.store->add(kCountKey, 1) == 1) {
      // The first request decides what the stop is for, on every rank.
      const std::string v =
          std::to_string(step + 1) + (stopRequest().reform.load() ? " reform" : " checkpoint");
      comm_.store->set(kAtKey, std::vector<uint8_t>(v.begin(), v.end()));
      // set() expects no reply: a round trip on the same connection makes
      // sure the store holds the key before this rank's next step starts.
      comm_.store->get(kAtKey);
    }
  }
  if (!stopAt_ && !alone && comm_.store->check({kAtKey})) {
    const auto v = comm_.store->get(kAtKey);
    const std::string text(v.begin(), v.end());
    stopAt_ = std::stoll(text);
    reform_ = text.find(" reform") != std::string::npos;
  }
  return stopAt_ && step >= *stopAt_;
}

}  // namespace cohort::train::detail
