#include "cohort/monitor/metrics.h"

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "cohort/core/error.h"

namespace cohort::monitor {
namespace {

double unixTime() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

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
  std::fputs(json.c_str(), file_);
  std::fputc('\n', file_);
  if (std::fflush(file_) != 0) {
    throw IoError(fmt::format("cannot write {}: {}", path_, std::strerror(errno)));
  }
}

void MetricsWriter::write(const TrainRecord& r) {
  nlohmann::json j = {{"event", "train"},     {"time", unixTime()},     {"step", r.step},
                      {"epoch", r.epoch},     {"loss", r.loss},         {"lr", r.lr},
                      {"images_per_s", r.imagesPerS}, {"data_wait_frac", r.dataWaitFrac}};
  writeLine(j.dump());
}

void MetricsWriter::write(const EvalRecord& r) {
  nlohmann::json j = {{"event", "eval"}, {"time", unixTime()}, {"step", r.step},
                      {"epoch", r.epoch}, {"top1", r.top1},     {"top5", r.top5},
                      {"loss", r.loss},   {"samples", r.samples}, {"seconds", r.seconds}};
  writeLine(j.dump());
}

}  // namespace cohort::monitor
