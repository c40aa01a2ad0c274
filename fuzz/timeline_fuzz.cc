// The timeline's Chrome trace (src/monitor/timeline.cc) for any event or
// thread name.
//
// Input: NUL-separated names; the first names a thread, the rest are
// events. The file must be one JSON array that nlohmann::json (strict
// UTF-8) parses, with every name in it, as given when valid UTF-8.

#include <nlohmann/json.hpp>

#include "cohort/monitor/timeline.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort;
  using cohort::fuzz::require;
  const std::vector<std::string> names = fuzz::split(fuzz::asString(data, size), '\0');
  const auto path = fuzz::scratchDir() / "timeline" / "rank-0.json";
  {
    monitor::Timeline t(path.string(), 0);
    t.nameThread(1, names[0]);
    const auto now = monitor::Timeline::Clock::now();
    for (size_t i = 1; i < names.size(); ++i) {
      t.complete(names[i], "fuzz", now, now + std::chrono::microseconds(i), 0,
                 nlohmann::json{{"i", i}}.dump());
    }
  }
  const std::string text = fuzz::readFile(path);
  nlohmann::json trace;
  try {
    trace = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fuzz::finding(std::string("the timeline is not JSON: ") + e.what());
  }
  require(trace.is_array() && trace.size() == names.size() + 2,
          "the timeline does not hold one event per name");
  for (size_t i = 0; i < names.size(); ++i) {
    const nlohmann::json& e = trace[i + 2];
    const std::string name = i == 0 ? e["args"]["name"].get<std::string>() : e["name"].get<std::string>();
    nlohmann::json original = names[i];
    bool valid = true;
    try {
      original.dump();
    } catch (const nlohmann::json::exception&) {
      valid = false;
    }
    require(!valid || name == names[i], "a valid UTF-8 name was changed");
  }
  return 0;
}
