#pragma once

// What --debug and --debug-on-failure share (cohort/launch/debug.h): where
// gdbserver listens and what a debugger is told to connect to.

#include <sys/types.h>

#include <string>

namespace cohort::launch::detail {

struct AttachPoint {
  std::string listen;  // gdbserver's argument: 127.0.0.1:PORT, or :PORT (every address)
  std::string shown;   // what a debugger connects to: HOST:PORT
  std::string program; // this rank's program, whose symbols the debugger loads
};

// A free port on loopback when `masterAddr` is (a job of one machine), else
// on every address, shown with the node's address or host name.
AttachPoint attachPoint(const std::string& masterAddr);

// TracerPid of this process: nonzero once a debugger (gdbserver) attached.
pid_t tracerPid();

// Lets any process of this user trace this one (Yama's ptrace_scope 1
// allows only ancestors; gdbserver is this rank's child).
void allowTracing();

}  // namespace cohort::launch::detail
