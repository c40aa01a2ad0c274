#pragma once

// A scripted HTTP server for tests of cohort's HTTP clients (blob storage,
// the managed-identity endpoint): handlers are set on server(). Header-only,
// for the tests that link cpp-httplib.

#include <httplib.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace cohort::test {

// An HTTP server on a free loopback port, serving from a thread. stall()
// blocks a handler until the server is destroyed.
class FakeServer {
 public:
  FakeServer() {
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~FakeServer() {
    {
      std::lock_guard<std::mutex> g(mutex_);
      released_ = true;
    }
    cv_.notify_all();
    while (!server_.is_running()) std::this_thread::yield();
    server_.stop();
    thread_.join();
  }
  httplib::Server& server() { return server_; }
  int port() const { return port_; }
  // A path-style URL with a SAS whose signature must never be printed.
  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + "/devstoreaccount1/" + path +
           "?sv=2021-08-06&sp=r&sig=FAKE%2BSIGNATURE%3D";
  }
  void stall() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return released_; });
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool released_ = false;
};

}  // namespace cohort::test
