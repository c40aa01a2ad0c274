#include "util/slurm.h"

#include "cohort/core/net.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <thread>

namespace cohort::test {
namespace {

constexpr const char* kDaemons[] = {"/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd",
                                    "/usr/bin/sbatch", "/usr/bin/srun", "/usr/bin/scontrol",
                                    "/usr/bin/nsenter"};

// Slurm compares a controller's name with the short host name.
std::string shortHostName() {
  const std::string h = cohort::hostName();
  return h.substr(0, h.find('.'));
}

}  // namespace

std::string SlurmCluster::unavailable(int nodes) {
  if (::geteuid() != 0) return "the test Slurm runs its daemons as root";
  for (const char* d : kDaemons) {
    if (::access(d, X_OK) != 0) return fmt::format("{} is missing (slurm-wlm, munge: scripts/install-deps.sh)", d);
  }
  if (nodes > 1) return TestNetwork::unavailable();
  return "";
}

SlurmCluster::SlurmCluster(int nodes, const std::string& extraConf) : nodes_(nodes) {
  marker_ = fmt::format("COHORT_TEST_SLURM={}-{}", ::getpid(), std::random_device{}());
  try {
    start(extraConf);
  } catch (...) {
    stop();
    throw;
  }
}

SlurmCluster::~SlurmCluster() { stop(); }

std::map<std::string, std::string> SlurmCluster::env() const {
  const auto eq = marker_.find('=');
  return {{"SLURM_CONF", conf()}, {marker_.substr(0, eq), marker_.substr(eq + 1)}};
}

ProcessResult SlurmCluster::client(const std::vector<std::string>& argv) const {
  return run(argv, env(), std::chrono::seconds(30));
}

std::string SlurmCluster::showJob(const std::string& id) const {
  const auto r = client({"/usr/bin/scontrol", "-o", "show", "job", id});
  return r.exitCode == 0 ? r.out : "";
}

std::string SlurmCluster::jobField(const std::string& id, const std::string& key) const {
  const std::string line = " " + showJob(id);
  const auto at = line.find(" " + key + "=");
  if (at == std::string::npos) return "";
  const auto begin = at + key.size() + 2;
  return line.substr(begin, line.find_first_of(" \n", begin) - begin);
}

std::string SlurmCluster::logs() const {
  std::string all;
  for (const auto& e : std::filesystem::directory_iterator(dir_.file("log"))) {
    const std::string text = readText(e.path().string());
    all += "--- " + e.path().filename().string() + " (last 3000 bytes)\n" +
           text.substr(text.size() > 3000 ? text.size() - 3000 : 0);
  }
  return all;
}

bool SlurmCluster::runsOn(pid_t pid, int i) const {
  std::error_code ec1, ec2;
  const auto ns = [](pid_t p, std::error_code& ec) {
    return std::filesystem::read_symlink("/proc/" + std::to_string(p) + "/ns/net", ec);
  };
  const auto mine = ns(pid, ec1);
  const auto node = ns(slurmds_.at(static_cast<size_t>(i))->pid(), ec2);
  return !ec1 && !ec2 && mine == node;
}

void SlurmCluster::start(const std::string& extraConf) {
  namespace fs = std::filesystem;
  for (const char* d : {"log", "state", "spool"}) fs::create_directories(dir_.file(d));
  if (nodes_ > 1) net_ = std::make_unique<TestNetwork>(nodes_);
  // munged: a key of its own, and a socket only this cluster's daemons use.
  {
    std::random_device rd;
    std::string key(1024, '\0');
    for (auto& c : key) c = static_cast<char>(rd());
    writeText(dir_.file("munge.key"), key);
    ::chmod(dir_.file("munge.key").c_str(), 0600);
  }
  const auto marker = env();
  std::map<std::string, std::string> daemonEnv(marker.begin(), marker.end());
  munged_ = std::make_unique<Process>(
      std::vector<std::string>{"/usr/sbin/munged", "-F", "--force", "--socket=" + dir_.file("munge.sock"),
                               "--key-file=" + dir_.file("munge.key"), "--log-file=" + dir_.file("log/munged.log"),
                               "--pid-file=" + dir_.file("munged.pid"), "--seed-file=" + dir_.file("munged.seed")},
      daemonEnv);
  if (!waitUntil([&] { return fs::exists(dir_.file("munge.sock")); }, std::chrono::seconds(20))) {
    throw std::runtime_error("munged did not create its socket:\n" + munged_->stderrSoFar());
  }

  const int ctldPort = freePort();
  const int slurmdPort = freePort();
  const std::string host = shortHostName();
  const std::string ctldAddr = net_ ? net_->bridgeAddress() : "127.0.0.1";
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  std::string text = fmt::format(
      "ClusterName=cohorttest\n"
      "SlurmctldHost={host}({ctld})\n"
      "SlurmctldPort={ctldPort}\n"
      "SlurmdPort={slurmdPort}\n"
      "AuthType=auth/munge\n"
      // cred_expire: a requeued job waits this long before it may start
      // again (120 s by default).
      "AuthInfo=socket={dir}/munge.sock,cred_expire=10\n"
      "CredType=cred/munge\n"
      "SlurmUser=root\n"
      "SlurmdUser=root\n"
      "StateSaveLocation={dir}/state\n"
      "SlurmdSpoolDir={dir}/spool/%n\n"
      "SlurmctldPidFile={dir}/slurmctld.pid\n"
      "SlurmdPidFile={dir}/slurmd-%n.pid\n"
      "SlurmctldLogFile={dir}/log/slurmctld.log\n"
      "SlurmdLogFile={dir}/log/slurmd-%n.log\n"
      "ProctrackType=proctrack/linuxproc\n"
      "TaskPlugin=task/none\n"
      "SwitchType=switch/none\n"
      "MpiDefault=none\n"
      "ReturnToService=1\n"  // a node an administrator took down stays down

      "SchedulerType=sched/backfill\n"
      // A requeued job becomes eligible again while nothing else happens:
      // look for work every second, not every 30 s (bf_interval).
      "SchedulerParameters=bf_interval=1\n"
      "SelectType=select/cons_tres\n"
      "SelectTypeParameters=CR_CPU\n"
      "JobCompType=jobcomp/none\n"
      "AccountingStorageType=accounting_storage/none\n"
      "JobAcctGatherType=jobacct_gather/none\n"
      "MinJobAge=600\n"
      "KillWait=60\n"
      "SlurmctldTimeout=30\n"
      "SlurmdTimeout=30\n"
      "{extra}\n",
      fmt::arg("host", host), fmt::arg("ctld", ctldAddr), fmt::arg("ctldPort", ctldPort),
      fmt::arg("slurmdPort", slurmdPort), fmt::arg("dir", dir_.path()), fmt::arg("extra", extraConf));
  for (int i = 0; i < nodes_; ++i) {
    fs::create_directories(dir_.file("spool/" + node(i)));
    text += fmt::format("NodeName={} NodeHostname={} NodeAddr={} CPUs={} RealMemory=4000 State=UNKNOWN\n", node(i),
                        host, net_ ? net_->address(i) : "127.0.0.1", cpus);
  }
  text += "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n";
  writeText(conf(), text);

  ctld_ = std::make_unique<Process>(std::vector<std::string>{"/usr/sbin/slurmctld", "-D", "-i", "-f", conf()},
                                    daemonEnv);
  for (int i = 0; i < nodes_; ++i) {
    std::vector<std::string> argv = net_ ? net_->enter(i) : std::vector<std::string>{};
    for (const std::string& a : {std::string("/usr/sbin/slurmd"), std::string("-D"), std::string("-N"), node(i),
                                 std::string("-f"), conf()}) {
      argv.push_back(a);
    }
    slurmds_.push_back(std::make_unique<Process>(argv, daemonEnv));
  }
  const bool idle = waitUntil(
      [&] {
        const auto r = client({"/usr/bin/sinfo", "-h", "-N", "-o", "%T"});
        if (r.exitCode != 0) return false;
        int n = 0;
        for (size_t at = 0; (at = r.out.find("idle", at)) != std::string::npos; at += 4) ++n;
        return n == nodes_;
      },
      std::chrono::seconds(60));
  if (!idle) throw std::runtime_error("the test Slurm's nodes did not become idle in 60 s:\n" + logs());
}

void SlurmCluster::stop() {
  if (ctld_) {
    // Cancel every job, and give the ranks their time to stop.
    client({"/usr/bin/scancel", "--full", "-u", "root"});
    waitUntil(
        [&] {
          const auto r = client({"/usr/bin/squeue", "-h", "-o", "%i"});
          return r.exitCode != 0 || r.out.empty();
        },
        std::chrono::seconds(90));
  }
  // The daemons, then anything they started: job steps and ranks carry the
  // marker in their environment.
  for (auto& d : slurmds_) d->signal(SIGTERM);
  if (ctld_) ctld_->signal(SIGTERM);
  for (auto& d : slurmds_) d->wait(std::chrono::seconds(15));
  if (ctld_) ctld_->wait(std::chrono::seconds(15));
  if (munged_) {
    munged_->signal(SIGTERM);
    munged_->wait(std::chrono::seconds(10));
  }
  slurmds_.clear();
  ctld_.reset();
  munged_.reset();
  for (int round = 0; round < 50; ++round) {
    auto left = processesWithEnv(marker_);
    left.erase(std::remove(left.begin(), left.end(), ::getpid()), left.end());
    if (left.empty()) break;
    for (pid_t p : left) ::kill(p, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  net_.reset();
}

}  // namespace cohort::test
