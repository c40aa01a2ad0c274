// cohort_test_delay_relay: added latency between test hosts, for a kernel
// without netem (util/netfault.h). It runs inside a host's network
// namespace, where an nftables rule redirects every TCP connection the host
// opens toward another host to this relay's port. For each connection it
// reads the original destination (SO_ORIGINAL_DST), connects there with its
// own packets marked so the rule lets them pass, and forwards both
// directions, holding every chunk it reads for the current delay before it
// writes it on. A connection's bytes keep their order; the one-way latency
// of each direction grows by the delay.
//
//   cohort_test_delay_relay --port P --mark M --delay-file F
//
// F holds the delay in milliseconds and is read again every 50 ms, so a
// test changes the latency of established connections by rewriting it.
// "listening on P" on stderr says the relay is ready; F.relayed holds the
// number of connections relayed so far (a file, not a line per connection:
// nothing reads the relay's stderr while it runs, and a full pipe would
// stop it). A destination that refuses the connection gets the client's
// connection reset. Ends when killed.

#include <arpa/inet.h>
#include <linux/netfilter_ipv4.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<int> gDelayMs{0};
std::atomic<long> gRelayed{0};

// Chunks read from one side, due to be written to the other. Bounded: the
// reader waits while kMaxQueued bytes are in flight, so a stalled receiver
// stalls its sender as TCP would.
class Pipe {
 public:
  static constexpr size_t kMaxQueued = 8 << 20;

  void push(std::vector<char> bytes, bool end) {
    std::unique_lock<std::mutex> lock(mutex_);
    space_.wait(lock, [&] { return queued_ < kMaxQueued; });
    queued_ += bytes.size();
    chunks_.push_back({Clock::now() + std::chrono::milliseconds(gDelayMs.load()), std::move(bytes), end});
    ready_.notify_one();
  }

  // The next chunk, once it is due. `end`: the source closed.
  std::vector<char> pop(bool& end) {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return !chunks_.empty(); });
    const Clock::time_point due = chunks_.front().due;
    lock.unlock();
    std::this_thread::sleep_until(due);
    lock.lock();
    Chunk c = std::move(chunks_.front());
    chunks_.pop_front();
    queued_ -= c.bytes.size();
    space_.notify_one();
    end = c.end;
    return std::move(c.bytes);
  }

 private:
  struct Chunk {
    Clock::time_point due;
    std::vector<char> bytes;
    bool end;
  };
  std::mutex mutex_;
  std::condition_variable ready_, space_;
  std::deque<Chunk> chunks_;
  size_t queued_ = 0;
};

bool sendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// One direction of a connection: a reader that queues, a writer that sends
// when due. When the source ends (or fails), the destination's sending side
// is shut down once the queued bytes are out; when the destination fails,
// the source is shut down.
void forward(int from, int to) {
  auto pipe = std::make_shared<Pipe>();
  std::thread writer([pipe, from, to] {
    for (;;) {
      bool end = false;
      const std::vector<char> bytes = pipe->pop(end);
      if (end || !sendAll(to, bytes.data(), bytes.size())) {
        ::shutdown(to, SHUT_WR);
        // The destination is gone: the source hears of it, and the reader
        // stops.
        if (!end) ::shutdown(from, SHUT_RDWR);
        // Keep draining so the reader is never left waiting for space.
        while (!end) pipe->pop(end);
        return;
      }
    }
  });
  std::vector<char> buf(64 << 10);
  for (;;) {
    const ssize_t n = ::recv(from, buf.data(), buf.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      pipe->push({}, true);
      break;
    }
    pipe->push(std::vector<char>(buf.begin(), buf.begin() + n), false);
  }
  writer.join();
}

void serve(int client, uint32_t mark) {
  sockaddr_in dst{};
  socklen_t len = sizeof(dst);
  if (::getsockopt(client, SOL_IP, SO_ORIGINAL_DST, &dst, &len) != 0) {
    ::close(client);
    return;
  }
  const int up = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ::setsockopt(up, SOL_SOCKET, SO_MARK, &mark, sizeof(mark));
  timeval tv{20, 0};
  ::setsockopt(up, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (::connect(up, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)) != 0) {
    // As close to "refused" as a connection already accepted can get.
    linger l{1, 0};
    ::setsockopt(client, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    ::close(client);
    ::close(up);
    return;
  }
  timeval none{0, 0};
  ::setsockopt(up, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof(none));
  ++gRelayed;
  const int one = 1;
  ::setsockopt(up, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::thread back([client, up] { forward(up, client); });
  forward(client, up);
  back.join();
  ::close(client);
  ::close(up);
}

int readDelay(const std::string& path) {
  std::ifstream in(path);
  int ms = 0;
  return (in >> ms) && ms >= 0 ? ms : -1;
}

}  // namespace

int main(int argc, char** argv) {
  int port = 0;
  uint32_t mark = 0;
  std::string delayFile;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--port") port = std::atoi(argv[i + 1]);
    if (a == "--mark") mark = static_cast<uint32_t>(std::strtoul(argv[i + 1], nullptr, 0));
    if (a == "--delay-file") delayFile = argv[i + 1];
  }
  if (port <= 0 || mark == 0 || delayFile.empty()) {
    std::fprintf(stderr, "usage: %s --port P --mark M --delay-file F\n", argv[0]);
    return 2;
  }
  gDelayMs = std::max(0, readDelay(delayFile));
  std::thread([delayFile] {
    long reported = -1;
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const int ms = readDelay(delayFile);
      if (ms >= 0) gDelayMs = ms;
      if (const long n = gRelayed.load(); n != reported) {
        const std::string tmp = delayFile + ".relayed.tmp";
        std::ofstream(tmp) << n << "\n";
        std::rename(tmp.c_str(), (delayFile + ".relayed").c_str());
        reported = n;
      }
    }
  }).detach();
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 512) != 0) {
    std::fprintf(stderr, "cannot listen on port %d: %s\n", port, std::strerror(errno));
    return 1;
  }
  std::fprintf(stderr, "listening on %d\n", port);
  std::fflush(stderr);
  for (;;) {
    const int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      std::fprintf(stderr, "accept: %s\n", std::strerror(errno));
      return 1;
    }
    std::thread(serve, c, mark).detach();
  }
}
