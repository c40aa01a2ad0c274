#include "cohort/ckpt/checkpointer.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "cohort/ckpt/tensor_file.h"
#include "cohort/core/fence.h"
#include "cohort/core/error.h"
#include "cohort/core/time.h"
#include "cohort/core/log.h"
#include "cohort/monitor/timeline.h"
#include "cohort/core/text.h"
#include "core/detail/json_int.h"

namespace fs = std::filesystem;

namespace cohort::ckpt {
namespace {

using Clock = SteadyClock;

// Copies a tensor's bytes to host memory at `dst`.
void hostCopy(char* dst, const at::Tensor& t) {
  if (t.device().is_cpu() && t.is_contiguous()) {
    std::memcpy(dst, t.data_ptr(), t.nbytes());
  } else {
    at::Tensor host = t.contiguous().to(torch::kCPU);
    std::memcpy(dst, host.data_ptr(), host.nbytes());
  }
}

// Direct I/O wants buffers, offsets and sizes in multiples of the block size.
constexpr uint64_t kImageAlign = 4096;

std::string statusKey(int64_t step, int rank) {
  return fmt::format("ckpt/step-{}/rank-{}", step, rank);
}


// Another rank skipped the checkpoint (its writer was behind): not a failure.
struct Skipped : std::runtime_error {
  using std::runtime_error::runtime_error;
};
std::string stringOf(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

}  // namespace

// One set of host buffers: a snapshot is copied into it and written from it.
struct Checkpointer::Slot {
  // The files' images, back to back, each 4096-aligned so the writer can
  // hand them to the disk with direct I/O. Grown as needed, then reused.
  std::unique_ptr<char, decltype(&std::free)> buffer{nullptr, &std::free};
  uint64_t capacity = 0;
  // The tensors the next forward modifies, copied here first, before their
  // place in the images is known.
  std::vector<char> early;
  bool busy = false;
};

struct Checkpointer::Job {
  int64_t seq = 0;
  int slot = -1;  // -1: skipped (nothing to write)
  Manifest manifest;
  std::vector<SnapshotFile> files;
  std::vector<uint64_t> fileOffsets;  // per file: where its image starts in the slot buffer
  std::vector<uint64_t> staged;       // per early item, in order: its offset in slot.early
  std::vector<TensorFileLayout> layouts;
};

Checkpointer::Checkpointer(CheckpointerOptions options) : options_(std::move(options)) {
  COHORT_ASSERT(options_.maxInFlight >= 1, "max_in_flight ", options_.maxInFlight);
  for (int i = 0; i < options_.maxInFlight; ++i) slots_.push_back(std::make_unique<Slot>());
  copier_ = std::thread([this] { copyLoop(); });
  writer_ = std::thread([this] { writeLoop(); });
}

Checkpointer::~Checkpointer() {
  {
    std::lock_guard<std::mutex> g(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  copier_.join();
  writer_.join();
}

void Checkpointer::addBlocked(double seconds) {
  // mutex_ held
  currentBlocked_ += seconds;
  if (!blocked_.empty()) blocked_.back() = currentBlocked_;
  stats_.blockedSeconds += seconds;
  stats_.maxBlockedSeconds = std::max(stats_.maxBlockedSeconds, currentBlocked_);
}

bool Checkpointer::mark(Manifest manifest, std::vector<SnapshotFile> files,
                        Clock::time_point start) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto freeSlot = [&]() -> int {
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (!slots_[i]->busy) return static_cast<int>(i);
    }
    return -1;
  };
  int slot = freeSlot();
  if (slot < 0 && options_.whenBehind == WhenBehind::wait) {
    const auto waitStart = Clock::now();
    cv_.wait(lock, [&] { return stop_ || freeSlot() >= 0; });
    slot = freeSlot();
    log::warn("checkpoint at step {}: waited {:.3f} s for the writer to free a buffer "
              "(checkpoint.when_behind: wait)",
              manifest.step, secondsSince(waitStart));
  }
  auto job = std::make_shared<Job>();
  job->manifest = std::move(manifest);
  if (slot < 0) {
    ++stats_.skipped;
    stats_.blockedSeconds += secondsSince(start);  // not a checkpoint's own time
    log::warn("checkpoint at step {} skipped: the writer is still busy with {} earlier "
              "checkpoint(s) (checkpoint.when_behind: skip; raise checkpoint.max_in_flight or "
              "checkpoint less often)",
              job->manifest.step, slots_.size());
    ++pendingWrites_;
    writeQueue_.push_back(std::move(job));  // tells rank 0 this rank skipped it
    lock.unlock();
    cv_.notify_all();
    return false;
  }
  Slot& s = *slots_[static_cast<size_t>(slot)];
  s.busy = true;
  blocked_.push_back(0);
  currentBlocked_ = 0;
  job->slot = slot;
  job->files = std::move(files);
  job->seq = ++markedSeq_;
  ++stats_.taken;
  ++pendingWrites_;
  lock.unlock();
  // What the next forward modifies is small (BatchNorm statistics): copied
  // here, so the forward never waits for the copier.
  uint64_t earlyBytes = 0;
  for (const auto& file : job->files) {
    for (const auto& item : *file.items) {
      if (item.early) earlyBytes += item.tensor.nbytes();
    }
  }
  if (s.early.size() < earlyBytes) s.early.resize(earlyBytes);
  uint64_t at = 0;
  for (const auto& file : job->files) {
    for (const auto& item : *file.items) {
      if (!item.early) continue;
      hostCopy(s.early.data() + at, item.tensor);
      job->staged.push_back(at);
      at += item.tensor.nbytes();
    }
  }
  lock.lock();
  copyQueue_.push_back(job);
  const double took = secondsSince(start);
  stats_.markSeconds += took;
  addBlocked(took);

  lock.unlock();
  cv_.notify_all();
  return true;
}

void Checkpointer::waitCopied() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (copiedSeq_ >= markedSeq_) return;
  const auto start = Clock::now();
  cv_.wait(lock, [&] { return stop_ || copiedSeq_ >= markedSeq_; });
  stats_.copyWaitSeconds += secondsSince(start);
  addBlocked(secondsSince(start));
}

void Checkpointer::copyLoop() {
  for (;;) {
    std::shared_ptr<Job> job;
    Slot* slot = nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !copyQueue_.empty(); });
      if (stop_) return;
      job = copyQueue_.front();
      copyQueue_.pop_front();
      slot = slots_[static_cast<size_t>(job->slot)].get();
    }
    try {
      {
        monitor::TimelineSpan span("checkpoint copy", "checkpoint", 1);
        copy(*job, *slot);
      }
      std::lock_guard<std::mutex> g(mutex_);
      writeQueue_.push_back(job);
      cv_.notify_all();
    } catch (const std::exception& e) {
      // Nothing to write: report it, free the slot, release the waiters.
      std::lock_guard<std::mutex> g(mutex_);
      events_.push_back({false, false, job->manifest.step, fmt::format("cannot copy the state: {}", e.what())});
      slot->busy = false;
      copiedSeq_ = job->seq;
      --pendingWrites_;
      cv_.notify_all();
    }
  }
}

namespace {

// Room for `total` bytes in `slot`, 2 MiB-aligned so the kernel can back it
// with huge pages: fewer page faults and fewer pages to pin for direct I/O.
template <class SlotT>
void ensureCapacity(SlotT& slot, uint64_t total, bool touch) {
  if (slot.capacity >= total) return;
  constexpr uint64_t kHuge = uint64_t{2} << 20;
  const uint64_t bytes = (std::max<uint64_t>(total, kHuge) + kHuge - 1) / kHuge * kHuge;
  slot.buffer.reset(static_cast<char*>(std::aligned_alloc(kHuge, bytes)));
  if (!slot.buffer) throw std::runtime_error(fmt::format("out of memory for {} bytes", total));
  madvise(slot.buffer.get(), bytes, MADV_HUGEPAGE);
  if (touch) std::memset(slot.buffer.get(), 0, bytes);
  slot.capacity = bytes;
}

}  // namespace

void Checkpointer::reserve(uint64_t bytes) {
  std::lock_guard<std::mutex> g(mutex_);
  for (auto& slot : slots_) {
    if (!slot->busy) ensureCapacity(*slot, bytes, true);
  }
}

void Checkpointer::copy(Job& job, Slot& slot) {
  const auto copyStart = Clock::now();
  // Each file's image: its header, then its tensors at their offsets (the
  // early ones from the staging area mark() filled).
  uint64_t total = 0;
  job.layouts.clear();
  job.fileOffsets.clear();
  for (auto& file : job.files) {
    bool deferred = false;
    for (const auto& item : *file.items) deferred = deferred || item.make;
    if (!deferred) continue;
    auto made = std::make_shared<std::vector<SnapshotItem>>(*file.items);
    for (auto& item : *made) {
      if (item.make) item.tensor = item.make();
    }
    file.items = std::move(made);
  }
  // In place: the writer reads the live tensors; the training thread is
  // released when it has (write()).
  if (options_.inPlace) return;
  for (const auto& file : job.files) {
    fence::check(fmt::format("{} of checkpoint step {}", file.name, job.manifest.step));
    std::vector<TensorRecord> records;
    for (const auto& item : *file.items) {
      records.push_back({item.name, item.tensor.scalar_type(), item.tensor.sizes().vec(), nullptr,
                         static_cast<uint64_t>(item.tensor.nbytes())});
    }
    job.layouts.push_back(layoutTensorFile(records, file.meta, kImageAlign));
    job.fileOffsets.push_back(total);
    total += job.layouts.back().size;
  }
  ensureCapacity(slot, total, false);
  char* base = slot.buffer.get();
  size_t next = 0;
  for (size_t f = 0; f < job.files.size(); ++f) {
    const auto& l = job.layouts[f];
    char* image = base + job.fileOffsets[f];
    std::memcpy(image, l.header.data(), l.header.size());
    uint64_t filled = l.header.size();
    const auto& items = *job.files[f].items;
    for (size_t i = 0; i < items.size(); ++i) {
      std::memset(image + filled, 0, l.offsets[i] - filled);
      const uint64_t n = items[i].tensor.nbytes();
      if (items[i].early) {
        std::memcpy(image + l.offsets[i], slot.early.data() + job.staged[next++], n);
      } else {
        hostCopy(image + l.offsets[i], items[i].tensor);
      }
      filled = l.offsets[i] + n;
    }
    std::memset(image + filled, 0, l.size - filled);
  }
  {
    std::lock_guard<std::mutex> g(mutex_);
    copiedSeq_ = job.seq;
  }
  cv_.notify_all();
  log::debug("checkpoint step {}: {:.1f} MB copied in {:.1f} ms", job.manifest.step, total / 1e6,
             1000 * secondsSince(copyStart));
}

void Checkpointer::writeLoop() {
  // Hashing and writing are not on the training's critical path: they take
  // the CPU when the training threads leave it (the copier, which the next
  // optimizer step may wait for, keeps the normal priority).
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !writeQueue_.empty(); });
      if (stop_) return;
      job = writeQueue_.front();
      writeQueue_.pop_front();
    }
    const auto start = Clock::now();
    Event ev;
    ev.step = job->manifest.step;
    try {
      write(*job);
      ev.message = fmt::format("{:.1f} s", secondsSince(start));
    } catch (const Skipped& e) {
      ev.ok = false;
      ev.skipped = true;
      ev.message = e.what();
    } catch (const std::exception& e) {
      ev.ok = false;
      ev.message = e.what();
    }
    std::lock_guard<std::mutex> g(mutex_);
    if (job->slot >= 0) {
      if (ev.ok) lastWrittenStep_ = std::max(lastWrittenStep_, ev.step);
      slots_[static_cast<size_t>(job->slot)]->busy = false;
      events_.push_back(std::move(ev));
    }
    --pendingWrites_;
    cv_.notify_all();
  }
}

void Checkpointer::pauseForTest(int64_t step) {
  log::warn("checkpoint writer paused while writing step {} (COHORT_TEST_CKPT_PAUSE)", step);
  log::flush();
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto limit = options_.pauseSeconds > 0 ? std::chrono::seconds(options_.pauseSeconds)
                                                 : std::chrono::seconds(600);
    cv_.wait_for(lock, limit, [&] { return stop_; });
  }
  // What a writer that was frozen meanwhile (a stopped machine) meets first.
  fence::check(fmt::format("the rest of checkpoint step {}", step));
  log::info("checkpoint writer goes on with step {}", step);
}

void Checkpointer::write(Job& job) {
  const int64_t step = job.manifest.step;
  const std::string dir = options_.dir + "/" + checkpointDirName(step);
  auto post = [&](const nlohmann::json& status) {
    if (options_.store && options_.rank != 0) {
      options_.store->set(statusKey(step, options_.rank), bytesOf(status.dump()));
    }
  };
  if (job.slot < 0) {
    post({{"ok", false},
          {"skipped", true},
          {"error", fmt::format("rank {} skipped it (its writer was behind)", options_.rank)}});
    return;
  }
  std::vector<ManifestFile> mine;
  monitor::TimelineSpan span("checkpoint write", "checkpoint", 3);
  fence::check(fmt::format("checkpoint step {}", step));
  try {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw IoError(fmt::format("cannot create checkpoint directory {}: {}", dir, ec.message()));
    // A manifest left by an earlier attempt at this step no longer describes it.
    if (options_.rank == 0) fs::remove(dir + "/manifest.json", ec);
    const char* base = slots_[static_cast<size_t>(job.slot)]->buffer.get();
    bool paused = false;
    if (options_.inPlace) {
      mine = writeInPlace(job);
      base = nullptr;
    }
    for (size_t f = 0; base != nullptr && f < job.files.size(); ++f) {
      fence::check(fmt::format("{} of checkpoint step {}", job.files[f].name, step));
      std::function<void()> hook;
      if (options_.pauseAtStep && *options_.pauseAtStep == step && !paused) {
        paused = true;
        hook = [&] { pauseForTest(step); };
      }
      WrittenFile w = writeFileImage(dir + "/" + job.files[f].name, base + job.fileOffsets[f],
                                     job.layouts[f].size, hook,
                                     options_.sealWith ? &*options_.sealWith : nullptr);
      mine.push_back({w.name, w.size, w.checksum, options_.rank});
      std::lock_guard<std::mutex> g(mutex_);
      stats_.bytesWritten += w.size;
    }
  } catch (const std::exception& e) {
    post({{"ok", false}, {"error", fmt::format("rank {}: {}", options_.rank, e.what())}});
    throw;
  }
  if (options_.rank != 0) {
    nlohmann::json files = nlohmann::json::array();
    for (const auto& f : mine) {
      files.push_back({{"name", f.name}, {"size", f.size}, {"checksum", f.checksum}});
    }
    post({{"ok", true}, {"files", files}});
    std::lock_guard<std::mutex> g(mutex_);
    ++stats_.committed;
    return;
  }
  commit(job, mine);
}

std::vector<ManifestFile> Checkpointer::writeInPlace(Job& job) {
  // Whatever happens, the training thread waiting in waitCopied() goes on
  // once this returns or throws.
  struct Release {
    Checkpointer& c;
    int64_t seq;
    ~Release() {
      {
        std::lock_guard<std::mutex> g(c.mutex_);
        c.copiedSeq_ = std::max(c.copiedSeq_, seq);
      }
      c.cv_.notify_all();
    }
  } release{*this, job.seq};
  const auto start = Clock::now();
  const std::string dir = options_.dir + "/" + checkpointDirName(job.manifest.step);
  const Slot& slot = *slots_[static_cast<size_t>(job.slot)];
  std::vector<ManifestFile> mine;
  uint64_t bytes = 0;
  size_t next = 0;
  for (const auto& file : job.files) {
    std::vector<TensorRecord> records;
    std::vector<at::Tensor> keep;  // host, contiguous forms of the tensors
    for (const auto& item : *file.items) {
      const void* data = nullptr;
      if (item.early) {
        data = slot.early.data() + job.staged[next++];
      } else {
        keep.push_back(item.tensor.device().is_cpu() && item.tensor.is_contiguous()
                           ? item.tensor
                           : item.tensor.contiguous().to(torch::kCPU));
        data = keep.back().data_ptr();
      }
      records.push_back({item.name, item.tensor.scalar_type(), item.tensor.sizes().vec(), data,
                         static_cast<uint64_t>(item.tensor.nbytes())});
    }
    WrittenFile w = writeTensorFile(dir + "/" + file.name, records, file.meta,
                                    options_.sealWith ? &*options_.sealWith : nullptr);
    mine.push_back({w.name, w.size, w.checksum, options_.rank});
    bytes += w.size;
    std::lock_guard<std::mutex> g(mutex_);
    stats_.bytesWritten += w.size;
  }
  log::debug("checkpoint step {}: {:.1f} MB written in place in {:.1f} ms", job.manifest.step,
             bytes / 1e6, 1000 * secondsSince(start));
  return mine;
}

void Checkpointer::commit(Job& job, const std::vector<ManifestFile>& mine) {
  monitor::TimelineSpan span("checkpoint commit", "checkpoint", 3);
  const int64_t step = job.manifest.step;
  const std::string dir = options_.dir + "/" + checkpointDirName(step);
  Manifest m = job.manifest;
  m.files = mine;
  // Every other rank reports its files (or its failure) through the store.
  for (int r = 1; r < options_.worldSize; ++r) {
    const std::string key = statusKey(step, r);
    const auto deadline = Clock::now() + options_.timeout;
    for (;;) {
      if (options_.store->check({key})) break;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (cv_.wait_for(lock, std::chrono::milliseconds(20), [&] { return stop_; })) {
          throw Error(fmt::format("checkpoint step {} abandoned: stopping", step));
        }
      }
      if (Clock::now() > deadline) {
        throw TimeoutError(fmt::format(
            "checkpoint step {} not committed: rank {} did not report its files within {} s", step,
            r, options_.timeout.count() / 1000.0));
      }
    }
    nlohmann::json status;
    try {
      status = nlohmann::json::parse(stringOf(options_.store->get(key)));
      options_.store->deleteKey(key);
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("checkpoint step {}: unreadable report of rank {}: {}", step, r, e.what()));
    }
    if (status.value("skipped", false)) {
      throw Skipped(fmt::format("checkpoint step {} not committed: {}", step,
                                status.value("error", std::string("a rank skipped it"))));
    }
    if (!status.value("ok", false)) {
      throw IoError(fmt::format("checkpoint step {} not committed: {}", step,
                                status.value("error", std::string("rank failed"))));
    }
    for (const auto& f : status.at("files")) {
      m.files.push_back({f.at("name").get<std::string>(), jsonInt<uint64_t>(f.at("size")),
                         f.at("checksum").get<std::string>(), r});
    }
  }
  m.created = utcNow();
  for (const auto& [key, value] : options_.manifestExtra.items()) m.extra[key] = value;
  fence::check(fmt::format("the manifest of checkpoint step {}", step));
  writeManifest(dir, m);
  {
    std::lock_guard<std::mutex> g(mutex_);
    ++stats_.committed;
  }
  applyRetention();
  if (options_.remote) {
    options_.remote->upload(dir, m);
    // The same retention on the remote tier (it lists committed ones only).
    const auto steps = options_.remote->list();
    std::vector<CheckpointDir> dirs;
    for (int64_t s : steps) dirs.push_back({s, std::to_string(s)});
    for (const auto& victim :
         retentionVictims(dirs, std::vector<bool>(dirs.size(), true), options_.keepLast,
                          options_.keepEvery)) {
      options_.remote->remove(std::stoll(victim));
    }
  }
}

void Checkpointer::applyRetention() {
  fence::check("retention's deletions of old checkpoints");
  const auto dirs = listCheckpointDirs(options_.dir);
  std::vector<bool> valid;
  for (const auto& d : dirs) valid.push_back(verifyCheckpoint(d.path, false).valid);
  for (const auto& victim : retentionVictims(dirs, valid, options_.keepLast, options_.keepEvery)) {
    std::error_code ec;
    fs::remove_all(victim, ec);
    if (ec) log::warn("cannot delete old checkpoint {}: {}", victim, ec.message());
  }
}

void Checkpointer::poll() {
  std::vector<Event> events;
  {
    std::lock_guard<std::mutex> g(mutex_);
    events.swap(events_);
  }
  for (const auto& e : events) {
    if (e.skipped) {
      // Another rank's writer was behind: like a skip here, a warning. The
      // step counted as taken when this rank marked it is not committed, so
      // it moves to the skipped ones (each mark counts once).
      log::warn("{} (checkpoint.when_behind: skip)", e.message);
      std::lock_guard<std::mutex> g(mutex_);
      --stats_.taken;
      ++stats_.skipped;
      continue;
    }
    if (e.ok) {
      if (options_.rank == 0) {
        log::info("checkpoint step {} saved in {} ({}/{})", e.step, e.message, options_.dir,
                  checkpointDirName(e.step));
      }
      continue;
    }
    {
      std::lock_guard<std::mutex> g(mutex_);
      ++stats_.failed;
    }
    if (options_.onError == OnError::fail) {
      throw IoError(fmt::format("checkpoint step {} failed: {} (checkpoint.on_error: fail)", e.step,
                                e.message));
    }
    log::warn("checkpoint step {} failed: {} (checkpoint.on_error: warn; training goes on)", e.step,
              e.message);
  }
}

void Checkpointer::flush() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return stop_ || (copyQueue_.empty() && pendingWrites_ == 0); });
  }
  poll();
}

int64_t Checkpointer::lastWrittenStep() const {
  std::lock_guard<std::mutex> g(mutex_);
  return lastWrittenStep_;
}

CheckpointStats Checkpointer::stats() const {
  std::lock_guard<std::mutex> g(mutex_);
  CheckpointStats s = stats_;
  if (!blocked_.empty()) {
    std::vector<double> sorted = blocked_;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    s.medianBlockedSeconds = n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  }
  return s;
}

}  // namespace cohort::ckpt
