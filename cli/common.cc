#include "common.h"

#include <cstdio>

#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/version.h"

namespace cohort::cli {

int fail(const std::string& message, int code) {
  log::setStatusLine("");
  log::error("{}", message);
  log::flush();
  return code;
}

int reportCurrentException() {
  try {
    throw;
  } catch (const Error& e) {
    return fail(e.what(), e.exitCode());
  } catch (const std::exception& e) {
    return fail(e.what(), 1);
  } catch (...) {
    return fail("unknown error", 1);
  }
}

void addStorageFlags(CLI::App* sub, storage::StorageOptions& so) {
  sub->add_option("--credentials-file", so.credentialsFile,
                  "Blob storage: file with account_key = ... or sas = ... (default: environment)");
  sub->add_option("--endpoint", so.endpoint, "Blob storage: where az://account/... goes (the emulator's address)");
  sub->add_option("--ca-file", so.caFile, "Blob storage: trusted certificate authorities (PEM)");
  sub->add_flag("--allow-insecure", so.allowInsecure,
                "Blob storage, emulator only: plain http, no certificate verification");
}

void addDebugFlags(CLI::App* sub, launch::DebugOptions& o) {
  sub->add_option("--debug", o.ranks,
                  "RANK[,RANK...]: these ranks wait for a debugger (gdbserver) before they connect; the log "
                  "and <run>/debug/launch.json say how to attach; timeouts are suspended")
      ->check([](const std::string& v) { return v.empty() ? std::string("expected ranks, e.g. 1 or 0,3") : ""; });
  sub->add_option("--debug-on-failure", o.onFailureS,
                  "A rank that fails (fatal signal, exception) waits this many seconds for a debugger "
                  "before it ends; timeouts are suspended")
      ->expected(0, 1)
      ->default_str(std::to_string(launch::kDefaultDebugOnFailureS))
      ->check(CLI::Range(1, 7 * 24 * 3600));
}

void describeApp(CLI::App& app) {
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", std::string("cohort ") + version() + " (LibTorch " + torchVersion() + ")");
  app.footer(
      "Exit codes: 0 success, 2 bad input (job file, data, arguments), 1 failure during "
      "training, 75 stopped on SIGTERM after a checkpoint (rerun to resume); a rank (`cohort "
      "worker`) also exits 3 when training diverged, 4 on a stalled collective, 5 on a failed "
      "preflight check.\nDocumentation: docs/job-spec.md, docs/launching.md, docs/monitoring.md");
}

std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  const env::ParseOnly only = env::parseOnly();
  try {
    app.parse(argc, argv);
  } catch (const CLI::RequiredError& e) {
    // A fragment may leave out what is required, but not name what the
    // command does not have.
    const auto extra = app.remaining(true);
    if (only == env::ParseOnly::partial && extra.empty()) {
      std::printf("cohort: parsed, but for: %s\n", e.what());
      return 0;
    }
    if (!extra.empty()) {
      app.exit(CLI::ExtrasError(extra));
      return 2;
    }
    app.exit(e);
    return 2;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  if (only != env::ParseOnly::no) {
    std::printf("cohort: parsed\n");
    return 0;
  }
  return std::nullopt;
}

}  // namespace cohort::cli
