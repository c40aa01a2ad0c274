#include "cohort/core/env.h"

#include <fmt/format.h>
#include <dlfcn.h>
#include <sched.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>
#include <vector>

#include "cohort/core/error.h"

namespace cohort::env {
namespace {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int parseInt(const char* name, const std::string& value) {
  try {
    size_t pos = 0;
    long v = std::stol(value, &pos);
    if (pos != value.size() || v < 0 || v > 1'000'000'000) throw std::invalid_argument("");
    return static_cast<int>(v);
  } catch (const std::exception&) {
    throw ConfigError(fmt::format(
        "environment variable {}: expected a non-negative integer, got '{}'", name, value));
  }
}

std::optional<int> getInt(const char* name) {
  if (auto v = get(name)) return parseInt(name, *v);
  return std::nullopt;
}

int require(const char* name, const char* because) {
  auto v = getInt(name);
  if (!v) {
    throw ConfigError(fmt::format("environment variable {} is not set ({} is set)", name, because));
  }
  return *v;
}

// Slurm writes tasks per node as "2(x3),1": three nodes with 2 tasks, then 1.
std::optional<int> slurmTasksOnNode(const std::string& spec, int node) {
  static const std::regex item(R"((\d+)(?:\(x(\d+)\))?)");
  int index = 0;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t end = spec.find(',', start);
    if (end == std::string::npos) end = spec.size();
    std::smatch m;
    std::string part = spec.substr(start, end - start);
    if (!std::regex_match(part, m, item)) return std::nullopt;
    int tasks = parseInt("SLURM_TASKS_PER_NODE", m[1]);
    int repeat = m[2].matched ? parseInt("SLURM_TASKS_PER_NODE", m[2]) : 1;
    if (node < index + repeat) return tasks;
    index += repeat;
    start = end + 1;
  }
  return std::nullopt;
}

// The variables one launcher sets, in torchrun's roles.
struct Family {
  const char* source;
  const char* rank;
  const char* worldSize;
  const char* localRank;
  const char* localWorldSize;
};

constexpr Family kTorchrun{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
constexpr Family kOpenMpi{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};

void readFamily(const Family& f, RankEnv& r) {
  r.source = f.source;
  r.rank = require(f.rank, f.worldSize);
  r.worldSize = require(f.worldSize, f.rank);
  r.localRank = getInt(f.localRank).value_or(r.rank);
  r.localWorldSize = getInt(f.localWorldSize).value_or(r.worldSize);
}

}  // namespace

RankEnv detectRankEnv() {
  RankEnv r;
  if (get(kTorchrun.rank) || get(kTorchrun.worldSize)) {
    readFamily(kTorchrun, r);
  } else if (get(kOpenMpi.rank)) {
    readFamily(kOpenMpi, r);
  } else if (get("SLURM_PROCID")) {
    r.source = "slurm";
    r.rank = require("SLURM_PROCID", "SLURM_NTASKS");
    r.worldSize = require("SLURM_NTASKS", "SLURM_PROCID");
    r.localRank = getInt("SLURM_LOCALID").value_or(0);
    if (auto n = getInt("SLURM_NTASKS_PER_NODE")) {
      r.localWorldSize = *n;
    } else if (auto spec = get("SLURM_TASKS_PER_NODE")) {
      auto n2 = slurmTasksOnNode(*spec, getInt("SLURM_NODEID").value_or(0));
      if (!n2) {
        throw ConfigError(fmt::format(
            "environment variable SLURM_TASKS_PER_NODE: cannot parse '{}'", *spec));
      }
      r.localWorldSize = *n2;
    } else {
      r.localWorldSize = r.worldSize;
    }
  }

  if (r.worldSize < 1) {
    throw ConfigError(fmt::format("world size from {} must be >= 1, got {}", r.source, r.worldSize));
  }
  if (r.rank >= r.worldSize) {
    throw ConfigError(fmt::format("rank {} from {} is not below the world size {}", r.rank,
                                  r.source, r.worldSize));
  }
  if (r.localWorldSize < 1 || r.localRank >= r.localWorldSize) {
    throw ConfigError(fmt::format("local rank {} from {} is not below the local world size {}",
                                  r.localRank, r.source, r.localWorldSize));
  }

  auto addr = get("MASTER_ADDR");
  // Under srun without MASTER_ADDR: the node srun ran on, which is the first
  // of the allocation and holds rank 0 (`cohort submit --slurm`'s script).
  if (!addr && r.source == "slurm") addr = get("SLURM_LAUNCH_NODE_IPADDR");
  auto port = getInt("MASTER_PORT");
  if (addr) r.masterAddr = *addr;
  if (port) {
    if (*port < 1 || *port > 65535) {
      throw ConfigError(fmt::format("environment variable MASTER_PORT: {} is not a TCP port", *port));
    }
    r.masterPort = *port;
  }
  r.masterFromEnv = addr.has_value() || port.has_value();
  r.agentStore = get("COHORT_AGENT_STORE").value_or("0") == "1";
  return r;
}

std::vector<std::pair<std::string, std::string>> rankVariables(const RankEnv& r) {
  return {
      {"RANK", std::to_string(r.rank)},
      {"WORLD_SIZE", std::to_string(r.worldSize)},
      {"LOCAL_RANK", std::to_string(r.localRank)},
      {"LOCAL_WORLD_SIZE", std::to_string(r.localWorldSize)},
      {"MASTER_ADDR", r.masterAddr},
      {"MASTER_PORT", std::to_string(r.masterPort)},
      {"COHORT_AGENT_STORE", r.agentStore ? "1" : "0"},
  };
}

std::optional<std::string> logLevel() { return get("COHORT_LOG_LEVEL"); }

std::optional<std::string> sentencePieceLibrary() { return get("COHORT_SPM_LIBRARY"); }

std::optional<Fault> fault() {
  auto v = get("COHORT_FAULT");
  if (!v) return std::nullopt;
  static const std::regex re(
      R"(((exit|sleep|slow)(\d+)|kill|nan|segv|throw|commfail)@rank(\d+):step(\d+)(:always)?)");
  std::smatch m;
  if (!std::regex_match(*v, m, re)) {
    throw ConfigError(fmt::format(
        "environment variable COHORT_FAULT: expected "
        "'<exitN|kill|sleepS|slowMS|nan|segv|throw|commfail>@rank<R>:step<S>[:always]', "
        "got '{}'",
        *v));
  }
  Fault f;
  const std::string action = m[2].matched ? m[2].str() : m[1].str();
  if (action == "kill") {
    f.action = Fault::Action::kill;
  } else if (action == "nan") {
    f.action = Fault::Action::nan;
  } else if (action == "segv") {
    f.action = Fault::Action::segv;
  } else if (action == "throw") {
    f.action = Fault::Action::throwError;
  } else if (action == "commfail") {
    f.action = Fault::Action::commFail;
  } else if (action == "exit") {
    f.exitCode = parseInt("COHORT_FAULT", m[3]);
  } else {
    f.action = action == "sleep" ? Fault::Action::sleep : Fault::Action::slow;
    f.amount = parseInt("COHORT_FAULT", m[3]);
  }
  f.rank = parseInt("COHORT_FAULT", m[4]);
  f.step = parseInt("COHORT_FAULT", m[5]);
  f.everyAttempt = m[6].matched;
  return f;
}

int restartCount() {
  auto v = getInt("COHORT_RESTART_COUNT");
  if (v && *v < 0) throw ConfigError("environment variable COHORT_RESTART_COUNT must be >= 0");
  return v.value_or(0);
}

std::optional<CheckpointPause> checkpointPause() {
  const auto v = get("COHORT_TEST_CKPT_PAUSE");
  if (!v) return std::nullopt;
  const size_t colon = v->find(':');
  CheckpointPause p;
  p.step = parseInt("COHORT_TEST_CKPT_PAUSE", v->substr(0, colon));
  if (colon != std::string::npos) p.seconds = parseInt("COHORT_TEST_CKPT_PAUSE (seconds)", v->substr(colon + 1));
  return p;
}

void pauseForTest(const char* point) {
  const auto v = get("COHORT_TEST_PAUSE");
  if (!v) return;
  const size_t colon = v->find(':');
  if (colon == std::string::npos || v->substr(0, colon) != point) return;
  const std::string base = v->substr(colon + 1) + "/" + point;
  std::ofstream(fmt::format("{}.{}", base, ::getpid())).flush();
  const std::string go = base + ".go";
  for (int i = 0; i < 6000 && !std::filesystem::exists(go); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

namespace {

// COHORT_ATTENTION's value: "auto" when unset.
std::string attentionChoice() {
  const auto v = get("COHORT_ATTENTION");
  if (!v || *v == "auto" || *v == "matmul" || *v == "blas") return v.value_or("auto");
  throw ConfigError("environment variable COHORT_ATTENTION must be auto, matmul or blas, got '" + *v + "'");
}

// COHORT_GEMM's value: "auto" when unset.
std::string gemmChoice() {
  const auto v = get("COHORT_GEMM");
  if (!v || *v == "auto" || *v == "aten" || *v == "onednn-nt") return v.value_or("auto");
  throw ConfigError("environment variable COHORT_GEMM must be auto, aten or onednn-nt, got '" + *v + "'");
}

}  // namespace

bool attentionMatmulOnly() { return attentionChoice() == "matmul"; }

bool attentionBlasBlocks() { return attentionChoice() == "blas"; }

bool fusedOpsOff() {
  const auto v = get("COHORT_FUSED_OPS");
  if (!v || *v == "auto") return false;
  if (*v == "off") return true;
  throw ConfigError("environment variable COHORT_FUSED_OPS must be auto or off, got '" + *v + "'");
}

bool linearGemmAten() { return gemmChoice() == "aten"; }

bool linearForwardNt() { return gemmChoice() == "onednn-nt"; }

std::optional<std::string> onednnMaxIsa() {
  if (auto v = get("ONEDNN_MAX_CPU_ISA")) return v;
  return get("DNNL_MAX_CPU_ISA");
}

bool onednnHeldBelowBf16() {
  const auto held = onednnMaxIsa();
  if (!held) return false;
  std::string isa = *held;
  for (char& c : isa) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return isa == "SSE41" || isa == "AVX" || isa == "AVX2" || isa == "AVX2_VNNI";
}

std::optional<std::string> atenCpuCapability() {
  auto v = get("ATEN_CPU_CAPABILITY");
  if (v) std::transform(v->begin(), v->end(), v->begin(), [](unsigned char c) { return std::tolower(c); });
  return v;
}

std::string instructionSetHolds() {
  std::string holds;
  auto add = [&](const char* name, const std::optional<std::string>& value) {
    if (!value || value->empty()) return;
    holds += (holds.empty() ? "" : " ") + std::string(name) + "=" + *value;
  };
  add("ATEN_CPU_CAPABILITY", get("ATEN_CPU_CAPABILITY"));
  add(get("ONEDNN_MAX_CPU_ISA") ? "ONEDNN_MAX_CPU_ISA" : "DNNL_MAX_CPU_ISA", onednnMaxIsa());
  add("OPENBLAS_CORETYPE", get("OPENBLAS_CORETYPE"));
  return holds;
}

ParseOnly parseOnly() {
  const auto v = get("COHORT_PARSE_ONLY");
  if (!v) return ParseOnly::no;
  if (*v == "partial") return ParseOnly::partial;
  return ParseOnly::full;
}

std::optional<long> summaryDelayMs() {
  auto v = getInt("COHORT_TEST_SUMMARY_DELAY_MS");
  if (v && *v < 0) throw ConfigError("environment variable COHORT_TEST_SUMMARY_DELAY_MS must be >= 0");
  return v;
}

std::optional<std::string> machineId(int rank) {
  auto v = get("COHORT_MACHINE_ID");
  if (!v || v->find(',') == std::string::npos) return v;
  std::vector<std::string> ids;
  size_t start = 0;
  for (;;) {
    const size_t end = v->find(',', start);
    ids.push_back(v->substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (rank < 0 || static_cast<size_t>(rank) >= ids.size() || ids[static_cast<size_t>(rank)].empty()) {
    throw ConfigError(fmt::format(
        "environment variable COHORT_MACHINE_ID: '{}' has no machine for rank {} (a list has one "
        "entry per rank)",
        *v, rank));
  }
  return ids[static_cast<size_t>(rank)];
}

std::optional<std::string> elasticStateDir() { return get(kElasticStateVar); }
std::optional<std::string> nodeAddress() { return get(kNodeAddressVar); }
std::optional<std::string> nodeId() { return get(kNodeIdVar); }
std::optional<std::string> debugRanks() { return get(kDebugRanksVar); }
std::optional<int> debugOnFailureSeconds() { return getInt(kDebugOnFailureVar); }
std::optional<std::string> sampleLogDir() { return get("COHORT_TEST_SAMPLE_LOG"); }

std::optional<std::string> azureStorageKey() { return get("AZURE_STORAGE_KEY"); }
std::optional<std::string> azureStorageSasToken() { return get("AZURE_STORAGE_SAS_TOKEN"); }
std::optional<std::string> azureStorageBearerToken() {
  return get("AZURE_STORAGE_BEARER_TOKEN");
}
std::optional<std::string> storeToken() { return get(kStoreTokenVar); }
std::optional<std::string> serveToken() { return get(kServeTokenVar); }
std::optional<std::string> serveRankCgroup() { return get(kServeRankCgroupVar); }
std::optional<std::string> urlCredentials() { return get(kUrlCredentialsVar); }
std::optional<std::string> namedVariable(const std::string& name) { return get(name.c_str()); }
std::string machineCacheDir() {
  if (auto dir = get(kCacheDirVar)) return *dir;
  if (auto xdg = get("XDG_CACHE_HOME")) return *xdg + "/cohort";
  if (auto home = get("HOME")) return *home + "/.cache/cohort";
  return "/var/tmp/cohort-cache";
}

MallocInfo servingMalloc() {
  // The first object in the global scope that defines malloc: a preloaded
  // library comes before libc.
  Dl_info info{};
  void* symbol = dlsym(RTLD_DEFAULT, "malloc");
  if (symbol == nullptr || dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return {"other", "?"};
  const std::string library = info.dli_fname;
  const std::string base = library.substr(library.rfind('/') + 1);
  for (const char* name : {"tcmalloc", "jemalloc"}) {
    if (base.rfind(std::string("lib") + name, 0) == 0) return {name, library};
  }
  return {base.rfind("libc.so", 0) == 0 || base.rfind("libc-", 0) == 0 ? "glibc" : "other", library};
}

int availableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? static_cast<int>(hc) : 1;
}

std::optional<std::pair<std::string, std::string>> rankOpenMpWait() {
  if (get("OMP_WAIT_POLICY") || get("GOMP_SPINCOUNT")) return std::nullopt;
  return std::make_pair(std::string("GOMP_SPINCOUNT"), std::string(kRankSpinCount));
}

std::optional<double> loadAverage() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (f == nullptr) return std::nullopt;
  double load = 0;
  const bool ok = std::fscanf(f, "%lf", &load) == 1;
  std::fclose(f);
  return ok ? std::optional<double>(load) : std::nullopt;
}

std::optional<int> slurmCpusPerTask() {
  if (!get("SLURM_STEP_ID") || elasticStateDir()) return std::nullopt;
  const auto n = getInt("SLURM_CPUS_PER_TASK");
  if (n && *n < 1) {
    throw ConfigError(fmt::format("environment variable SLURM_CPUS_PER_TASK: {} is not a CPU count", *n));
  }
  return n;
}

}  // namespace cohort::env
