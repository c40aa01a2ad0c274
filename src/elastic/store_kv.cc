// Rendezvous on cohort's own store (cohort/comm/store.h): the zero-dependency
// choice, hosted by the first agent on the machine the URL names. It has no
// versions and no leases, so they are kept in the values:
//
//   a versioned key   "<version>\n<value>", changed with compareSet on the
//                     whole text, so a write based on a stale read fails;
//   a key kept alive  a counter the owner increments every aliveTtl / 4;
//                     a reader calls it dead once it has not seen the
//                     counter move for aliveTtl by its own clock (no clocks
//                     are compared across machines).
//
// The store is one process: when the agent hosting it ends, rendezvous
// ends with it (docs/elastic.md). etcd as a 3-member cluster has no such
// single point of failure.

#include <fmt/format.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "cohort/comm/comm.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "elastic/detail/kv_backends.h"

namespace cohort::elastic::detail {
namespace {

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<uint8_t>;

std::string str(const Bytes& b) { return {b.begin(), b.end()}; }
Bytes bytes(const std::string& s) { return {s.begin(), s.end()}; }

std::string encode(int64_t version, const std::string& value) {
  return std::to_string(version) + "\n" + value;
}

Versioned decode(const std::string& raw, const std::string& key) {
  const size_t nl = raw.find('\n');
  try {
    if (nl != std::string::npos) return {raw.substr(nl + 1), std::stoll(raw.substr(0, nl))};
  } catch (const std::exception&) {
  }
  throw CommError(fmt::format("rendezvous store: key {} holds no versioned value", key));
}

class StoreKv final : public Kv {
 public:
  StoreKv(const std::string& host, int port, const KvOptions& options)
      : where_(fmt::format("{}:{}", host, port)), options_(options) {
    try {
      comm::HostedStore hosted = comm::hostStore(host, port, options.retryFor, options.storeToken);
      store_ = hosted.store;
      hosting_ = true;
    } catch (const CommError& e) {
      // Not an address of this machine, or another agent here hosts it.
      log::debug("rendezvous store {}: not hosted here ({})", where_, e.what());
    }
    if (!store_) store_ = comm::connectStoreClient(host, port, options.storeToken, options.retryFor);
  }

  ~StoreKv() override {
    try {
      release();
    } catch (const std::exception& e) {
      log::debug("rendezvous store: {}", e.what());
    }
  }

  std::string describe() const override {
    return fmt::format("cohort store at {}{}", where_, hosting_ ? " (hosted by this agent)" : "");
  }
  bool hosting() const override { return hosting_; }

  std::optional<Versioned> get(const std::string& key) override {
    std::lock_guard<std::mutex> g(mutex_);
    return read(key);
  }

  bool compareAndSet(const std::string& key, int64_t version, const std::string& value) override {
    std::lock_guard<std::mutex> g(mutex_);
    return guarded("compare-and-set " + key, [&] {
      std::string expected;
      if (version != 0) {
        if (!store_->check({key})) return false;
        expected = str(store_->get(key));
        if (decode(expected, key).version != version) return false;
      }
      const std::string desired = encode(version + 1, value);
      return str(store_->compareSet(key, bytes(expected), bytes(desired))) == desired;
    });
  }

  void put(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> g(mutex_);
    guarded("write " + key, [&] {
      const auto old = read(key);
      store_->set(key, bytes(encode(old ? old->version + 1 : 1, value)));
      return true;
    });
  }

  void keepAlive(const std::string& key, const std::string& value) override {
    release();
    {
      std::lock_guard<std::mutex> g(mutex_);
      guarded("write " + key, [&] {
        store_->set(key + "/value", bytes(value));
        store_->add(key, 1);
        return true;
      });
      aliveKey_ = key;
      stop_ = false;
    }
    renewer_ = std::thread([this] { renewLoop(); });
  }

  void release() override {
    std::string key;
    {
      std::lock_guard<std::mutex> g(mutex_);
      key = aliveKey_;
      aliveKey_.clear();
      stop_ = true;
    }
    cv_.notify_all();
    if (renewer_.joinable()) renewer_.join();
    if (!key.empty()) {
      std::lock_guard<std::mutex> g(mutex_);
      guarded("delete " + key, [&] { return store_->deleteKey(key); });
    }
  }

  bool alive(const std::string& key) override {
    std::lock_guard<std::mutex> g(mutex_);
    const bool present = guarded("read " + key, [&] { return store_->check({key}); });
    const auto now = Clock::now();
    if (!present) {
      seen_.erase(key);
      return false;
    }
    const std::string count = str(store_->get(key));
    auto it = seen_.find(key);
    if (it == seen_.end() || it->second.count != count) {
      seen_[key] = {count, now};
      return true;
    }
    return now - it->second.since < options_.aliveTtl;
  }

  bool waitChange(const std::string& key, int64_t since, std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const auto v = get(key);
      if ((v ? v->version : 0) != since) return true;
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(50),
                                                            deadline - Clock::now()));
    }
  }

 private:
  struct Seen {
    std::string count;
    Clock::time_point since;
  };

  // Caller holds mutex_.
  std::optional<Versioned> read(const std::string& key) {
    return guarded("read " + key, [&]() -> std::optional<Versioned> {
      if (!store_->check({key})) return std::nullopt;
      return decode(str(store_->get(key)), key);
    });
  }

  template <class F>
  auto guarded(const std::string& what, F f) -> decltype(f()) {
    try {
      return f();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw CommError(fmt::format("rendezvous store at {}: cannot {}: {}", where_, what, e.what()));
    }
  }

  void renewLoop() {
    const auto every = std::max(std::chrono::milliseconds(50), options_.aliveTtl / 4);
    std::unique_lock<std::mutex> lock(mutex_);
    while (!cv_.wait_for(lock, every, [&] { return stop_; })) {
      try {
        store_->add(aliveKey_, 1);
      } catch (const std::exception& e) {
        log::warn("rendezvous store at {}: cannot renew {}: {}", where_, aliveKey_, e.what());
      }
    }
  }

  const std::string where_;
  const KvOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
  bool hosting_ = false;
  std::mutex mutex_;  // one request at a time on the connection
  std::condition_variable cv_;
  bool stop_ = false;
  std::string aliveKey_;
  std::map<std::string, Seen> seen_;
  std::thread renewer_;
};

}  // namespace

std::unique_ptr<Kv> connectStoreKv(const std::string& host, int port, const KvOptions& options) {
  return std::make_unique<StoreKv>(host, port, options);
}

}  // namespace cohort::elastic::detail
