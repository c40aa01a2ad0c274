#include "cohort/launch/fork_server.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <limits.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/launch/spawn.h"

extern char** environ;

namespace cohort::launch {
namespace {

// How long a request waits for its answer: the first one waits while the
// server loads LibTorch.
constexpr int kAnswerTimeoutMs = 120'000;

// To a socket without SIGPIPE when its other end is gone, or to a pipe.
bool writeAll(int fd, const void* data, size_t size, bool socket = true) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = socket ? ::send(fd, p, size, MSG_NOSIGNAL) : ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool readAll(int fd, void* data, size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// A region of this process's first stack that the kernel shows as its
// command line (/proc/PID/cmdline, what ps prints) or its environment
// (/proc/PID/environ): the strings argv or environ point to, end to end.
struct Shown {
  char* begin = nullptr;
  size_t size = 0;

  // The strings `list` points to, when they lie end to end.
  static Shown of(char** list) {
    Shown s;
    if (list == nullptr || list[0] == nullptr) return s;
    char* end = list[0];
    for (char** p = list; *p != nullptr; ++p) {
      if (*p != end) return {};
      end += std::strlen(*p) + 1;
    }
    s.begin = list[0];
    s.size = static_cast<size_t>(end - list[0]);
    return s;
  }

  // Writes `strings` end to end, NUL after the last to the region's end,
  // and returns pointers to them; false when they do not fit.
  bool write(const std::vector<std::string>& strings, std::vector<char*>& pointers) const {
    if (!fits(strings)) return false;
    const size_t need = bytes(strings);
    char* at = begin;
    pointers.clear();
    for (const auto& v : strings) {
      std::memcpy(at, v.c_str(), v.size() + 1);
      pointers.push_back(at);
      at += v.size() + 1;
    }
    std::memset(at, 0, size - need);
    pointers.push_back(nullptr);
    return true;
  }

  // Whether `strings` fit.
  bool fits(const std::vector<std::string>& strings) const { return begin != nullptr && bytes(strings) <= size; }

  // `strings` end to end, each with its NUL.
  static size_t bytes(const std::vector<std::string>& strings) {
    size_t n = 0;
    for (const auto& v : strings) n += v.size() + 1;
    return n;
  }
};

// The server's command line and environment, overwritten in each rank with
// the rank's own, so that ps and /proc show what exec would have. The
// server is started with room to spare in both (kArgRoom, kEnvRoom); a rank
// whose arguments or environment do not fit is refused (ENOSPC) and
// started by exec.
Shown shownArgs, shownEnv;
constexpr size_t kArgRoom = 8 << 10, kEnvRoom = 64 << 10;
constexpr const char* kEnvRoomVar = "COHORT_FORK_SERVER_ROOM";

// Set in a rank the server forked (forkServerOfThisRank).
pid_t forkedBy = 0;

// A request: the rank's signal mask, working directory, arguments and
// environment, strings ended by NUL; its standard streams go beside it.
struct Request {
  sigset_t mask;
  std::string cwd;
  std::vector<std::string> args, env;
  bool hasEnv = false;
};

void putStrings(std::string& out, const std::vector<std::string>& list) {
  const uint32_t n = static_cast<uint32_t>(list.size());
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  for (const auto& s : list) out.append(s.c_str(), s.size() + 1);
}

std::string encode(const Request& r) {
  std::string out(reinterpret_cast<const char*>(&r.mask), sizeof r.mask);
  out.push_back(r.hasEnv ? 1 : 0);
  out.append(r.cwd.c_str(), r.cwd.size() + 1);
  putStrings(out, r.args);
  putStrings(out, r.env);
  return out;
}

bool decode(const std::string& in, Request& r) {
  size_t at = sizeof r.mask + 1;
  if (in.size() < at) return false;
  std::memcpy(&r.mask, in.data(), sizeof r.mask);
  r.hasEnv = in[sizeof r.mask] != 0;
  auto string = [&](std::string& s) {
    const size_t end = in.find('\0', at);
    if (end == std::string::npos) return false;
    s = in.substr(at, end - at);
    at = end + 1;
    return true;
  };
  auto strings = [&](std::vector<std::string>& list) {
    uint32_t n = 0;
    if (in.size() < at + sizeof n) return false;
    std::memcpy(&n, in.data() + at, sizeof n);
    at += sizeof n;
    list.resize(n);
    for (auto& s : list) {
      if (!string(s)) return false;
    }
    return true;
  };
  return string(r.cwd) && strings(r.args) && strings(r.env) && !r.args.empty();
}

// The head of a request: its payload's size, with the rank's three
// standard streams beside it (SCM_RIGHTS).
struct Head {
  uint64_t size = 0;
  iovec iov{&size, sizeof size};
  alignas(cmsghdr) char control[CMSG_SPACE(3 * sizeof(int))] = {};
  msghdr msg{};
  Head() {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  Head(const Head&) = delete;
  Head& operator=(const Head&) = delete;
};

// Sends the size of `payload` with `fds` attached, then the payload.
bool sendRequest(int socket, const std::string& payload, const int (&fds)[3]) {
  Head h;
  h.size = payload.size();
  cmsghdr* c = CMSG_FIRSTHDR(&h.msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof fds);
  std::memcpy(CMSG_DATA(c), fds, sizeof fds);
  ssize_t n;
  do n = ::sendmsg(socket, &h.msg, MSG_NOSIGNAL); while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(sizeof h.size) && writeAll(socket, payload.data(), payload.size());
}

// Receives what sendRequest sent; false at the end of the stream.
bool receiveRequest(int socket, std::string& payload, int (&fds)[3]) {
  Head h;
  ssize_t n;
  do n = ::recvmsg(socket, &h.msg, MSG_CMSG_CLOEXEC | MSG_WAITALL); while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof h.size)) return false;
  const cmsghdr* c = CMSG_FIRSTHDR(&h.msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof fds)) return false;
  std::memcpy(fds, CMSG_DATA(c), sizeof fds);
  if (h.size > (64u << 20)) return false;
  payload.resize(h.size);
  return readAll(socket, payload.data(), h.size);
}

// The rank, in the fork of the fork: waits until the middle process has
// exited (the rank is then the client's child), becomes what exec would
// have made it and runs `main`. Never returns.
[[noreturn]] void becomeRank(Request& r, const int (&fds)[3], int gate, pid_t client, pid_t server,
                             ProgramMain main) {
  char go = 0;
  ssize_t n;
  do n = ::read(gate, &go, 1); while (n < 0 && errno == EINTR);
  if (n != 1) _exit(127);  // the server died before letting it go
  ::close(gate);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != client) _exit(127);
  forkedBy = server;
  for (int i = 0; i < 3; ++i) {
    if (fds[i] != i && ::dup2(fds[i], i) < 0) _exit(127);
  }
  for (int fd : fds) {
    if (fd > 2) ::close(fd);
  }
  if (::chdir(r.cwd.c_str()) != 0) {
    const std::string said = fmt::format("cohort: the fork server cannot enter {} ({})\n", r.cwd, std::strerror(errno));
    ssize_t ignored = ::write(STDERR_FILENO, said.data(), said.size());
    (void)ignored;
    _exit(127);
  }
  static std::vector<char*> argv, envp;  // for the life of the process
  if (!shownArgs.write(r.args, argv) || (r.hasEnv && !shownEnv.write(r.env, envp))) _exit(127);  // checked before
  if (r.hasEnv) environ = envp.data();
  sigprocmask(SIG_SETMASK, &r.mask, nullptr);
  std::exit(main(static_cast<int>(r.args.size()), argv.data()));
}

// Forks the rank of `r` so that the client can adopt it; its pid, or -errno.
int64_t forkRank(Request& r, const int (&fds)[3], int socket, pid_t client, ProgramMain main) {
  if (!shownArgs.fits(r.args) || (r.hasEnv && !shownEnv.fits(r.env))) return -ENOSPC;
  int ids[2], gate[2];
  if (::pipe2(ids, O_CLOEXEC) != 0) return -errno;
  if (::pipe2(gate, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(ids[0]);
    ::close(ids[1]);
    return -e;
  }
  const pid_t middle = ::fork();
  if (middle == 0) {
    const pid_t server = getppid();
    const pid_t rank = ::fork();
    if (rank == 0) {
      ::close(ids[0]);
      ::close(ids[1]);
      ::close(gate[1]);
      ::close(socket);
      becomeRank(r, fds, gate[0], client, server, main);
    }
    const int64_t said = rank < 0 ? -errno : rank;
    _exit(writeAll(ids[1], &said, sizeof said, false) ? 0 : 1);
  }
  const int forkError = errno;
  ::close(ids[1]);
  ::close(gate[0]);
  int64_t rank = -forkError;
  if (middle > 0) {
    if (!readAll(ids[0], &rank, sizeof rank)) rank = -EPIPE;
    // Once the middle process is gone, the rank is the client's child.
    while (::waitpid(middle, nullptr, 0) < 0 && errno == EINTR) {
    }
    if (rank > 0 && ::write(gate[1], "g", 1) != 1) rank = -EPIPE;
  }
  ::close(ids[0]);
  ::close(gate[1]);
  return rank;
}

}  // namespace

pid_t forkServerOfThisRank() { return forkedBy; }

int serveForks(int argc, char** argv, ProgramMain main) {
  // The regions to show each rank's own in, before anything changes
  // environ; the environment this process goes on with is copied.
  shownArgs = Shown::of(argv);
  shownEnv = Shown::of(environ);
  if (argc < 1) return 2;
  static std::vector<std::string> keep;
  static std::vector<char*> copy;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, kEnvRoomVar, std::strlen(kEnvRoomVar)) != 0) keep.emplace_back(*e);
  }
  for (auto& e : keep) copy.push_back(e.data());
  copy.push_back(nullptr);
  environ = copy.data();
  const char* fdText = std::getenv(kForkServerFdVar);
  if (fdText == nullptr) {
    std::fprintf(stderr, "cohort: %s is for cohort's own launchers (%s is not set)\n", kForkServerArg,
                 kForkServerFdVar);
    return 2;
  }
  const int socket = std::atoi(fdText);
  ::fcntl(socket, F_SETFD, FD_CLOEXEC);
  ::unsetenv(kForkServerFdVar);
  const pid_t client = getppid();
  for (;;) {
    std::string payload;
    int fds[3] = {-1, -1, -1};
    if (!receiveRequest(socket, payload, fds)) return 0;
    Request r;
    const int64_t answer = decode(payload, r) ? forkRank(r, fds, socket, client, main) : -EINVAL;
    for (int fd : fds) ::close(fd);
    if (!writeAll(socket, &answer, sizeof answer)) return 0;
  }
}

ForkServer* ForkServer::forEngine(const std::string& exe) {
  static std::mutex mutex;
  static std::unique_ptr<ForkServer> server;
  static bool tried = false;
  const std::lock_guard lock(mutex);
  if (server) return server->pid_ > 0 ? server.get() : nullptr;
  const size_t slash = exe.rfind('/');
  if (exe.substr(slash == std::string::npos ? 0 : slash + 1) != kEngineProgram) return nullptr;
  const char* off = std::getenv(kForkServerVar);
  if (tried || (off != nullptr && std::strcmp(off, "0") == 0)) return nullptr;
  tried = true;
  // Before the server exists, so that its descendants know of a subreaper.
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    log::warn("ranks are started by exec: PR_SET_CHILD_SUBREAPER failed ({})", std::strerror(errno));
    return nullptr;
  }
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    log::warn("ranks are started by exec: socketpair failed ({})", std::strerror(errno));
    return nullptr;
  }
  ::fcntl(sv[1], F_SETFD, 0);  // the server's end survives exec
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    if (entry.rfind("OMP_NUM_THREADS=", 0) != 0 && entry.rfind(kForkServerFdVar + std::string("="), 0) != 0) {
      env.push_back(entry);
    }
  }
  // As in a rank's environment (rankEnvironment): OpenMP reads it as it loads.
  env.emplace_back("OMP_NUM_THREADS=1");
  if (auto wait = env::rankOpenMpWait()) env.push_back(wait->first + "=" + wait->second);
  env.push_back(fmt::format("{}={}", kForkServerFdVar, sv[1]));
  env.push_back(fmt::format("{}={}", kEnvRoomVar, std::string(kEnvRoom, '.')));
  sigset_t all;
  sigfillset(&all);  // it stops when this process does, and lets a rank take signals itself
  pid_t pid = -1;
  try {
    pid = spawn(exe, {exe, kForkServerArg, std::string(kArgRoom, ' ')}, &env, &all, "the fork server");
  } catch (const std::exception& e) {
    log::warn("ranks are started by exec: {}", e.what());
  }
  ::close(sv[1]);
  if (pid < 0) {
    ::close(sv[0]);
    return nullptr;
  }
  server.reset(new ForkServer(pid, sv[0]));
  log::debug("ranks are forked by the fork server (pid {}), which loads LibTorch once", pid);
  return server.get();
}

ForkServer::~ForkServer() {
  const std::lock_guard lock(mutex_);
  stop();
}

void ForkServer::stop() {
  if (pid_ < 0) return;
  ::close(fd_);
  ::kill(pid_, SIGKILL);
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  fd_ = -1;
}

pid_t ForkServer::start(const std::vector<std::string>& args, const std::vector<std::string>* env,
                        const sigset_t* mask) {
  const std::lock_guard lock(mutex_);
  if (pid_ < 0) return -1;
  Request r;
  if (mask != nullptr) {
    r.mask = *mask;
  } else {
    pthread_sigmask(SIG_SETMASK, nullptr, &r.mask);
  }
  char cwd[PATH_MAX];
  if (::getcwd(cwd, sizeof cwd) == nullptr) return -1;
  r.cwd = cwd;
  r.args = args;
  r.hasEnv = env != nullptr;
  if (env != nullptr) r.env = *env;
  // A closed standard stream is passed as /dev/null: a rank exec started
  // would have found it closed, and would have opened its files there.
  int streams[3] = {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO};
  int opened[3] = {-1, -1, -1};
  for (int i = 0; i < 3; ++i) {
    if (::fcntl(i, F_GETFD) < 0) streams[i] = opened[i] = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  }
  struct Close {
    int* fds;
    ~Close() {
      for (int i = 0; i < 3; ++i) {
        if (fds[i] >= 0) ::close(fds[i]);
      }
    }
  } closeOpened{opened};
  std::string failure;
  int64_t answer = 0;
  pollfd p{fd_, POLLIN, 0};
  if (!sendRequest(fd_, encode(r), streams)) {
    failure = "it did not take a request";
  } else if (int ready; (ready = ::poll(&p, 1, kAnswerTimeoutMs)) <= 0) {
    failure = ready == 0 ? fmt::format("no answer within {} s", kAnswerTimeoutMs / 1000) : "poll failed";
  } else if (!readAll(fd_, &answer, sizeof answer)) {
    failure = "it ended";
  } else if (answer == -ENOSPC) {
    return -1;  // arguments or environment larger than the room the server keeps: exec
  } else if (answer < 0) {
    log::warn("the fork server could not fork a rank ({}); starting it by exec",
              std::strerror(static_cast<int>(-answer)));
    return -1;
  }
  if (!failure.empty()) {
    log::warn("the fork server (pid {}) failed: {}; ranks are started by exec from now on", pid_, failure);
    stop();
    return -1;
  }
  return static_cast<pid_t>(answer);
}

}  // namespace cohort::launch
