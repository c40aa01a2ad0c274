// The rendezvous store's requests (src/comm/store_wire.cc), as a server
// reads them from a connection that passed the handshake.
//
// Input: the bytes a client sends. They are read back through a socket pair
// by readMessage, as the server does; every message is served on a table.
// Contract: malformed input ends in WireError (the server drops the
// connection), never another exception; a decoded message encodes back to a
// message that decodes to the same; serve() never throws, and answers
// every request with a known status. The table is stopped, so requests that
// wait for keys return at once instead of waiting out their timeouts.

#include <sys/socket.h>
#include <unistd.h>

#include "cohort/comm/store.h"
#include "comm/detail/store_wire.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort;
  using namespace cohort::comm::detail;
  if (size > 100000) return 0;  // stays within a socket pair's buffer
  int fds[2];
  fuzz::require(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0, "socketpair");
  const int bufferBytes = 1 << 20;
  ::setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &bufferBytes, sizeof bufferBytes);
  fuzz::require(::write(fds[0], data, size) == static_cast<ssize_t>(size), "socket pair write");
  ::close(fds[0]);
  comm::KeyValueTable table;
  table.set("present", "1");
  table.stop();
  try {
    for (int n = 0; n < 10000; ++n) {
      auto m = readMessage(fds[1], Clock::now() + std::chrono::seconds(5));
      if (!m) break;
      const std::string frame = encode(*m);
      const Message again = decodeBody(frame.substr(4));
      fuzz::require(again.code == m->code && again.number == m->number && again.items == m->items,
                    "a store message does not survive encode and decode");
      const Message reply = serve(table, *m);
      fuzz::require(reply.code <= static_cast<uint8_t>(Status::error), "a reply of unknown status");
      fuzz::require(reply.code != static_cast<uint8_t>(Status::error) || !reply.items.empty(),
                    "an error reply without a reason");
    }
  } catch (const WireError&) {
    // The documented outcome of a malformed message: the connection ends.
  } catch (const std::exception& e) {
    ::close(fds[1]);
    fuzz::finding(std::string("a store request escaped as ") + typeid(e).name() + ": " + e.what());
  }
  ::close(fds[1]);
  return 0;
}
