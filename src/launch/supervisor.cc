#include "cohort/launch/supervisor.h"

#include <sys/wait.h>

#include <cerrno>

#include "cohort/launch/spawn.h"

namespace cohort::launch {

Supervisor::~Supervisor() {
  killAll();
  for (auto& c : children_) {
    if (c.running) ::waitpid(c.pid, nullptr, 0);
  }
}

void Supervisor::start(int rank, const std::string& exe, const std::vector<std::string>& args,
                       const std::vector<std::string>* env, const sigset_t* mask, const char* what) {
  Child c;
  c.rank = rank;
  c.pid = spawn(exe, args, env, mask, what);
  c.running = true;
  children_.push_back(c);
}

std::vector<int> Supervisor::reap(const std::function<void(const Child&)>& ended) {
  std::vector<int> lost;
  for (auto& c : children_) {
    if (!c.running) continue;
    int status = 0;
    const pid_t pid = ::waitpid(c.pid, &status, WNOHANG);
    if (pid == 0 || (pid < 0 && errno == EINTR)) continue;
    c.running = false;
    if (pid < 0) {
      lost.push_back(c.rank);
      continue;
    }
    c.status = status;
    ended(c);
  }
  return lost;
}

bool Supervisor::anyRunning() const {
  for (const auto& c : children_) {
    if (c.running) return true;
  }
  return false;
}

void Supervisor::signalAll(int sig) {
  for (const auto& c : children_) {
    if (c.running) ::kill(c.pid, sig);
  }
}

void Supervisor::killAll() {
  for (auto& c : children_) {
    if (!c.running) continue;
    ::kill(c.pid, SIGKILL);
    c.killedByUs = true;
  }
}

std::vector<Supervisor::Child> Supervisor::abandon() {
  std::vector<Child> left;
  for (auto& c : children_) {
    if (!c.running) continue;
    left.push_back(c);
    c.running = false;
  }
  return left;
}

}  // namespace cohort::launch
