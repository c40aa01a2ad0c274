#include "cohort/monitor/heartbeat.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cohort/core/error.h"
#include "core/detail/json_int.h"

namespace cohort::monitor {

std::string encodeHeartbeat(const Heartbeat& h) {
  nlohmann::json j = {{"rank", h.rank},       {"step", h.step},
                      {"phase", h.phase},     {"phase_s", h.phaseSeconds},
                      {"waiting_in", h.waitingIn}, {"waiting_s", h.waitingSeconds},
                      {"time", h.unixTime},   {"host", h.host},
                      {"pid", h.pid}};
  return j.dump();
}

Heartbeat decodeHeartbeat(const std::string& json) {
  try {
    const auto j = nlohmann::json::parse(json);
    Heartbeat h;
    h.rank = jsonInt<int>(j.at("rank"));
    h.step = jsonInt<int64_t>(j.at("step"));
    h.phase = j.at("phase").get<std::string>();
    h.phaseSeconds = j.at("phase_s").get<double>();
    h.waitingIn = j.at("waiting_in").get<std::string>();
    h.waitingSeconds = j.at("waiting_s").get<double>();
    h.unixTime = j.at("time").get<double>();
    h.host = j.at("host").get<std::string>();
    h.pid = jsonInt<int>(j.at("pid"));
    return h;
  } catch (const std::exception& e) {
    throw DataError(fmt::format("malformed heartbeat '{}': {}", json, e.what()));
  }
}

std::string heartbeatKey(int rank) { return fmt::format("hb/{}", rank); }

}  // namespace cohort::monitor
