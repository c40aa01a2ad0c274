#pragma once

// What the storage tests share: random payloads, the storage error a call
// must throw, and a capture of the process log.

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "cohort/core/log.h"
#include "cohort/storage/storage.h"
#include "util/process.h"

namespace cohort::storage {

using test::TempDir;

inline std::string randomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

// Fails the test unless `f` throws StorageError; returns it.
template <class F>
inline StorageError expectStorageError(F&& f) {
  try {
    f();
  } catch (const StorageError& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected StorageError, got: " << e.what();
    return StorageError("", -1, false);
  }
  ADD_FAILURE() << "expected StorageError, nothing was thrown";
  return StorageError("", -1, false);
}

template <class F>
inline std::string configErrorMessage(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected ConfigError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected ConfigError, nothing was thrown";
  return "";
}

// Routes the process log to a file, to check what retries log.
class LogCapture {
 public:
  LogCapture() {
    log::Options o;
    o.tag = "test";
    o.file = dir_.file("log.txt");
    o.console = false;
    log::init(o);
  }
  ~LogCapture() { log::init(log::Options{}); }
  std::string text() {
    log::flush();
    return test::readText(dir_.file("log.txt"));
  }

 private:
  TempDir dir_;
};

inline int countOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

}  // namespace cohort::storage
