#pragma once

// What the two cohort programs share. `cohort` is the front end: it parses
// every command, runs those that need no LibTorch itself (run, validate,
// submit, data, logs, plan, ...) and hands the others to `cohort-torch`
// beside it (commands.h), so that a command such as `cohort validate` or
// the launcher of `cohort run` never loads LibTorch (~0.3 s of CPU and
// ~170 MB of touched memory per process). `cohort-torch` runs every command.

#include <CLI/CLI.hpp>

#include <optional>
#include <string>

#include "cohort/launch/debug.h"
#include "cohort/storage/storage.h"

namespace cohort::cli {

// Logs `message` as an error and returns `code`.
int fail(const std::string& message, int code);

// Reports the exception being handled; returns the exit code it maps to
// (a cohort::Error's own, 1 for anything else).
int reportCurrentException();

// Where a command reads or writes blob URLs: how it reaches the storage.
void addStorageFlags(CLI::App* sub, storage::StorageOptions& so);

// --debug and --debug-on-failure of a command that starts ranks (run,
// agent, submit): cohort/launch/debug.h.
void addDebugFlags(CLI::App* sub, launch::DebugOptions& o);

// The top level: its description, --version and the exit codes.
void describeApp(CLI::App& app);

// Parses the command line. Returns the exit code when parsing ends the
// program (--help, --version, a parse error: 2), nullopt otherwise.
std::optional<int> parse(CLI::App& app, int argc, char** argv);

}  // namespace cohort::cli
