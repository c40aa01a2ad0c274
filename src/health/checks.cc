// Health checks: the four measurements, one rank's report, gathering every
// rank's report through the store, and the preflight before training.

#include "cohort/health/health.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <sstream>

#include "cohort/comm/comm.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/net.h"
#include "cohort/core/fd.h"
#include "cohort/core/sgemm.h"
#include "health/detail/json.h"

namespace cohort::health {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string message(const std::exception& e) {
  if (auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

constexpr size_t kMiB = size_t{1} << 20;

// Runs `once` until `seconds` have passed and at least twice; the shortest
// time of one run.
template <class F>
double bestTime(double seconds, F&& once) {
  const auto start = Clock::now();
  double best = std::numeric_limits<double>::infinity();
  for (int reps = 0; reps < 2 || (secondsSince(start) < seconds && reps < 10000); ++reps) {
    const auto t = Clock::now();
    once();
    best = std::min(best, secondsSince(t));
  }
  return std::max(best, 1e-9);
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

// `bytes` (rounded up to whole pages), page-aligned, as O_DIRECT wants.
Buffer pageAligned(size_t bytes) {
  return Buffer(static_cast<uint8_t*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096)));
}

// The test file: closed and removed on every path.
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  ~TempFile() {
    if (created_) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  // Creates the file, with O_DIRECT when the file system takes it.
  void create(bool& direct) {
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
    direct = true;
    fd_.reset(::open(path_.c_str(), flags | O_DIRECT, 0600));
    if (!fd_.valid() && errno == EINVAL) {  // tmpfs and some others refuse O_DIRECT
      direct = false;
      fd_.reset(::open(path_.c_str(), flags, 0600));
    }
    if (!fd_.valid()) throw IoError(fmt::format("cannot create {}: {}", path_, std::strerror(errno)));
    created_ = true;
  }
  // Buffered writes from now on.
  void dropDirect() {
    const int fl = ::fcntl(fd_.get(), F_GETFL);
    if (fl < 0 || ::fcntl(fd_.get(), F_SETFL, fl & ~O_DIRECT) < 0) {
      throw IoError(fmt::format("cannot write {}: fcntl: {}", path_, std::strerror(errno)));
    }
  }
  void closeChecked() {
    const int fd = fd_.release();
    if (::close(fd) != 0) {
      throw IoError(fmt::format("cannot close {}: {}", path_, std::strerror(errno)));
    }
  }
  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  UniqueFd fd_;
  bool created_ = false;
};

HealthCheck makeCheck(const char* name, const char* unit, const char* key, double threshold) {
  HealthCheck c;
  c.name = name;
  c.unit = unit;
  c.key = key;
  c.threshold = threshold;
  return c;
}

void judge(HealthCheck& c) {
  c.status = c.threshold <= 0 || c.value >= c.threshold ? CheckStatus::pass : CheckStatus::fail;
}

void failWith(HealthCheck& c, const std::string& error) {
  c.value = 0;
  c.status = CheckStatus::fail;
  c.error = error;
}

std::string sizeText(size_t bytes) {
  return bytes % kMiB == 0 ? fmt::format("{} MiB", bytes / kMiB)
                           : fmt::format("{:.3g} MiB", static_cast<double>(bytes) / kMiB);
}

}  // namespace

double measureMatmulGflops(int64_t n, double seconds, bool bfloat16, std::string* library) {
  torch::NoGradGuard noGrad;
  const auto type = bfloat16 ? torch::kBFloat16 : torch::kFloat32;
  const auto a = torch::rand({n, n}, torch::kFloat32).to(type);
  const auto b = torch::rand({n, n}, torch::kFloat32).to(type);
  auto c = torch::empty({n, n}, type);
  torch::mm_out(c, a, b);  // a first product out of the timing: oneDNN builds its kernel there
  double t = bestTime(seconds, [&] { torch::mm_out(c, a, b); });
  if (library) *library = "torch::mm";
  if (!bfloat16) {
    const auto sgemm = [&] {
      oneDnnSgemm(false, false, n, n, n, 1.0f, a.data_ptr<float>(), n, b.data_ptr<float>(), n, 0.0f,
                          c.data_ptr<float>(), n);
    };
    sgemm();
    const double ts = bestTime(seconds, sgemm);
    if (ts < t) {
      t = ts;
      if (library) *library = "oneDNN sgemm";
    }
  }
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / t / 1e9;
}

double measureMemoryGbps(size_t bytes, double seconds) {
  bytes = std::max<size_t>(bytes, 4096);
  // Page-aligned and touched before timing: page faults are not bandwidth.
  const Buffer src = pageAligned(bytes);
  const Buffer dst = pageAligned(bytes);
  if (!src || !dst) {
    throw Error(fmt::format("cannot allocate 2 x {} for the memory check", sizeText(bytes)));
  }
  std::memset(src.get(), 0x5a, bytes);
  std::memset(dst.get(), 0, bytes);
  uint8_t* s = src.get();
  uint8_t* d = dst.get();
  const int64_t total = static_cast<int64_t>(bytes);
  const double t = bestTime(seconds, [&] {
    // The rank's intra-op threads each copy a contiguous part.
    at::parallel_for(0, total, static_cast<int64_t>(kMiB), [&](int64_t begin, int64_t end) {
      std::memcpy(d + begin, s + begin, static_cast<size_t>(end - begin));
    });
  });
  if (d[bytes / 2] != 0x5a) throw Error("the memory check's copy is wrong");
  return 2.0 * static_cast<double>(bytes) / t / 1e9;
}

double measureDiskWriteMbps(const std::string& dir, size_t bytes, double seconds,
                            std::string* method) {
  constexpr size_t kBlock = 4 * kMiB;
  bytes = std::max<size_t>(bytes, 1);
  const Buffer buf = pageAligned(kBlock);
  if (!buf) throw Error("cannot allocate the disk check's buffer");
  // Not zeros: some storage compresses or skips them.
  for (size_t i = 0; i < kBlock; ++i) buf.get()[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);

  // Unique even for ranks that share a directory, a host name and a pid
  // (threads of one process; containers on a shared file system).
  std::random_device rd;
  TempFile file(
      fmt::format("{}/.cohort-health-{}-{}-{:08x}.tmp", dir, hostName(), ::getpid(), rd()));
  bool direct = false;
  file.create(direct);
  const auto start = Clock::now();
  size_t written = 0;
  while (written < bytes) {
    const size_t n = std::min(kBlock, bytes - written);
    if (direct && n % 4096 != 0) {
      file.dropDirect();  // O_DIRECT needs whole blocks: the tail goes buffered
      direct = false;
    }
    const ssize_t w = ::write(file.fd(), buf.get(), n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && direct) {  // opened, but the file system refuses direct writes
        file.dropDirect();
        direct = false;
        continue;
      }
      throw IoError(fmt::format("cannot write {}: {}", file.path(), std::strerror(errno)));
    }
    written += static_cast<size_t>(w);
    if (secondsSince(start) >= seconds) break;
  }
  if (::fsync(file.fd()) != 0) {
    throw IoError(fmt::format("cannot fsync {}: {}", file.path(), std::strerror(errno)));
  }
  const double t = std::max(secondsSince(start), 1e-9);
  file.closeChecked();
  if (method != nullptr) *method = direct ? "O_DIRECT" : "buffered";
  return static_cast<double>(written) / t / 1e6;
}

AllreduceMeasurement measureAllreduce(const comm::Comm& comm, size_t bytes, double seconds) {
  AllreduceMeasurement m;
  if (comm.worldSize <= 1) return m;
  torch::NoGradGuard noGrad;
  const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(bytes / sizeof(float)));
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(comm.device);
  // The first allreduce (of ones) checks the sums and lines the ranks up.
  at::Tensor t = torch::ones({n}, opts);
  auto start = Clock::now();
  comm::allreduceSum(comm, t, "health check allreduce");
  const double first = secondsSince(start);
  m.wrongSums = t.ne(static_cast<float>(comm.worldSize)).sum().item<int64_t>();
  // How many timed repetitions fit in `seconds`: from the mean of the ranks'
  // first times, so that every rank computes the same count.
  at::Tensor estimate = torch::full({1}, first, torch::TensorOptions().dtype(torch::kFloat64));
  comm::allreduceSum(comm, estimate, "health check allreduce (repetitions)");
  const double perOp = std::max(estimate.item<double>() / comm.worldSize, 1e-6);
  m.reps = static_cast<int>(std::clamp(seconds / perOp, 3.0, 200.0));
  t.fill_(1.0f / static_cast<float>(comm.worldSize));
  start = Clock::now();
  for (int i = 0; i < m.reps; ++i) comm::allreduceSum(comm, t, "health check allreduce");
  const double per = std::max(secondsSince(start) / m.reps, 1e-9);
  const double w = comm.worldSize;
  m.algbwGbps = static_cast<double>(n) * sizeof(float) / per / 1e9;
  m.busbwGbps = m.algbwGbps * 2.0 * (w - 1) / w;
  return m;
}

HealthReport runHealthChecks(const comm::Comm& comm, const HealthConfig& cfg,
                             const std::string& diskDir) {
  HealthReport r;
  r.rank = comm.rank;
  r.worldSize = comm.worldSize;
  r.host = hostName();
  r.threads = at::get_num_threads();
  const double seconds = cfg.secondsPerCheck;

  // The ranks measure compute and memory at the same time, as they train.
  comm::barrier(comm, "health checks");

  HealthCheck mm = makeCheck("matmul", "GFLOP/s", "health.min_matmul_gflops", cfg.minMatmulGflops);
  try {
    mm.value = measureMatmulGflops(cfg.matmulSize, seconds);
    mm.detail = fmt::format("{0}x{0} float32 torch::mm, {1} thread{2}, best rep in {3:g} s",
                            cfg.matmulSize, r.threads, r.threads == 1 ? "" : "s", seconds);
    judge(mm);
  } catch (const std::exception& e) {
    failWith(mm, message(e));
  }
  r.checks.push_back(mm);

  HealthCheck mem = makeCheck("memory", "GB/s", "health.min_memory_gbps", cfg.minMemoryGbps);
  try {
    const size_t bytes = static_cast<size_t>(cfg.memoryMb) * kMiB;
    mem.value = measureMemoryGbps(bytes, seconds);
    mem.detail = fmt::format("memcpy of {}, read + written, {} thread{}, best rep in {:g} s",
                             sizeText(bytes), r.threads, r.threads == 1 ? "" : "s", seconds);
    judge(mem);
  } catch (const std::exception& e) {
    failWith(mem, message(e));
  }
  r.checks.push_back(mem);

  HealthCheck disk = makeCheck("disk", "MB/s", "health.min_disk_write_mbps", cfg.minDiskWriteMbps);
  std::error_code ec;
  std::string dir = std::filesystem::absolute(diskDir, ec).lexically_normal().string();
  if (ec || dir.empty()) dir = diskDir;
  if (!dir.empty() && dir.size() > 1 && dir.back() == '/') dir.pop_back();
  try {
    std::string method;
    const size_t bytes = static_cast<size_t>(cfg.diskMb) * kMiB;
    disk.value = measureDiskWriteMbps(dir, bytes, seconds, &method);
    disk.detail = fmt::format("up to {} written in {} ({}) + fsync", sizeText(bytes), dir, method);
    judge(disk);
  } catch (const std::exception& e) {
    failWith(disk, fmt::format("{} (health.disk_dir)", message(e)));
  }
  r.checks.push_back(disk);

  HealthCheck ar = makeCheck("allreduce", "GB/s", "health.min_allreduce_busbw_gbps",
                             cfg.minAllreduceBusbwGbps);
  if (comm.worldSize <= 1) {
    ar.status = CheckStatus::skipped;
    ar.detail = "one rank: nothing to allreduce with";
  } else {
    // Every rank takes part, whatever its other checks found: a peer that
    // left would make the others wait. A failing peer throws CommError.
    comm::barrier(comm, "health checks (allreduce)");
    const size_t bytes = static_cast<size_t>(cfg.allreduceMb * static_cast<double>(kMiB));
    const AllreduceMeasurement m = measureAllreduce(comm, bytes, seconds);
    if (m.wrongSums > 0) {
      failWith(ar, fmt::format("{} of {} sums of the allreduce were wrong (expected {})",
                               m.wrongSums, std::max<size_t>(1, bytes / sizeof(float)),
                               comm.worldSize));
    } else {
      ar.value = m.busbwGbps;
      ar.detail = fmt::format("{} float32 over the process group, {} reps, algbw {:.4g} GB/s",
                              sizeText(bytes), m.reps, m.algbwGbps);
      judge(ar);
    }
  }
  r.checks.push_back(ar);
  return r;
}

std::vector<HealthReport> gatherHealthReports(const comm::Comm& comm, const HealthReport& mine) {
  if (comm.worldSize <= 1) return {mine};
  // The n-th call of each rank pairs with the n-th call of the others: a
  // per-rank counter in the store (not in the process: tests run ranks as
  // threads of one process).
  const int64_t call = comm.store->add(fmt::format("health/calls/{}", comm.rank), 1);
  const std::string text = detail::toJson(mine).dump();
  comm.store->set(fmt::format("health/{}/{}", call, comm.rank),
                  std::vector<uint8_t>(text.begin(), text.end()));
  std::vector<HealthReport> all;
  for (int r = 0; r < comm.worldSize; ++r) {
    const std::string key = fmt::format("health/{}/{}", call, r);
    std::vector<uint8_t> bytes;
    try {
      comm.store->wait({key}, comm.timeout);
      bytes = comm.store->get(key);
    } catch (const std::exception& e) {
      throw TimeoutError(
          fmt::format("rank {}: rank {} did not report its health checks within {} s: {}",
                      comm.rank, r, comm.timeout.count() / 1000.0, message(e)));
    }
    all.push_back(detail::reportFromJson(std::string(bytes.begin(), bytes.end())));
  }
  return all;
}

std::vector<HealthReport> preflight(const comm::Comm& comm, const HealthConfig& config,
                                    const std::string& runDir) {
  const std::string dir = config.diskDir.empty() ? runDir : config.diskDir;
  log::info("preflight (distribution.preflight): health checks on {} rank{}", comm.worldSize,
            comm.worldSize == 1 ? "" : "s");
  const auto start = Clock::now();
  const HealthReport mine = runHealthChecks(comm, config, dir);
  const std::vector<HealthReport> all = gatherHealthReports(comm, mine);
  std::istringstream table(formatHealthTable(all));
  for (std::string line; std::getline(table, line);) log::info("{}", line);
  for (const auto& c : mine.checks) log::debug("health check {}: {}", c.name, c.detail);
  const std::string failures = healthFailures(all);
  if (!failures.empty()) {
    throw PreflightError(failures + ". Training does not start (distribution.preflight: true); lower the "
                           "health.* threshold or fix the machine");
  }
  log::info("preflight passed in {:.1f} s", secondsSince(start));
  return all;
}

}  // namespace cohort::health
