#include "util/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <sstream>
#include <stdexcept>

#include "cohort/core/net.h"

extern char** environ;

namespace {

// COHORT_TEST_ISA=avx2 (tests/CMakeLists.txt, AVX2): LibTorch's and oneDNN's
// kernels held to AVX2 in this test process and every process it starts,
// as on a CPU without AVX-512. Set before main, before LibTorch picks its
// kernels (at their first call).
[[maybe_unused]] const bool kIsaHeld = [] {
  const char* isa = std::getenv("COHORT_TEST_ISA");
  if (isa == nullptr || std::string(isa) != "avx2") return false;
  setenv("ATEN_CPU_CAPABILITY", "avx2", 1);
  setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
  return true;
}();

}  // namespace

namespace cohort::test {

std::string ProcessResult::describe() const {
  std::ostringstream os;
  os << "exit " << exitCode << ", signal " << signal << (timedOut ? ", TIMED OUT" : "") << ", "
     << seconds << " s\n--- stdout ---\n"
     << out << "\n--- stderr ---\n"
     << err;
  return os.str();
}

Process::Process(const std::vector<std::string>& argv,
                 const std::map<std::string, std::string>& env) {
  int outPipe[2], errPipe[2];
  if (pipe2(outPipe, O_CLOEXEC) != 0 || pipe2(errPipe, O_CLOEXEC) != 0) {
    throw std::runtime_error("pipe failed");
  }
  std::vector<std::string> envStrings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string s(*e);
    if (env.count(s.substr(0, s.find('='))) == 0) envStrings.push_back(s);
  }
  for (const auto& [k, v] : env) envStrings.push_back(k + "=" + v);
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : envStrings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  start_ = std::chrono::steady_clock::now();
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // a killed test leaves nothing running
    setpgid(0, 0);
    dup2(outPipe[1], STDOUT_FILENO);
    dup2(errPipe[1], STDERR_FILENO);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  setpgid(pid_, pid_);
  close(outPipe[1]);
  close(errPipe[1]);
  outFd_ = outPipe[0];
  errFd_ = errPipe[0];
}

Process::~Process() {
  // Grandchildren (ranks of a launcher) share its process group. The group
  // is only signalled while our child, its leader, is unreaped: its pid (and
  // so the group id) cannot have been reused by then.
  if (!reaped_ && pid_ > 0) {
    kill(-pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (outFd_ >= 0) close(outFd_);
  if (errFd_ >= 0) close(errFd_);
}

void Process::drain(int timeoutMs) {
  pollfd fds[2] = {{outFd_, POLLIN, 0}, {errFd_, POLLIN, 0}};
  if (poll(fds, 2, timeoutMs) <= 0) return;
  char buf[65536];
  for (int k = 0; k < 2; ++k) {
    if (fds[k].revents & (POLLIN | POLLHUP)) {
      ssize_t n = read(fds[k].fd, buf, sizeof buf);
      if (n > 0) (k == 0 ? out_ : err_).append(buf, static_cast<size_t>(n));
    }
  }
}

std::string Process::stderrSoFar() {
  drain(0);
  return err_;
}

std::string Process::stdoutSoFar() {
  drain(0);
  return out_;
}

void Process::signal(int sig) {
  if (!reaped_) kill(pid_, sig);
}

bool Process::exited() const {
  if (reaped_) return true;
  siginfo_t info{};
  return waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid_;
}

std::vector<pid_t> Process::children() const {
  std::vector<pid_t> out;
  std::ifstream in("/proc/" + std::to_string(pid_) + "/task/" + std::to_string(pid_) + "/children");
  for (pid_t p; in >> p;) out.push_back(p);
  return out;
}

ProcessResult Process::wait(std::chrono::milliseconds limit) {
  ProcessResult r;
  const auto deadline = start_ + limit;
  int status = 0;
  for (;;) {
    drain(50);
    // Notice the exit without reaping, so the group can still be signalled.
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == pid_) {
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      r.timedOut = true;
      break;
    }
  }
  kill(-pid_, SIGKILL);  // whatever the child left in its group
  waitpid(pid_, &status, 0);
  reaped_ = true;
  // Read what is left in the pipes (writers may be grandchildren still
  // alive: bound the wait).
  for (int k = 0; k < 20; ++k) {
    pollfd fds[2] = {{outFd_, POLLIN, 0}, {errFd_, POLLIN, 0}};
    if (poll(fds, 2, 50) <= 0) break;
    bool any = false;
    char buf[65536];
    for (int j = 0; j < 2; ++j) {
      if (fds[j].revents & POLLIN) {
        ssize_t n = read(fds[j].fd, buf, sizeof buf);
        if (n > 0) {
          (j == 0 ? out_ : err_).append(buf, static_cast<size_t>(n));
          any = true;
        }
      }
    }
    if (!any) break;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (WIFEXITED(status)) r.exitCode = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  r.out = out_;
  r.err = err_;
  return r;
}

ProcessResult run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                  std::chrono::milliseconds limit) {
  Process p(argv, env);
  return p.wait(limit);
}

bool waitUntil(const std::function<bool()>& ready, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

std::vector<pid_t> pausedAt(const std::string& dir, const std::string& point) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(point + ".", 0) != 0 || name == point + ".go") continue;
    out.push_back(static_cast<pid_t>(std::stol(name.substr(point.size() + 1))));
  }
  return out;
}

bool signalPending(pid_t pid, int sig) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    // ShdPnd: the process's pending set; SigPnd: one thread's.
    if (line.rfind("ShdPnd:", 0) != 0 && line.rfind("SigPnd:", 0) != 0) continue;
    const unsigned long long mask = std::stoull(line.substr(7), nullptr, 16);
    if (mask & (1ULL << (sig - 1))) return true;
  }
  return false;
}

std::vector<pid_t> processesWithEnv(const std::string& marker) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/environ", std::ios::binary);
    std::string env((std::istreambuf_iterator<char>(in)), {});
    size_t pos = 0;
    while (pos < env.size()) {
      size_t z = env.find('\0', pos);
      if (z == std::string::npos) z = env.size();
      if (env.compare(pos, z - pos, marker) == 0) {
        // A zombie still has /proc/<pid> but no environment to read.
        out.push_back(static_cast<pid_t>(pid));
        break;
      }
      pos = z + 1;
    }
  }
  closedir(d);
  return out;
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "cohort-test-XXXXXX").string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void writeText(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

int freePort() { return freeTcpPort(); }

}  // namespace cohort::test
