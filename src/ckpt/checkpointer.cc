#include "cohort/ckpt/checkpointer.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>

#include "cohort/ckpt/tensor_file.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace fs = std::filesystem;

namespace cohort::ckpt {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

constexpr uint64_t kAlign = 64;
uint64_t alignUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

std::string statusKey(int64_t step, int rank) {
  return fmt::format("ckpt/step-{}/rank-{}", step, rank);
}

std::vector<uint8_t> bytesOf(const std::string& s) { return {s.begin(), s.end()}; }
std::string stringOf(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

}  // namespace

// One set of host buffers: a snapshot is copied into it and written from it.
struct Checkpointer::Slot {
  at::Tensor buffer;  // uint8, grown as needed
  bool busy = false;
};

struct Checkpointer::Job {
  int64_t seq = 0;
  int slot = -1;  // -1: skipped (nothing to write)
  Manifest manifest;
  std::vector<SnapshotFile> files;
  std::vector<std::vector<uint64_t>> offsets;  // per file, per item: offset in the slot buffer
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
  stats_.blockedSeconds += seconds;
  stats_.lastBlockedSeconds = currentBlocked_;
  stats_.maxBlockedSeconds = std::max(stats_.maxBlockedSeconds, currentBlocked_);
}

bool Checkpointer::mark(Manifest manifest, std::vector<SnapshotFile> files) {
  const auto start = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  currentBlocked_ = 0;
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
  slots_[static_cast<size_t>(slot)]->busy = true;
  job->slot = slot;
  job->files = std::move(files);
  job->seq = ++markedSeq_;
  ++stats_.taken;
  ++pendingWrites_;
  copyQueue_.push_back(job);
  addBlocked(secondsSince(start));
  lock.unlock();
  cv_.notify_all();
  return true;
}

void Checkpointer::waitEarly() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (earlyCopiedSeq_ >= markedSeq_) return;
  const auto start = Clock::now();
  cv_.wait(lock, [&] { return stop_ || earlyCopiedSeq_ >= markedSeq_; });
  addBlocked(secondsSince(start));
}

void Checkpointer::waitCopied() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (copiedSeq_ >= markedSeq_) return;
  const auto start = Clock::now();
  cv_.wait(lock, [&] { return stop_ || copiedSeq_ >= markedSeq_; });
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
    // Lay the tensors out in the slot buffer, early ones first.
    uint64_t total = 0;
    job->offsets.assign(job->files.size(), {});
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t f = 0; f < job->files.size(); ++f) {
        auto& items = job->files[f].items;
        job->offsets[f].resize(items.size());
        for (size_t i = 0; i < items.size(); ++i) {
          if (items[i].early != (pass == 0)) continue;
          job->offsets[f][i] = total;
          total = alignUp(total + items[i].tensor.nbytes());
        }
      }
    }
    if (!slot->buffer.defined() || static_cast<uint64_t>(slot->buffer.numel()) < total) {
      slot->buffer = torch::empty({static_cast<int64_t>(std::max<uint64_t>(total, 1))}, torch::kUInt8);
    }
    auto* base = static_cast<char*>(slot->buffer.data_ptr());
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t f = 0; f < job->files.size(); ++f) {
        auto& items = job->files[f].items;
        for (size_t i = 0; i < items.size(); ++i) {
          if (items[i].early != (pass == 0)) continue;
          const at::Tensor& t = items[i].tensor;
          char* dst = base + job->offsets[f][i];
          if (t.device().is_cpu() && t.is_contiguous()) {
            std::memcpy(dst, t.data_ptr(), t.nbytes());
          } else {
            at::Tensor host = t.contiguous().to(torch::kCPU);
            std::memcpy(dst, host.data_ptr(), host.nbytes());
          }
        }
      }
      std::lock_guard<std::mutex> g(mutex_);
      if (pass == 0) {
        earlyCopiedSeq_ = job->seq;
      } else {
        copiedSeq_ = job->seq;
        writeQueue_.push_back(job);
      }
      cv_.notify_all();
    }
  }
}

void Checkpointer::writeLoop() {
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
    } catch (const std::exception& e) {
      ev.ok = false;
      ev.message = e.what();
    }
    std::lock_guard<std::mutex> g(mutex_);
    if (job->slot >= 0) {
      slots_[static_cast<size_t>(job->slot)]->busy = false;
      events_.push_back(std::move(ev));
      stats_.writeSeconds += secondsSince(start);
    }
    --pendingWrites_;
    cv_.notify_all();
  }
}

void Checkpointer::pauseForTest(int64_t step) {
  log::warn("checkpoint writer paused while writing step {} (COHORT_TEST_CKPT_PAUSE)", step);
  log::flush();
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait_for(lock, std::chrono::minutes(10), [&] { return stop_; });
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
    post({{"ok", false}, {"error", fmt::format("rank {} skipped it (writer behind)", options_.rank)}});
    return;
  }
  std::vector<ManifestFile> mine;
  try {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw IoError(fmt::format("cannot create checkpoint directory {}: {}", dir, ec.message()));
    // A manifest left by an earlier attempt at this step no longer describes it.
    if (options_.rank == 0) fs::remove(dir + "/manifest.json", ec);
    const auto* base = static_cast<const char*>(slots_[static_cast<size_t>(job.slot)]->buffer.data_ptr());
    bool paused = false;
    for (size_t f = 0; f < job.files.size(); ++f) {
      const SnapshotFile& file = job.files[f];
      std::vector<TensorRecord> records;
      records.reserve(file.items.size());
      for (size_t i = 0; i < file.items.size(); ++i) {
        const at::Tensor& t = file.items[i].tensor;
        TensorRecord r;
        r.name = file.items[i].name;
        r.dtype = t.scalar_type();
        r.shape = t.sizes().vec();
        r.data = base + job.offsets[f][i];
        r.nbytes = t.nbytes();
        records.push_back(std::move(r));
      }
      std::function<void()> hook;
      if (options_.pauseAtStep && *options_.pauseAtStep == step && !paused) {
        paused = true;
        hook = [&] { pauseForTest(step); };
      }
      WrittenFile w = writeTensorFile(dir + "/" + file.name, records, file.meta, hook);
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

void Checkpointer::commit(Job& job, const std::vector<ManifestFile>& mine) {
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
    if (!status.value("ok", false)) {
      throw IoError(fmt::format("checkpoint step {} not committed: {}", step,
                                status.value("error", std::string("rank failed"))));
    }
    for (const auto& f : status.at("files")) {
      m.files.push_back({f.at("name").get<std::string>(), f.at("size").get<uint64_t>(),
                         f.at("checksum").get<std::string>(), r});
    }
  }
  m.created = utcNow();
  writeManifest(dir, m);
  {
    std::lock_guard<std::mutex> g(mutex_);
    ++stats_.committed;
  }
  applyRetention();
  if (options_.remote) options_.remote->upload(dir, m);
}

void Checkpointer::applyRetention() {
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

CheckpointStats Checkpointer::stats() const {
  std::lock_guard<std::mutex> g(mutex_);
  return stats_;
}

}  // namespace cohort::ckpt
