#include "cohort/monitor/report.h"

#include <fmt/format.h>

#include <filesystem>

#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "monitor/detail/report.h"

namespace cohort::monitor {

ReportResult writeReport(const ReportOptions& options) {
  std::error_code ec;
  if (options.runDir.empty()) throw DataError("cohort report: no run directory given");
  if (!std::filesystem::is_directory(options.runDir, ec)) {
    throw DataError(fmt::format("{}: no such directory", options.runDir));
  }
  if (!detail::isRunDir(options.runDir)) {
    throw DataError(fmt::format("{}: not a run directory (none of job.yaml, logs/, metrics.jsonl in it)",
                                options.runDir));
  }
  if (!options.planFile.empty() && !std::filesystem::is_regular_file(options.planFile, ec)) {
    throw DataError(fmt::format("--plan {}: no such file", options.planFile));
  }
  const detail::RunData run = detail::readRun(options.runDir, options.planFile);
  detail::Page page = detail::renderPage(run);
  ReportResult r;
  r.path = options.output.empty() ? run.dir + "/report.html" : options.output;
  writeFileAtomic(r.path, page.html);
  r.path = std::filesystem::absolute(r.path).lexically_normal().string();
  r.state = run.state;
  r.stateNote = run.stateNote;
  r.plots = std::move(page.plots);
  r.missing = std::move(page.missing);
  return r;
}

int printReport(const ReportOptions& options, std::ostream& out) {
  const ReportResult r = writeReport(options);
  out << r.path << "\n";
  out << fmt::format("state: {}{}\n", r.state, r.stateNote.empty() ? "" : " (" + r.stateNote + ")");
  out << fmt::format("plots: {}\n", r.plots.size());
  for (const auto& m : r.missing) out << "not shown: " << m << "\n";
  return 0;
}

}  // namespace cohort::monitor
