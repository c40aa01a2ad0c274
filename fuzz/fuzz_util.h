#pragma once

// What every fuzz target shares: the contract it checks and scratch files.
//
// The contract for a parser of outside input: malformed input ends in a
// cohort::Error whose exit code is 2 (ConfigError, DataError) and whose
// message names where the input came from. Anything else — another
// exception type, an error with another exit code, a message without the
// origin — is reported and aborts, so that libFuzzer records the input.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <typeinfo>
#include <vector>
#include <unistd.h>

#include "cohort/core/error.h"

namespace cohort::fuzz {

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "\ncohort fuzz finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

inline void require(bool ok, const std::string& what) {
  if (!ok) finding(what);
}

// Runs `parse`. Returns true when it returned normally, false when it threw a
// cohort error with exit code `exitCode` naming `origin` (its message in
// `*message`); any other outcome is a finding.
template <class F>
bool expectInputError(const std::string& origin, F&& parse, std::string* message = nullptr,
                      int exitCode = 2) {
  try {
    parse();
    return true;
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (message != nullptr) *message = msg;
    require(e.exitCode() == exitCode,
            "error with exit code " + std::to_string(e.exitCode()) + ": " + msg);
    require(origin.empty() || msg.find(origin) != std::string::npos,
            "error does not name '" + origin + "': " + msg);
    return false;
  } catch (const std::exception& e) {
    finding(std::string("a non-cohort exception escaped (") + typeid(e).name() + "): " + e.what());
  }
}

inline std::string asString(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// A scratch directory for the process (under TMPDIR), removed at exit.
inline const std::filesystem::path& scratchDir() {
  static const std::filesystem::path dir = [] {
    namespace fs = std::filesystem;
    fs::path d = fs::temp_directory_path() / ("cohort-fuzz." + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  // Registered once `dir` is constructed, so it runs before `dir` is destroyed.
  static const bool removedAtExit = std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(scratchDir(), ec);
  }) == 0;
  (void)removedAtExit;
  return dir;
}

inline void writeFile(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  require(static_cast<bool>(out), "cannot write the scratch file " + path.string());
}

inline std::string readFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Splits `s` at every `sep`.
inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

}  // namespace cohort::fuzz
