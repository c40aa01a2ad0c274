#include "cohort/monitor/metrics.h"

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <sstream>

#include "cohort/core/error.h"
#include "cohort/core/fence.h"
#include "cohort/core/file.h"
#include "cohort/core/time.h"

namespace cohort::monitor {
namespace {

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "a");
  if (file_ == nullptr) {
    throw IoError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  }
}

MetricsWriter::~MetricsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsWriter::writeLine(const std::string& json) {
  if (file_ == nullptr) return;
  fence::check("a metrics record");
  std::fputs(json.c_str(), file_);
  std::fputc('\n', file_);
  if (std::fflush(file_) != 0) {
    throw IoError(fmt::format("cannot write {}: {}", path_, std::strerror(errno)));
  }
}

void MetricsWriter::write(const TrainRecord& r) {
  nlohmann::json j = {{"event", "train"},     {"time", unixSeconds()},     {"step", r.step},
                      {"epoch", r.epoch},     {"loss", r.loss},         {"lr", r.lr},
                      {"images_per_s", r.imagesPerS}, {"data_wait_frac", r.dataWaitFrac}};
  if (r.tokensPerS > 0) j["tokens_per_s"] = r.tokensPerS;
  if (r.corruptSkipped > 0) j["corrupt_skipped"] = r.corruptSkipped;
  if (r.modelFlopsPerS > 0) j["model_gflops_per_s"] = r.modelFlopsPerS / 1e9;
  if (std::isfinite(r.mfu)) j["mfu"] = r.mfu;
  writeLine(j.dump());
}

void MetricsWriter::write(const EvalRecord& r) {
  nlohmann::json j = {{"event", "eval"}, {"time", unixSeconds()}, {"step", r.step},
                      {"epoch", r.epoch}, {"top1", r.top1},     {"top5", r.top5},
                      {"loss", r.loss},   {"samples", r.samples}, {"seconds", r.seconds}};
  if (r.tokens > 0) {
    j["tokens"] = r.tokens;
    j["perplexity"] = r.perplexity;
    if (r.lossPerByte > 0) j["bits_per_byte"] = r.bitsPerByte;
  }
  writeLine(j.dump());
}

void dropRecordsAfter(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string line, kept;
  bool dropped = false;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    // An evaluation at the checkpoint's step came after the checkpoint and
    // is repeated too.
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
        (j["step"].get<int64_t>() > step ||
         (j["step"].get<int64_t>() == step && j.value("event", "") == "eval"))) {
      dropped = true;
      continue;
    }
    kept += line + "\n";
  }
  if (dropped) writeFileAtomic(path, kept);
}

}  // namespace cohort::monitor
