// The rendezvous store's wire (comm/detail/store_wire.h): framing, the
// token handshake, and socket I/O bounded by deadlines.

#include "comm/detail/store_wire.h"

#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "cohort/comm/store.h"

namespace cohort::comm::detail {
namespace {

constexpr char kMagic[16] = {'C', 'O', 'H', 'O', 'R', 'T', '-', 'S',
                             'T', 'O', 'R', 'E', '/', '1', '\n', '\0'};
constexpr size_t kNonce = 32;
constexpr size_t kMac = 32;

void putU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void putI64(std::string& out, int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  uint64_t take(size_t bytes, const char* what) {
    if (s_.size() - pos_ < bytes) {
      throw WireError(fmt::format("store message cut short at byte {} ({})", pos_, what));
    }
    uint64_t v = 0;
    for (size_t i = 0; i < bytes; ++i) {
      v |= static_cast<uint64_t>(static_cast<unsigned char>(s_[pos_ + i])) << (8 * i);
    }
    pos_ += bytes;
    return v;
  }
  std::string bytes(size_t n) {
    if (s_.size() - pos_ < n) {
      throw WireError(fmt::format("store message cut short at byte {}: an item of {} bytes", pos_, n));
    }
    std::string out = s_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  bool done() const { return pos_ == s_.size(); }
  size_t pos() const { return pos_; }

 private:
  const std::string& s_;
  size_t pos_ = 0;
};

int remainingMs(Deadline deadline) {
  if (!deadline) return -1;
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

// Waits until fd is ready for `events`; throws at the deadline.
void awaitReady(int fd, short events, Deadline deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int ms = remainingMs(deadline);
    const int r = ::poll(&p, 1, ms);
    if (r > 0) return;
    if (r == 0) throw WireError(fmt::format("timed out {}", what));
    if (errno != EINTR) throw WireError(fmt::format("{}: {}", what, std::strerror(errno)));
  }
}

// Reads exactly n bytes. False when the peer closed before the first byte.
bool recvExact(int fd, char* out, size_t n, Deadline deadline, const char* what) {
  size_t got = 0;
  while (got < n) {
    awaitReady(fd, POLLIN, deadline, what);
    const ssize_t r = ::recv(fd, out + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r == 0) {
      if (got == 0) return false;
      throw WireError(fmt::format("connection closed in the middle of {}", what));
    } else if (errno != EINTR && errno != EAGAIN) {
      throw WireError(fmt::format("{}: {}", what, std::strerror(errno)));
    }
  }
  return true;
}

void recvOrThrow(int fd, char* out, size_t n, Deadline deadline, const char* what) {
  if (!recvExact(fd, out, n, deadline, what)) {
    throw WireError(fmt::format("connection closed before {}", what));
  }
}

std::string mac(const std::string& token, const char* label, const std::string& first,
                const std::string& second) {
  if (token.empty()) return std::string(kMac, '\0');
  std::string data = std::string(label) + first + second;
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &length) ==
          nullptr ||
      length != kMac) {
    throw WireError("HMAC-SHA256 failed");
  }
  return std::string(reinterpret_cast<const char*>(out), kMac);
}

bool sameBytes(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string randomBytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    throw WireError("no random bytes for the store handshake");
  }
  return out;
}

}  // namespace

std::string encode(const Message& m) {
  std::string body;
  body.push_back(static_cast<char>(m.code));
  putI64(body, m.number);
  putU32(body, static_cast<uint32_t>(m.items.size()));
  for (const auto& item : m.items) {
    putU32(body, static_cast<uint32_t>(item.size()));
    body += item;
  }
  if (body.size() > kMaxMessageBytes || m.items.size() > kMaxItems) {
    throw WireError(fmt::format("a store message of {} bytes and {} items is over the limit "
                                "({} bytes, {} items)",
                                body.size(), m.items.size(), kMaxMessageBytes, kMaxItems));
  }
  std::string out;
  putU32(out, static_cast<uint32_t>(body.size()));
  return out + body;
}

Message decodeBody(const std::string& body) {
  Reader r(body);
  Message m;
  m.code = static_cast<uint8_t>(r.take(1, "code"));
  m.number = static_cast<int64_t>(r.take(8, "number"));
  const uint64_t count = r.take(4, "item count");
  if (count > kMaxItems) {
    throw WireError(fmt::format("store message with {} items (at most {})", count, kMaxItems));
  }
  m.items.reserve(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) {
    const auto n = static_cast<size_t>(r.take(4, "item length"));
    m.items.push_back(r.bytes(n));
  }
  if (!r.done()) {
    throw WireError(fmt::format("store message has {} bytes after its last item",
                                body.size() - r.pos()));
  }
  return m;
}

Message serve(KeyValueTable& table, const Message& q) {
  Message a;
  a.code = static_cast<uint8_t>(Status::ok);
  auto need = [&](size_t n, const char* op) {
    if (q.items.size() != n) {
      throw WireError(fmt::format("{} takes {} item(s), got {}", op, n, q.items.size()));
    }
  };
  const auto timeout = std::chrono::milliseconds(std::max<int64_t>(0, q.number));
  try {
    switch (static_cast<Op>(q.code)) {
      case Op::set:
        need(2, "set");
        table.set(q.items[0], q.items[1]);
        break;
      case Op::compareSet:
        need(3, "compareSet");
        a.items.push_back(table.compareSet(q.items[0], q.items[1], q.items[2]));
        break;
      case Op::get: {
        need(1, "get");
        auto v = table.get(q.items[0], timeout);
        if (v) {
          a.items.push_back(std::move(*v));
        } else {
          a.code = static_cast<uint8_t>(Status::timeout);
        }
        break;
      }
      case Op::add:
        need(1, "add");
        a.number = table.add(q.items[0], q.number);
        break;
      case Op::erase:
        need(1, "erase");
        a.number = table.erase(q.items[0]) ? 1 : 0;
        break;
      case Op::check:
        a.number = table.check(q.items) ? 1 : 0;
        break;
      case Op::numKeys:
        a.number = table.size();
        break;
      case Op::wait:
        if (!table.wait(q.items, timeout)) a.code = static_cast<uint8_t>(Status::timeout);
        break;
      default:
        throw WireError(fmt::format("unknown store operation {}", q.code));
    }
  } catch (const std::exception& e) {
    a = Message{};
    a.code = static_cast<uint8_t>(Status::error);
    a.items.emplace_back(e.what());
  }
  return a;
}

void sendAll(int fd, const std::string& data, Deadline deadline) {
  size_t sent = 0;
  while (sent < data.size()) {
    awaitReady(fd, POLLOUT, deadline, "sending to the store");
    const ssize_t r = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (r >= 0) {
      sent += static_cast<size_t>(r);
    } else if (errno != EINTR && errno != EAGAIN) {
      throw WireError(fmt::format("sending to the store: {}", std::strerror(errno)));
    }
  }
}

std::optional<Message> readMessage(int fd, Deadline deadline) {
  char prefix[4];
  if (!recvExact(fd, prefix, 4, deadline, "a store message")) return std::nullopt;
  uint32_t length = 0;
  for (int i = 0; i < 4; ++i) length |= static_cast<uint32_t>(static_cast<unsigned char>(prefix[i])) << (8 * i);
  if (length > kMaxMessageBytes) {
    throw WireError(fmt::format("store message of {} bytes (at most {})", length, kMaxMessageBytes));
  }
  // The body grows as its bytes arrive: a peer that claims 64 MiB and sends
  // little costs little.
  constexpr size_t kChunk = size_t{1} << 20;
  std::string body;
  while (body.size() < length) {
    const size_t at = body.size();
    const size_t n = std::min<size_t>(kChunk, length - at);
    body.resize(at + n);
    recvOrThrow(fd, body.data() + at, n, deadline, "a store message");
  }
  return decodeBody(body);
}

bool acceptHandshake(int fd, const std::string& token, Deadline deadline) {
  const std::string nonceS = randomBytes(kNonce);
  std::string hello(kMagic, sizeof kMagic);
  hello.push_back(token.empty() ? 0 : 1);
  sendAll(fd, hello + nonceS, deadline);
  std::string reply(kNonce + kMac, '\0');
  recvOrThrow(fd, reply.data(), reply.size(), deadline, "the client's handshake");
  const std::string nonceC = reply.substr(0, kNonce);
  const bool ok =
      token.empty() || sameBytes(reply.substr(kNonce), mac(token, "cohort store client", nonceS, nonceC));
  std::string verdict(1, ok ? 1 : 0);
  verdict += ok ? mac(token, "cohort store server", nonceC, nonceS) : std::string(kMac, '\0');
  sendAll(fd, verdict, deadline);
  return ok;
}

void offerHandshake(int fd, const std::string& token, Deadline deadline) {
  std::string hello(sizeof kMagic + 1 + kNonce, '\0');
  recvOrThrow(fd, hello.data(), hello.size(), deadline, "the store's greeting");
  if (hello.compare(0, sizeof kMagic, std::string(kMagic, sizeof kMagic)) != 0) {
    throw WireError("the peer is not a cohort rendezvous store (is the port another service's?)");
  }
  const bool required = hello[sizeof kMagic] != 0;
  if (required && token.empty()) {
    throw WireError(
        "the store requires the job's store token: set COHORT_STORE_TOKEN or "
        "distribution.store_token_file on every machine (docs/security.md)");
  }
  if (!required && !token.empty()) {
    throw WireError("this rank holds a store token but the store asks for none: it was started "
                    "without the job's token, or is not this job's store");
  }
  const std::string nonceS = hello.substr(sizeof kMagic + 1);
  const std::string nonceC = randomBytes(kNonce);
  sendAll(fd, nonceC + mac(token, "cohort store client", nonceS, nonceC), deadline);
  std::string verdict(1 + kMac, '\0');
  recvOrThrow(fd, verdict.data(), verdict.size(), deadline, "the store's verdict");
  if (verdict[0] != 1) {
    throw WireError("the store refused this rank's store token (COHORT_STORE_TOKEN or "
                    "distribution.store_token_file differs from the one the store was started with)");
  }
  if (!sameBytes(verdict.substr(1), mac(token, "cohort store server", nonceC, nonceS))) {
    throw WireError("the store could not prove it holds the job's store token");
  }
}

int connectTo(const std::string& host, int port, Clock::time_point deadline) {
  const std::string where = fmt::format("{}:{}", host, port);
  std::string last = "no address";
  auto pause = std::chrono::milliseconds(20);
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int g = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    if (g != 0) {
      last = ::gai_strerror(g);
    } else {
      for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
        const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
          last = std::strerror(errno);
          continue;
        }
        if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
          ::freeaddrinfo(found);
          const int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          return fd;
        }
        last = std::strerror(errno);
        ::close(fd);
      }
      ::freeaddrinfo(found);
    }
    if (Clock::now() + pause >= deadline) {
      throw WireError(fmt::format("cannot connect to the rendezvous store at {}: {}", where, last));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(1000));
  }
}

}  // namespace cohort::comm::detail
