// Health reports as a table, as JSON (also how ranks exchange them) and as
// the failure message. No LibTorch here.

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "cohort/core/error.h"
#include "cohort/health/health.h"
#include "core/detail/json_int.h"
#include "health/detail/json.h"

namespace cohort::health {

const char* checkStatusName(CheckStatus status) {
  switch (status) {
    case CheckStatus::pass: return "pass";
    case CheckStatus::fail: return "fail";
    case CheckStatus::skipped: return "skipped";
  }
  return "?";
}

bool HealthReport::passed() const {
  return std::none_of(checks.begin(), checks.end(),
                      [](const HealthCheck& c) { return c.status == CheckStatus::fail; });
}

const HealthCheck* HealthReport::find(const std::string& name) const {
  for (const auto& c : checks) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

namespace detail {

nlohmann::json toJson(const HealthReport& r) {
  nlohmann::json checks = nlohmann::json::object();
  for (const auto& c : r.checks) {
    nlohmann::json j = {{"value", c.value},
                        {"unit", c.unit},
                        {"threshold", c.threshold},
                        {"key", c.key},
                        {"status", checkStatusName(c.status)},
                        {"passed", c.status != CheckStatus::fail},
                        {"detail", c.detail}};
    if (!c.error.empty()) j["error"] = c.error;
    checks[c.name] = std::move(j);
  }
  return {{"rank", r.rank},         {"world_size", r.worldSize}, {"host", r.host},
          {"threads", r.threads},   {"passed", r.passed()},      {"checks", std::move(checks)}};
}

HealthReport reportFromJson(const std::string& text) {
  try {
    const auto j = nlohmann::json::parse(text);
    HealthReport r;
    r.rank = jsonInt<int>(j.at("rank"));
    r.worldSize = jsonInt<int>(j.at("world_size"));
    r.host = j.at("host").get<std::string>();
    r.threads = jsonInt<int>(j.at("threads"));
    for (const auto& [name, c] : j.at("checks").items()) {
      HealthCheck h;
      h.name = name;
      h.value = c.at("value").get<double>();
      h.unit = c.at("unit").get<std::string>();
      h.threshold = c.at("threshold").get<double>();
      h.key = c.at("key").get<std::string>();
      const std::string status = c.at("status").get<std::string>();
      h.status = status == "pass"   ? CheckStatus::pass
                 : status == "fail" ? CheckStatus::fail
                                    : CheckStatus::skipped;
      h.detail = c.value("detail", "");
      h.error = c.value("error", "");
      r.checks.push_back(std::move(h));
    }
    // JSON objects come back in key order; keep the order the checks run in.
    const std::vector<std::string> order = {"matmul", "memory", "disk", "allreduce"};
    auto rankOf = [&](const HealthCheck& c) {
      return std::find(order.begin(), order.end(), c.name) - order.begin();
    };
    auto before = [&](const HealthCheck& a, const HealthCheck& b) { return rankOf(a) < rankOf(b); };
    std::stable_sort(r.checks.begin(), r.checks.end(), before);
    return r;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("a health report is not readable ({}): {}", e.what(), text));
  }
}

}  // namespace detail

namespace {

std::string number(double v) { return fmt::format("{:.4g}", v); }

std::string cell(const HealthCheck& c) {
  if (c.status == CheckStatus::skipped) return "skipped";
  if (!c.error.empty()) return "ERROR";
  return number(c.value) + (c.status == CheckStatus::pass ? " ok" : " FAIL");
}

}  // namespace

std::string formatHealthTable(const std::vector<HealthReport>& reports) {
  if (reports.empty()) return "";
  // Columns follow the first report's checks; every rank runs the same ones.
  const auto& first = reports.front().checks;
  size_t hostWidth = 4;
  for (const auto& r : reports) hostWidth = std::max(hostWidth, r.host.size());
  std::vector<std::string> titles;
  std::vector<size_t> widths;
  for (const auto& c : first) {
    std::string t = c.name == "allreduce" ? "allreduce busbw " + c.unit
                    : c.name == "disk"    ? "disk write " + c.unit
                                          : c.name + " " + c.unit;
    widths.push_back(std::max<size_t>(t.size(), 12));
    titles.push_back(std::move(t));
  }
  std::string out = fmt::format("{:>4}  {:<{}}", "rank", "host", hostWidth);
  for (size_t i = 0; i < titles.size(); ++i) out += fmt::format("  {:>{}}", titles[i], widths[i]);
  out += "\n";
  for (const auto& r : reports) {
    out += fmt::format("{:>4}  {:<{}}", r.rank, r.host, hostWidth);
    for (size_t i = 0; i < first.size(); ++i) {
      const HealthCheck* c = r.find(first[i].name);
      out += fmt::format("  {:>{}}", c ? cell(*c) : "-", widths[i]);
    }
    out += "\n";
  }
  out += fmt::format("{:>4}  {:<{}}", "min", "", hostWidth);
  for (size_t i = 0; i < first.size(); ++i) {
    out += fmt::format("  {:>{}}", first[i].threshold > 0 ? number(first[i].threshold) : "-",
                       widths[i]);
  }
  out += "\n";
  return out;
}

std::string healthReportsJson(const std::vector<HealthReport>& reports) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& r : reports) a.push_back(detail::toJson(r));
  return a.dump(2);
}

std::string healthFailures(const std::vector<HealthReport>& reports) {
  std::vector<std::string> perRank;
  std::vector<int> ranks;
  int world = 0;
  for (const auto& r : reports) {
    world = std::max(world, r.worldSize);
    std::vector<std::string> failed;
    for (const auto& c : r.checks) {
      if (c.status != CheckStatus::fail) continue;
      if (!c.error.empty()) {
        failed.push_back(fmt::format("{}: {}", c.name, c.error));
      } else {
        failed.push_back(fmt::format("{} {} {} is below {} = {}", c.name, number(c.value), c.unit,
                                     c.key, number(c.threshold)));
      }
    }
    if (failed.empty()) continue;
    ranks.push_back(r.rank);
    perRank.push_back(
        fmt::format("rank {} (host {}): {}", r.rank, r.host, fmt::join(failed, ", ")));
  }
  if (perRank.empty()) return "";
  return fmt::format("health checks failed on {} of {} rank{} [{}]: {}", ranks.size(), world,
                     world == 1 ? "" : "s", fmt::join(ranks, ", "), fmt::join(perRank, "; "));
}

}  // namespace cohort::health
