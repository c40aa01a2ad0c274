#pragma once

// The rendezvous store's wire: framing, the handshake that checks the job's
// store token, and socket I/O bounded by deadlines. No LibTorch.
//
// A connection opens with the handshake:
//
//   server -> client  "COHORT-STORE/1\n\0" (16) | flags u8 (1: token required) | nonce_s (32)
//   client -> server  nonce_c (32) | HMAC-SHA256(token, "cohort store client" | nonce_s | nonce_c)
//   server -> client  verdict u8 (1: accepted) | HMAC-SHA256(token, "cohort store server" | nonce_c | nonce_s)
//
// Neither side sends the token: each proves it knows it, over the other's
// fresh nonce, so a recorded handshake cannot be replayed. Without a token
// the MACs are zeros and ignored. Then every request and every reply is one
// message:
//
//   length u32 (of what follows) | code u8 | number i64 | count u32 | (length u32 | bytes) * count
//
// integers little-endian. A request's code is the operation (Op) and its
// number a timeout (ms) or an amount; a reply's code is a Status.

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace cohort::comm {
class KeyValueTable;
}

namespace cohort::comm::detail {

using Clock = std::chrono::steady_clock;
// When an I/O call gives up; nullopt: never (a server waiting for a request).
using Deadline = std::optional<Clock::time_point>;

constexpr size_t kMaxMessageBytes = 64u << 20;  // a store holds addresses and small values
constexpr size_t kMaxItems = 1u << 16;

enum class Op : uint8_t { set = 1, compareSet, get, add, erase, check, numKeys, wait };
enum class Status : uint8_t { ok = 0, timeout = 1, error = 2 };

struct Message {
  uint8_t code = 0;
  int64_t number = 0;
  std::vector<std::string> items;
};

// A malformed message, a broken handshake or a connection that failed; the
// text says which.
class WireError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string encode(const Message& m);
// Decodes what follows the length prefix. Throws WireError on a malformed body.
Message decodeBody(const std::string& body);

// Carries out one request on the table and says how it went. Never throws:
// failures become a Status::error reply with the reason.
Message serve(KeyValueTable& table, const Message& request);

// Sends all of `data`; throws WireError when the peer is gone or the deadline passes.
void sendAll(int fd, const std::string& data, Deadline deadline);
// Reads one message. nullopt when the peer closed the connection before a
// new message; throws WireError on a malformed or cut message or at the deadline.
std::optional<Message> readMessage(int fd, Deadline deadline);

// The server's side of the handshake: true when the client proved it holds
// `token` (or none is required). Throws WireError when the connection fails.
bool acceptHandshake(int fd, const std::string& token, Deadline deadline);
// The client's side. Throws WireError saying why the store refused (wrong or
// missing token), or that the server does not know the token.
void offerHandshake(int fd, const std::string& token, Deadline deadline);

// A TCP connection to host:port, retrying refused connections (a server not
// up yet) until the deadline. Throws WireError naming the address.
int connectTo(const std::string& host, int port, Clock::time_point deadline);

}  // namespace cohort::comm::detail
