#include "cohort/launch/debug.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <limits.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/fd.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"
#include "cohort/core/net.h"
#include "cohort/launch/spawn.h"
#include "launch/detail/debug_attach.h"

namespace cohort::launch {
namespace detail {

AttachPoint attachPoint(const std::string& masterAddr) {
  AttachPoint a;
  const int port = freeTcpPort();
  if (masterAddr.empty() || isLoopbackAddress(masterAddr)) {
    a.listen = fmt::format("127.0.0.1:{}", port);
    a.shown = a.listen;
  } else {
    a.listen = fmt::format(":{}", port);
    a.shown = fmt::format("{}:{}", env::nodeAddress().value_or(hostName()), port);
  }
  a.program = selfExecutable();
  return a;
}

pid_t tracerPid() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("TracerPid:", 0) == 0) return static_cast<pid_t>(std::atol(line.c_str() + 10));
  }
  return 0;
}

void allowTracing() { prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0); }

}  // namespace detail

namespace {

// The path of `name` on PATH, or "".
std::string onPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Adds (or replaces) rank `rank`'s configuration in <runDir>/debug/launch.json:
// VS Code's C/C++ extension (cppdbg) connects to gdbserver with it. Ranks
// held together add theirs under a lock.
void addToLaunchJson(const std::string& runDir, int rank, const detail::AttachPoint& at) {
  const std::string dir = runDir + "/debug";
  std::filesystem::create_directories(dir);
  const UniqueFd lock(::open((dir + "/.lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600));
  if (!lock.valid()) throw IoError(fmt::format("cannot open {}/.lock: {}", dir, std::strerror(errno)));
  while (::flock(lock.get(), LOCK_EX) != 0 && errno == EINTR) {
  }
  const std::string path = dir + "/launch.json";
  nlohmann::json j;
  if (std::ifstream in(path); in) j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_object() || !j.contains("configurations") || !j["configurations"].is_array()) {
    j = {{"version", "0.2.0"}, {"configurations", nlohmann::json::array()}};
  }
  const std::string name = fmt::format("cohort rank {}", rank);
  auto& list = j["configurations"];
  list.erase(std::remove_if(list.begin(), list.end(),
                            [&](const nlohmann::json& c) { return c.value("name", "") == name; }),
             list.end());
  char cwd[PATH_MAX];
  const std::string gdb = onPath("gdb");
  list.push_back({{"name", name},
                  {"type", "cppdbg"},
                  {"request", "launch"},
                  {"program", at.program},
                  {"miDebuggerServerAddress", at.shown},
                  {"miDebuggerPath", gdb.empty() ? "gdb" : gdb},
                  {"MIMode", "gdb"},
                  {"cwd", ::getcwd(cwd, sizeof cwd) != nullptr ? cwd : runDir},
                  {"stopAtEntry", false}});
  std::sort(list.begin(), list.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
    return a.value("name", "") < b.value("name", "");
  });
  writeFileAtomic(path, j.dump(2) + "\n");
}

}  // namespace

std::vector<int> parseDebugRanks(const std::string& text, int world, const char* option) {
  std::vector<int> ranks;
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    size_t used = 0;
    long r = -1;
    try {
      r = std::stol(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || !std::isdigit(static_cast<unsigned char>(item[0]))) {
      throw UsageError(fmt::format("{} {}: expected ranks as numbers, e.g. 1 or 0,3; '{}' is not one",
                                   option, text, item));
    }
    if (world > 0 && r >= world) {
      throw UsageError(fmt::format("{} {}: rank {} does not exist; the job has {} ranks (0..{})", option,
                                   text, r, world, world - 1));
    }
    if (r > 1'000'000) throw UsageError(fmt::format("{} {}: rank {} does not exist", option, text, r));
    ranks.push_back(static_cast<int>(r));
  }
  if (ranks.empty() || text.back() == ',') {
    throw UsageError(fmt::format("{} '{}': expected ranks as numbers, e.g. 1 or 0,3", option, text));
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

std::string gdbserverPath() {
  const std::string path = onPath("gdbserver");
  if (path.empty()) {
    throw ConfigError(fmt::format("--debug/--debug-on-failure: gdbserver is not installed (Debian package {}; "
                                  "scripts/install-deps.sh installs it)",
                                  kGdbserverPackage));
  }
  return path;
}

std::string gdbCommand(const std::string& hostPort, const std::string& program) {
  return fmt::format("gdb -ex 'target remote {}' {}", hostPort, program);
}

std::vector<std::pair<std::string, std::string>> debugEnvironment(const DebugOptions& o, int world,
                                                                  bool here) {
  if (!o.any()) return {};
  if (o.onFailureS < 0) {
    throw UsageError(fmt::format("--debug-on-failure {}: expected seconds >= 1", o.onFailureS));
  }
  std::vector<std::pair<std::string, std::string>> vars;
  if (!o.ranks.empty()) {
    const std::vector<int> ranks = parseDebugRanks(o.ranks, world);
    vars.emplace_back(env::kDebugRanksVar, fmt::format("{}", fmt::join(ranks, ",")));
    if (here) {
      log::info("--debug {}: rank{} {} wait{} for a debugger before {} connect{}; the others wait at the "
              "rendezvous",
              o.ranks, ranks.size() > 1 ? "s" : "", fmt::join(ranks, ", "), ranks.size() > 1 ? "" : "s",
                ranks.size() > 1 ? "they" : "it", ranks.size() > 1 ? "" : "s");
    }
  }
  if (o.onFailureS > 0) {
    vars.emplace_back(env::kDebugOnFailureVar, std::to_string(o.onFailureS));
    if (here) {
      log::info("--debug-on-failure {}: a rank that fails waits {} s for a debugger before it ends; the others "
              "are held meanwhile",
                o.onFailureS, o.onFailureS);
    }
  }
  if (!here) return vars;
  gdbserverPath();
  log::info("debugging: timeouts suspended: distribution.timeout_s (rendezvous, store, collectives) is {} h, "
            "distribution.stall_timeout_s ends no rank (the stall inspector only warns)",
            kSuspendedTimeout.count());
  return vars;
}

bool debugging() {
  return env::debugRanks().has_value() || env::debugOnFailureSeconds().value_or(0) > 0;
}

void holdForDebugger(int rank, const std::string& masterAddr, const std::string& runDir) {
  const auto text = env::debugRanks();
  if (!text) return;
  // Not checked against this rank's world: an elastic round may be smaller
  // than the job the launcher checked the option against.
  const std::vector<int> ranks = parseDebugRanks(*text, 0, env::kDebugRanksVar);
  if (!std::binary_search(ranks.begin(), ranks.end(), rank)) return;
  const std::string gdbserver = gdbserverPath();
  const detail::AttachPoint at = detail::attachPoint(masterAddr);
  detail::allowTracing();
  if (!runDir.empty()) addToLaunchJson(runDir, rank, at);
  log::warn("rank {} waits for a debugger (--debug): gdbserver on {}, program {}", rank, at.shown, at.program);
  log::warn("rank {}: attach with: {}", rank, gdbCommand(at.shown, at.program));
  if (!runDir.empty()) {
    log::warn("rank {}: or in VS Code: {}/debug/launch.json, configuration \"cohort rank {}\"", rank, runDir,
              rank);
  }
  log::warn("rank {}: the other ranks wait at the rendezvous; continue or detach in the debugger to go on",
            rank);
  log::flush();
  sigset_t none;
  sigemptyset(&none);
  const pid_t server = spawn(gdbserver, {gdbserver, "--once", "--attach", at.listen, std::to_string(::getpid())},
                             nullptr, &none, "gdbserver");
  // gdbserver stops this process as it attaches: the loop ends when a
  // debugger lets it go on, traced still, or detached (gdbserver then ends
  // with 0). Its turns are counted, not the time: it may be stopped for
  // hours between two of them.
  constexpr int kAttachTurns = 3000;  // a minute of 20 ms turns
  bool ended = false;
  for (int turn = 0; !ended && detail::tracerPid() == 0; ++turn) {
    int status = 0;
    if (::waitpid(server, &status, WNOHANG) == server) {
      // Exit 0: a debugger came and detached while this loop was stopped.
      ended = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (ended) break;
      throw Error(fmt::format("rank {}: gdbserver {} before it attached to this rank (its message is above)",
                              rank, describeStatus(status)));
    }
    if (turn == kAttachTurns) {
      ::kill(server, SIGKILL);
      ::waitpid(server, nullptr, 0);
      throw Error(fmt::format("rank {}: gdbserver did not attach to this rank within a minute", rank));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // gdbserver ends when the debugger detaches (--once): reap it then.
  if (!ended) {
    std::thread([server] {
      while (::waitpid(server, nullptr, 0) < 0 && errno == EINTR) {
      }
    }).detach();
  }
  log::info("rank {}: the debugger let it go on", rank);
}

}  // namespace cohort::launch
