#pragma once

// Error types of cohort. Every exception the project throws derives from
// cohort::Error and carries what a user needs to act on it: the job file with
// line and column, the data path, the rank, expected against actual values.
//
// The command line maps them to exit codes: bad user input (ConfigError,
// DataError, UsageError) exits 2, everything else exits 1.

#include <sstream>
#include <stdexcept>
#include <string>

namespace cohort {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
  // Process exit code the command line uses for this error.
  virtual int exitCode() const { return 1; }
};

// Invalid job file or override: names file:line:column (or the --set option).
class ConfigError : public Error {
 public:
  using Error::Error;
  int exitCode() const override { return 2; }
};

// Missing, truncated or corrupt input data: names the path, expected vs actual.
class DataError : public Error {
 public:
  using Error::Error;
  int exitCode() const override { return 2; }
};

// Wrong command-line usage.
class UsageError : public Error {
 public:
  using Error::Error;
  int exitCode() const override { return 2; }
};

// A peer or the network failed. The documented recovery is to tear the
// process group down and rendezvous again.
class CommError : public Error {
 public:
  using Error::Error;
};

// A blocking call ran past its timeout.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// Writing an output (run directory, model file) failed.
class IoError : public Error {
 public:
  using Error::Error;
};

// Training diverged (a non-finite loss). A restart from the last checkpoint
// would replay the same steps to the same result, so the launcher does not
// restart after it (exit 3).
class DivergedError : public Error {
 public:
  using Error::Error;
  int exitCode() const override { return 3; }
};

// A preflight health check failed (distribution.preflight): the hardware is
// unfit, and a restart on it would fail the same way, so the launcher does
// not restart after it (exit 5).
class PreflightError : public Error {
 public:
  using Error::Error;
  int exitCode() const override { return 5; }
};

namespace detail {
[[noreturn]] void assertFail(const char* file, int line, const char* cond,
                             const std::string& msg);

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace cohort

// Broken internal invariant: logs file:line and aborts. Not for user input.
#define COHORT_ASSERT(cond, ...)                                            \
  do {                                                                      \
    if (!(cond)) {                                                          \
      ::cohort::detail::assertFail(__FILE__, __LINE__, #cond,               \
                                   ::cohort::detail::concat(__VA_ARGS__)); \
    }                                                                       \
  } while (0)
