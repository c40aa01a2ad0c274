#pragma once

// The one logger of a cohort process. Every line carries the time, the level
// and the process tag ("[rank 1/4]" or "[launcher]"). The level comes from
// COHORT_LOG_LEVEL (trace|debug|info|warn|error|off, default info).
//
// Rank 0 talks to the console; every rank writes its own file in the run
// directory. A progress bar may own the last console line (setStatusLine):
// log lines are printed above it and the bar is redrawn below them.

#include <fmt/format.h>

#include <string>
#include <string_view>
#include <utility>

namespace cohort::log {

enum class Level { trace, debug, info, warn, error, critical, off };

struct Options {
  std::string tag = "cohort";  // shown as "[tag]"
  std::string file;            // log file; empty = no file
  bool console = true;         // print to stderr
  Level consoleLevel = Level::info;  // console shows lines at or above this
};

// (Re)configures the process logger. Throws IoError if the file cannot be
// opened. Safe to call more than once; the last call wins.
void init(const Options& options);

// Parses a level name; throws ConfigError naming the accepted values.
Level parseLevel(std::string_view name);

bool enabled(Level level);
void write(Level level, std::string_view message);
void flush();

// The in-place console status line (a progress bar). Empty clears it.
// Only drawn when stderr is a terminal and the console is enabled.
void setStatusLine(const std::string& line);
// True when stderr is a terminal and this process prints to the console.
bool consoleIsTerminal();

template <typename... A>
void trace(fmt::format_string<A...> f, A&&... a) {
  if (enabled(Level::trace)) write(Level::trace, fmt::format(f, std::forward<A>(a)...));
}
template <typename... A>
void debug(fmt::format_string<A...> f, A&&... a) {
  if (enabled(Level::debug)) write(Level::debug, fmt::format(f, std::forward<A>(a)...));
}
template <typename... A>
void info(fmt::format_string<A...> f, A&&... a) {
  if (enabled(Level::info)) write(Level::info, fmt::format(f, std::forward<A>(a)...));
}
template <typename... A>
void warn(fmt::format_string<A...> f, A&&... a) {
  if (enabled(Level::warn)) write(Level::warn, fmt::format(f, std::forward<A>(a)...));
}
template <typename... A>
void error(fmt::format_string<A...> f, A&&... a) {
  if (enabled(Level::error)) write(Level::error, fmt::format(f, std::forward<A>(a)...));
}
template <typename... A>
void critical(fmt::format_string<A...> f, A&&... a) {
  if (enabled(Level::critical)) write(Level::critical, fmt::format(f, std::forward<A>(a)...));
}

}  // namespace cohort::log
