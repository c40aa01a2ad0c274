#pragma once

// A debugger on a paused rank (docs/monitoring.md, "A debugger on a paused
// rank").
//
// --debug R[,R...]: each rank named starts as every rank does (the same
// process, the launcher's child, with its own exit status and signals), and
// before it connects to the others it starts gdbserver attached to itself
// on a free port, says how to attach (its log, and <run>/debug/launch.json
// for VS Code) and stays stopped in gdbserver's hands until a debugger
// continues or detaches it. The other ranks wait at the rendezvous.
//
// --debug-on-failure [S]: a rank that fails, of a fatal signal or of an
// exception that ends its training, starts gdbserver attached to itself the
// same way, says how to attach, and waits up to S seconds (less when the
// debugger detaches) before it fails as it would have; the others wait in
// their collective meanwhile.
//
// Either option suspends what would end a job whose rank is held: the
// rendezvous, store and collective timeout (distribution.timeout_s) becomes
// kSuspendedTimeout, and the stall inspector (distribution.stall_timeout_s)
// only warns. The rank's side lives here so that every way of starting ranks
// has it (cohort run, cohort agent, the srun steps of cohort submit's
// script): the launchers pass the options to the ranks in the environment
// (env::kDebugRanksVar, env::kDebugOnFailureVar).

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace cohort::launch {

// The Debian package that holds gdbserver.
inline constexpr const char* kGdbserverPackage = "gdbserver";
// --debug-on-failure without a value.
inline constexpr int kDefaultDebugOnFailureS = 300;
// What distribution.timeout_s becomes while a debug option is on.
inline constexpr std::chrono::hours kSuspendedTimeout{24};

struct DebugOptions {
  std::string ranks;   // --debug as given ("1" or "1,3"); empty: none
  int onFailureS = 0;  // --debug-on-failure; 0: off
  bool any() const { return !ranks.empty() || onFailureS > 0; }
};

// "1,3" -> {1, 3}, sorted and distinct, each in [0, world) (world <= 0: no
// upper bound). Throws UsageError naming `option` on anything else.
std::vector<int> parseDebugRanks(const std::string& text, int world, const char* option = "--debug");

// The launcher's side, before it starts ranks: checks `o` against the
// job's `world` (UsageError naming the option; world <= 0: not known yet)
// and, when the ranks run `here`, that gdbserver is installed (ConfigError
// naming its package) and logs what the options suspend; returns the
// variables for every rank's environment. Nothing when !o.any().
std::vector<std::pair<std::string, std::string>> debugEnvironment(const DebugOptions& o, int world,
                                                                  bool here = true);

// gdbserver's path, found on PATH. Throws ConfigError naming the Debian
// package when there is none.
std::string gdbserverPath();

// In a rank: whether a debug option is on (its timeouts are then suspended).
bool debugging();

// In a rank, before it connects: when env::kDebugRanksVar names `rank`,
// starts gdbserver attached to this process on a free port (on loopback
// when `masterAddr` is, else on every address), logs how to attach, adds
// this rank to <runDir>/debug/launch.json (runDir empty: no file) and
// returns once a debugger has continued or detached it. Returns at once for
// any other rank. Throws ConfigError when gdbserver is missing, Error when
// it cannot attach within a minute.
void holdForDebugger(int rank, const std::string& masterAddr, const std::string& runDir);

// In a rank, once, early: with env::kDebugOnFailureVar set, a fatal signal
// (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) makes the rank wait for a
// debugger as described above, then die of it. Throws ConfigError when
// gdbserver is missing.
void installDebugOnFailure(int rank, int world, const std::string& masterAddr);

// In a rank whose training ended with an exception, `what`: with
// env::kDebugOnFailureVar set, waits for a debugger as described above
// (once per process; later calls return at once). Returns at once without
// the option.
void waitForDebuggerOnFailure(const std::string& what);

// In a rank whose training ended because a peer's did (a CommError: the
// peer ended, or its connection did): no wait, the peer is the one to look
// at; later waitForDebuggerOnFailure calls return at once.
void skipDebuggerOnFailure(const std::string& what);

// How to attach: "gdb -ex 'target remote HOST:PORT' PROGRAM".
std::string gdbCommand(const std::string& hostPort, const std::string& program);

}  // namespace cohort::launch
