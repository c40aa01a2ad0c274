// cohort's rendezvous store as a c10d::Store (comm/detail/store_client.h).
//
// A RemoteStore is one connection: requests on it are serialized, as on a
// TCPStore client (openStoreClient gives a background thread its own). A
// request that waits for keys is timed by the server; the client gives up
// on a reply a margin later, so a dead server cannot block it forever.

#include "comm/detail/store_client.h"

#include <fmt/format.h>
#include <unistd.h>

#include <mutex>

#include "cohort/core/error.h"
#include "comm/detail/store_wire.h"

namespace cohort::comm::detail {
namespace {

using Bytes = std::vector<uint8_t>;

std::string str(const Bytes& b) { return {b.begin(), b.end()}; }
Bytes bytes(const std::string& s) { return {s.begin(), s.end()}; }

// How long past its own timeout a request may take to be answered.
constexpr std::chrono::seconds kReplyMargin{30};

std::string keysText(const std::vector<std::string>& keys) {
  return keys.size() == 1 ? "key " + keys[0] : fmt::format("keys {}", fmt::join(keys, ", "));
}

class RemoteStore final : public c10d::Store {
 public:
  RemoteStore(const std::string& host, int port, const std::string& token,
              std::chrono::milliseconds timeout)
      : Store(timeout), where_(fmt::format("{}:{}", host, port)) {
    const auto deadline = Clock::now() + timeout;
    try {
      fd_ = connectTo(host, port, deadline);
    } catch (const WireError& e) {
      throw CommError(e.what());
    }
    try {
      offerHandshake(fd_, token, deadline);
    } catch (const WireError& e) {
      ::close(fd_);
      throw ConfigError(fmt::format("rendezvous store at {}: {}", where_, e.what()));
    }
  }
  ~RemoteStore() override { ::close(fd_); }

  void set(const std::string& key, const Bytes& value) override {
    call(Op::set, 0, {key, str(value)}, "set " + key);
  }
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    return bytes(call(Op::compareSet, 0, {key, str(expected), str(desired)}, "compareSet " + key)
                     .items.at(0));
  }
  Bytes get(const std::string& key) override {
    return bytes(call(Op::get, timeout_.count(), {key}, "get " + key).items.at(0));
  }
  int64_t add(const std::string& key, int64_t value) override {
    return call(Op::add, value, {key}, "add " + key).number;
  }
  bool deleteKey(const std::string& key) override {
    return call(Op::erase, 0, {key}, "delete " + key).number != 0;
  }
  bool check(const std::vector<std::string>& keys) override {
    return call(Op::check, 0, keys, "check " + keysText(keys)).number != 0;
  }
  int64_t getNumKeys() override { return call(Op::numKeys, 0, {}, "count keys").number; }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    call(Op::wait, t.count(), keys, "wait for " + keysText(keys));
  }

 private:
  Message call(Op op, int64_t number, std::vector<std::string> items, const std::string& what) {
    std::lock_guard<std::mutex> g(mutex_);
    if (broken_) {
      throw CommError(fmt::format("rendezvous store at {}: {}: the connection failed earlier",
                                  where_, what));
    }
    // Beyond a month counts as no limit, as on the server (no clock overflow).
    int64_t waitMs = (op == Op::get || op == Op::wait) ? number : timeout_.count();
    if (waitMs < 0 || waitMs > int64_t{30} * 24 * 3600 * 1000) waitMs = 0;
    const Deadline deadline =
        waitMs == 0 && (op == Op::get || op == Op::wait)
            ? Deadline{}
            : Deadline{Clock::now() + std::chrono::milliseconds(waitMs) + kReplyMargin};
    std::optional<Message> reply;
    try {
      Message m;
      m.code = static_cast<uint8_t>(op);
      m.number = number;
      m.items = std::move(items);
      sendAll(fd_, encode(m), deadline);
      reply = readMessage(fd_, deadline);
      if (!reply) throw WireError("the store closed the connection (has it stopped?)");
    } catch (const WireError& e) {
      broken_ = true;  // a reply may still be on its way: the stream is out of step
      throw CommError(fmt::format("rendezvous store at {}: {}: {}", where_, what, e.what()));
    }
    switch (static_cast<Status>(reply->code)) {
      case Status::ok:
        return std::move(*reply);
      case Status::timeout:
        throw TimeoutError(fmt::format("rendezvous store at {}: {} timed out after {} s", where_,
                                       what, number / 1000.0));
      default:
        throw CommError(fmt::format("rendezvous store at {}: {}: {}", where_, what,
                                    reply->items.empty() ? "failed" : reply->items[0]));
    }
  }

  std::string where_;
  int fd_ = -1;
  std::mutex mutex_;
  bool broken_ = false;
};

// The hosting process's own view of the table.
class LocalStore final : public c10d::Store {
 public:
  LocalStore(std::unique_ptr<StoreServer> server, std::chrono::milliseconds timeout)
      : Store(timeout), server_(std::move(server)), table_(server_->table()) {}

  void set(const std::string& key, const Bytes& value) override { table_.set(key, str(value)); }
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    return bytes(table_.compareSet(key, str(expected), str(desired)));
  }
  Bytes get(const std::string& key) override {
    auto v = table_.get(key, timeout_);
    if (!v) throw timedOut("get " + key, timeout_);
    return bytes(*v);
  }
  int64_t add(const std::string& key, int64_t value) override { return table_.add(key, value); }
  bool deleteKey(const std::string& key) override { return table_.erase(key); }
  bool check(const std::vector<std::string>& keys) override { return table_.check(keys); }
  int64_t getNumKeys() override { return table_.size(); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    if (!table_.wait(keys, t)) throw timedOut("wait for " + keysText(keys), t);
  }

 private:
  TimeoutError timedOut(const std::string& what, std::chrono::milliseconds t) const {
    return TimeoutError(fmt::format("rendezvous store (hosted here, port {}): {} timed out after {} s",
                                    server_->port(), what, t.count() / 1000.0));
  }

  std::unique_ptr<StoreServer> server_;
  KeyValueTable& table_;
};

}  // namespace

c10::intrusive_ptr<c10d::Store> connectStore(const std::string& host, int port,
                                             const std::string& token,
                                             std::chrono::milliseconds timeout) {
  return c10::make_intrusive<RemoteStore>(host, port, token, timeout);
}

HostedStoreHandle hostStoreServer(const StoreServerOptions& options,
                                  std::chrono::milliseconds timeout) {
  auto server = std::make_unique<StoreServer>(options);
  const int port = server->port();
  return {c10::make_intrusive<LocalStore>(std::move(server), timeout), port};
}

}  // namespace cohort::comm::detail
