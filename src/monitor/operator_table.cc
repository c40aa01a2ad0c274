#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "cohort/monitor/profiler.h"
#include "monitor/detail/profile_files.h"

// The operator table of the profiler (monitor/profiler.h) and its files.

namespace cohort::monitor {
namespace {

std::string jsonOf(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

std::string csvField(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string clipped(const std::string& s, size_t width) {
  return s.size() <= width ? s : s.substr(0, width - 3) + "...";
}

}  // namespace

std::vector<OperatorRow> operatorTable(std::vector<ProfiledEvent> events) {
  // Per thread in time order, an enclosing event before what it encloses.
  std::sort(events.begin(), events.end(), [](const ProfiledEvent& a, const ProfiledEvent& b) {
    return std::tie(a.thread, a.startUs, b.durationUs) < std::tie(b.thread, b.startUs, a.durationUs);
  });
  std::vector<double> childUs(events.size(), 0.0);
  std::vector<size_t> open;  // indices of the events enclosing the current one
  for (size_t i = 0; i < events.size(); ++i) {
    const ProfiledEvent& e = events[i];
    while (!open.empty()) {
      const ProfiledEvent& top = events[open.back()];
      if (top.thread == e.thread && e.startUs < top.startUs + top.durationUs) break;
      open.pop_back();
    }
    if (!open.empty()) childUs[open.back()] += static_cast<double>(e.durationUs);
    open.push_back(i);
  }
  std::map<std::pair<std::string, std::string>, OperatorRow> rows;
  for (size_t i = 0; i < events.size(); ++i) {
    const ProfiledEvent& e = events[i];
    OperatorRow& r = rows[{e.name, e.inputShapes}];
    r.name = e.name;
    r.inputShapes = e.inputShapes;
    ++r.calls;
    r.totalUs += static_cast<double>(e.durationUs);
    r.selfUs += std::max(0.0, static_cast<double>(e.durationUs) - childUs[i]);
    if (e.flops >= 0) r.flops = std::max(0.0, r.flops) + e.flops;
  }
  std::vector<OperatorRow> out;
  out.reserve(rows.size());
  for (auto& [key, row] : rows) out.push_back(std::move(row));
  std::stable_sort(out.begin(), out.end(), [](const OperatorRow& a, const OperatorRow& b) {
    return a.selfUs > b.selfUs;
  });
  return out;
}

namespace detail {

double productFlops(const std::string& name, const std::vector<std::vector<int64_t>>& shapes) {
  // Linear layers' products through oneDNN (models/linear.h), and
  // convolutions' (models/window_conv.h, models/gemm_conv.h): A [m, p] and
  // B [q, r], m p q for the forward (x, W) and m p r for the gradients
  // (dy, W) and (dy, x).
  std::string base = name;
  for (const char* grad : {"_grad_input", "_grad_weight"}) {
    const std::string suffix = grad;
    if (base.size() > suffix.size() && base.compare(base.size() - suffix.size(), suffix.size(), suffix) == 0) {
      base.resize(base.size() - suffix.size());
    }
  }
  const bool linearForward = base == name;
  if (base == "cohort::linear" || base == "cohort::gemm_conv" || base == "cohort::window_conv") {
    if (shapes.size() < 2 || shapes[0].size() != 2 || shapes[1].size() != 2) return -1;
    return 2.0 * static_cast<double>(shapes[0][0]) * static_cast<double>(shapes[0][1]) *
           static_cast<double>(shapes[1][linearForward ? 0 : 1]);
  }
  // The two matrices' positions among the inputs.
  size_t a = 0;
  if (name == "aten::addmm" || name == "aten::baddbmm") {
    a = 1;
  } else if (name != "aten::mm" && name != "aten::bmm") {
    return -1;
  }
  const size_t rank = name == "aten::mm" || name == "aten::addmm" ? 2 : 3;
  if (shapes.size() < a + 2 || shapes[a].size() != rank || shapes[a + 1].size() != rank) return -1;
  const std::vector<int64_t>& x = shapes[a];
  const std::vector<int64_t>& y = shapes[a + 1];
  const double batch = rank == 3 ? static_cast<double>(x[0]) : 1.0;
  return 2.0 * batch * static_cast<double>(x[rank - 2]) * static_cast<double>(x[rank - 1]) *
         static_cast<double>(y[rank - 1]);
}

std::string operatorJson(int rank, int64_t first, int64_t last, const std::vector<OperatorRow>& rows) {
  nlohmann::json ops = nlohmann::json::array();
  for (const OperatorRow& r : rows) {
    ops.push_back({{"name", r.name},
                   {"calls", r.calls},
                   {"self_us", r.selfUs},
                   {"total_us", r.totalUs},
                   {"input_shapes", r.inputShapes},
                   {"flops", r.flops >= 0 ? nlohmann::json(r.flops) : nlohmann::json()}});
  }
  nlohmann::json j{{"rank", rank}, {"steps", {first, last}}, {"operators", std::move(ops)}};
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string operatorCsv(const std::vector<OperatorRow>& rows) {
  std::string out = "name,calls,self_us,total_us,input_shapes,flops\n";
  for (const OperatorRow& r : rows) {
    out += fmt::format("{},{},{:.3f},{:.3f},{},{}\n", csvField(r.name), r.calls, r.selfUs, r.totalUs,
                       csvField(r.inputShapes), r.flops >= 0 ? fmt::format("{:.0f}", r.flops) : "");
  }
  return out;
}

std::vector<std::string> operatorLines(const std::vector<OperatorRow>& table, int rows) {
  double selfTotal = 0;
  for (const OperatorRow& r : table) selfTotal += r.selfUs;
  std::vector<std::string> out;
  out.push_back(fmt::format("{:<48} {:>7} {:>10} {:>6} {:>10} {:>9}  {}", "name", "calls", "self ms", "self%",
                            "total ms", "GFLOP", "input shapes"));
  for (int i = 0; i < rows && i < static_cast<int>(table.size()); ++i) {
    const OperatorRow& r = table[static_cast<size_t>(i)];
    out.push_back(fmt::format("{:<48} {:>7} {:>10.3f} {:>5.1f}% {:>10.3f} {:>9}  {}", clipped(r.name, 48),
                              r.calls, r.selfUs / 1e3, selfTotal > 0 ? 100 * r.selfUs / selfTotal : 0.0,
                              r.totalUs / 1e3, r.flops >= 0 ? fmt::format("{:.3f}", r.flops / 1e9) : "-",
                              clipped(r.inputShapes, 60)));
  }
  return out;
}

std::string traceEvent(const ProfiledEvent& e, bool range, int pid, int tid, const std::string& dtypes) {
  nlohmann::json j{{"ph", "X"},
                   {"cat", range ? "user_annotation" : "cpu_op"},
                   {"name", e.name},
                   {"pid", pid},
                   {"tid", tid},
                   {"ts", e.startUs},
                   {"dur", e.durationUs}};
  if (!range) {
    nlohmann::json args{{"Input Dims", nlohmann::json::parse(e.inputShapes, nullptr, false)}};
    if (args["Input Dims"].is_discarded()) args["Input Dims"] = e.inputShapes;
    if (!dtypes.empty()) args["Input type"] = nlohmann::json::parse(dtypes, nullptr, false);
    if (e.flops >= 0) args["flops"] = e.flops;
    j["args"] = std::move(args);
  }
  return jsonOf(j);
}

std::string traceText(int rank, int worldSize, const std::vector<std::string>& events) {
  std::string out = fmt::format(
      "{{\"schemaVersion\": 1,\n\"distributedInfo\": {{\"backend\": \"gloo\", \"rank\": {}, \"world_size\": {}}},\n"
      "\"deviceProperties\": [],\n\"displayTimeUnit\": \"ms\",\n\"traceEvents\": [\n",
      rank, worldSize);
  for (size_t i = 0; i < events.size(); ++i) {
    out += events[i];
    out += i + 1 < events.size() ? ",\n" : "\n";
  }
  return out + "]}\n";
}

}  // namespace detail
}  // namespace cohort::monitor
