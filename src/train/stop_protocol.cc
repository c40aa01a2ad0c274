#include "train/detail/stop_protocol.h"

#include <string>
#include <vector>

#include "cohort/train/stop.h"

namespace cohort::train::detail {

namespace {
constexpr const char* kCountKey = "stop/count";
constexpr const char* kAtKey = "stop/at";
}  // namespace

StopProtocol::StopProtocol(const comm::Comm& comm, bool enabled) : comm_(comm), enabled_(enabled) {
  stopRequest().graceful = enabled;
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
