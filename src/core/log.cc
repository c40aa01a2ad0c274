#include "cohort/core/log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <mutex>

#include "cohort/core/env.h"
#include "cohort/core/error.h"

namespace cohort::log {
namespace {

spdlog::level::level_enum toSpd(Level l) {
  switch (l) {
    case Level::trace: return spdlog::level::trace;
    case Level::debug: return spdlog::level::debug;
    case Level::info: return spdlog::level::info;
    case Level::warn: return spdlog::level::warn;
    case Level::error: return spdlog::level::err;
    case Level::critical: return spdlog::level::critical;
    case Level::off: return spdlog::level::off;
  }
  return spdlog::level::info;
}

// stderr sink that keeps a status line (progress bar) as the last console
// line: each log line first erases it, then redraws it.
class ConsoleSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit ConsoleSink(bool tty) : tty_(tty) {}

  void setStatus(const std::string& line) {
    std::lock_guard<std::mutex> g(mutex_);
    if (!tty_) return;
    status_ = line;
    std::fputs("\r\033[K", stderr);
    std::fputs(status_.c_str(), stderr);
    if (status_.empty()) std::fputs("\r", stderr);
    std::fflush(stderr);
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    if (tty_ && !status_.empty()) std::fputs("\r\033[K", stderr);
    std::fwrite(buf.data(), 1, buf.size(), stderr);
    if (tty_ && !status_.empty()) std::fputs(status_.c_str(), stderr);
    std::fflush(stderr);
  }
  void flush_() override { std::fflush(stderr); }

 private:
  bool tty_;
  std::string status_;
};

struct State {
  std::mutex mutex;
  std::shared_ptr<spdlog::logger> logger;
  std::shared_ptr<ConsoleSink> console;
  bool consoleTty = false;
  Level level = Level::info;
};

State& state() {
  static State s;
  return s;
}

std::string escapePattern(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '%') out += '%';
    out += c;
  }
  return out;
}

}  // namespace

Level parseLevel(std::string_view name) {
  if (name == "trace") return Level::trace;
  if (name == "debug") return Level::debug;
  if (name == "info") return Level::info;
  if (name == "warn" || name == "warning") return Level::warn;
  if (name == "error") return Level::error;
  if (name == "critical") return Level::critical;
  if (name == "off") return Level::off;
  throw ConfigError(fmt::format(
      "COHORT_LOG_LEVEL: unknown level '{}' (expected trace, debug, info, warn, "
      "error or off)",
      name));
}

void init(const Options& options) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mutex);
  s.level = Level::info;
  if (auto v = env::logLevel()) s.level = parseLevel(*v);

  std::vector<spdlog::sink_ptr> sinks;
  s.console.reset();
  s.consoleTty = false;
  if (options.console) {
    s.consoleTty = isatty(STDERR_FILENO) == 1;
    s.console = std::make_shared<ConsoleSink>(s.consoleTty);
    s.console->set_level(toSpd(std::max(options.consoleLevel, s.level)));
    sinks.push_back(s.console);
  }
  if (!options.file.empty()) {
    try {
      auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(options.file);
      file->set_level(toSpd(s.level));
      sinks.push_back(file);
    } catch (const spdlog::spdlog_ex& e) {
      throw IoError(fmt::format("cannot open log file {}: {}", options.file, e.what()));
    }
  }
  auto logger = std::make_shared<spdlog::logger>("cohort", sinks.begin(), sinks.end());
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %l [" + escapePattern(options.tag) + "] %v");
  logger->set_level(toSpd(s.level));
  logger->flush_on(spdlog::level::warn);
  s.logger = logger;
}

bool enabled(Level level) {
  State& s = state();
  return level >= s.level && level != Level::off;
}

void write(Level level, std::string_view message) {
  std::shared_ptr<spdlog::logger> logger;
  {
    State& s = state();
    std::lock_guard<std::mutex> g(s.mutex);
    if (!s.logger) {
      // Before init(): plain stderr, so early errors are never lost.
      static const char* const kNames[] = {"trace", "debug", "info", "warning",
                                           "error", "critical", "off"};
      std::fprintf(stderr, "cohort: %s: %.*s\n", kNames[static_cast<int>(level)],
                   static_cast<int>(message.size()), message.data());
      return;
    }
    logger = s.logger;
  }
  logger->log(toSpd(level), "{}", message);
}

void flush() {
  State& s = state();
  std::shared_ptr<spdlog::logger> logger;
  {
    std::lock_guard<std::mutex> g(s.mutex);
    logger = s.logger;
  }
  if (logger) logger->flush();
}

void setStatusLine(const std::string& line) {
  std::shared_ptr<ConsoleSink> console;
  {
    State& s = state();
    std::lock_guard<std::mutex> g(s.mutex);
    console = s.console;
  }
  if (console) console->setStatus(line);
}

bool consoleIsTerminal() {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mutex);
  return s.console && s.consoleTty;
}

}  // namespace cohort::log
