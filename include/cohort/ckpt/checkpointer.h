#pragma once

// Checkpoints that do not stall training.
//
// The training thread calls mark() at a step boundary: it copies the few
// tensors the next forward modifies (BatchNorm statistics, marked `early`),
// records which tensors make up the rest of the state, and returns. A copier
// thread then copies those into reusable host buffers while the next forward
// and backward run; waitCopied() before the next optimizer step blocks only
// if that copy is not done yet. A writer
// thread writes each buffer to disk (tensor files, fsync'd and renamed),
// reports to rank 0 through the rendezvous store, and rank 0 commits the
// checkpoint by writing manifest.json last. Errors of the background threads
// surface on the training thread in poll(), as warnings or as an exception
// (on_error). When every buffer set is still busy, mark() skips the
// checkpoint with a warning or waits for a free one (when_behind).
//
// Tiers: host memory (the buffer sets) -> local disk (the checkpoint
// directory) -> remote storage (a RemoteTier, optional).

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/tier.h"
#include "cohort/config/choices.h"
#include "cohort/security/keys.h"

namespace cohort::ckpt {

// What to do when a checkpoint is due while the last is still being written
// (skip or wait), and when writing one fails (warn or fail): the job's
// checkpoint.when_behind and checkpoint.on_error.
using cohort::OnError;
using cohort::WhenBehind;

struct CheckpointerOptions {
  std::string dir;  // parent of the step-<N> directories
  int rank = 0;
  int worldSize = 1;
  int maxInFlight = 1;  // host buffer sets (snapshots copied or being written)
  WhenBehind whenBehind = WhenBehind::skip;
  OnError onError = OnError::warn;
  int64_t keepLast = 3;
  int64_t keepEvery = 0;
  // How long rank 0 waits for the other ranks' files of one checkpoint.
  std::chrono::milliseconds timeout{300000};
  // A store client of the writer thread's own (not shared with the training
  // thread, whose store operations it would block). Null for one rank.
  c10::intrusive_ptr<c10d::Store> store;
  std::shared_ptr<RemoteTier> remote;
  // Added to every manifest's "extra" by rank 0's writer (constant fields,
  // such as the resolved job, that the training thread need not pass).
  nlohmann::json manifestExtra = nlohmann::json::object();
  // Seal every file with this key (AES-256-GCM, cohort/security/sealed.h);
  // none: plain files.
  std::optional<security::Key> sealWith;
  // No host copy: the writer writes each file straight from the live
  // tensors (through a buffer of a few MB), and waitCopied() waits until
  // they are written rather than copied. For a state whose copy would not
  // fit in memory (ZeRO stage 3 near the limit): forward and backward still
  // overlap the write; the optimizer step waits for it.
  bool inPlace = false;
  // Test hook: the writer stops in the middle of writing this step, for
  // good (pauseSeconds 0) or for that long.
  std::optional<int64_t> pauseAtStep;
  int64_t pauseSeconds = 0;
};

struct SnapshotItem {
  SnapshotItem(std::string name, at::Tensor tensor, bool early = false)
      : name(std::move(name)), tensor(std::move(tensor)), early(early) {}
  // A tensor the copier thread makes, from something the training thread
  // captured cheaply (e.g. a clone of a random generator).
  SnapshotItem(std::string name, std::function<at::Tensor()> make)
      : name(std::move(name)), make(std::move(make)) {}

  std::string name;
  at::Tensor tensor;   // a live tensor: copied by the copier thread
  bool early = false;  // modified by the next forward: copied by mark()
  std::function<at::Tensor()> make;  // instead of `tensor`
};

struct SnapshotFile {
  SnapshotFile(std::string name, std::vector<SnapshotItem> items,
               nlohmann::json meta = nlohmann::json::object())
      : name(std::move(name)),
        items(std::make_shared<const std::vector<SnapshotItem>>(std::move(items))),
        meta(std::move(meta)) {}
  // Items shared between checkpoints (the same live tensors every time):
  // marking one costs no copy of the list.
  SnapshotFile(std::string name, std::shared_ptr<const std::vector<SnapshotItem>> items,
               nlohmann::json meta = nlohmann::json::object())
      : name(std::move(name)), items(std::move(items)), meta(std::move(meta)) {}

  std::string name;  // e.g. "model.bin"
  std::shared_ptr<const std::vector<SnapshotItem>> items;
  nlohmann::json meta;
};

struct CheckpointStats {
  // Each mark() counts once: taken, or skipped because this rank's writer
  // was behind (or, on rank 0, another rank's was: not committed).
  int64_t taken = 0;      // mark() calls that took a snapshot
  int64_t skipped = 0;
  int64_t committed = 0;  // rank 0: manifests written; other ranks: files written
  int64_t failed = 0;
  double blockedSeconds = 0;     // training thread: mark + waits, in all
  double markSeconds = 0;        // of which gathering the tensors and mark()
  double copyWaitSeconds = 0;    // of which waiting before an optimizer step
  double maxBlockedSeconds = 0;  // the most for one checkpoint
  double medianBlockedSeconds = 0;  // the typical checkpoint
  uint64_t bytesWritten = 0;
};

class Checkpointer {
 public:
  explicit Checkpointer(CheckpointerOptions options);
  // Stops the threads without throwing: the file being written is finished,
  // snapshots not yet written are dropped, a commit waiting for other ranks
  // is abandoned. Call flush() first to keep them.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Allocates and touches every host buffer for snapshots of about `bytes`
  // now (during setup), so the first checkpoint does not pay for page faults
  // while training runs. Optional.
  void reserve(uint64_t bytes);

  // Takes a snapshot of `files` for `manifest.step` (manifest.files is filled
  // in by the writer). Returns false if it was skipped (writer behind).
  // `since`: when the caller started preparing it (gathering the tensors),
  // so the time the training thread is blocked counts that too.
  bool mark(Manifest manifest, std::vector<SnapshotFile> files,
            std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now());
  // Blocks until every tensor of the latest snapshot is copied (call it
  // before anything modifies them: the optimizer step). Cheap when they are.
  void waitCopied();
  // Reports what the background threads finished: logs commits, and errors
  // as warnings (on_error: warn) or throws IoError (fail).
  void poll();
  // Waits until every snapshot taken is written (and, on rank 0, committed),
  // then poll().
  void flush();
  CheckpointStats stats() const;
  // The step of the newest checkpoint this rank wrote (and, on rank 0,
  // committed); -1 if none.
  int64_t lastWrittenStep() const;

 private:
  struct Slot;
  struct Job;
  struct Event {
    bool ok = true;
    bool skipped = false;
    int64_t step = 0;
    std::string message;
  };
  void copyLoop();
  void copy(Job& job, Slot& slot);
  void writeLoop();
  void write(Job& job);
  std::vector<ManifestFile> writeInPlace(Job& job);
  void commit(Job& job, const std::vector<ManifestFile>& mine);
  void applyRetention();
  void pauseForTest(int64_t step);
  void addBlocked(double seconds);

  CheckpointerOptions options_;
  std::vector<std::unique_ptr<Slot>> slots_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> copyQueue_;
  std::deque<std::shared_ptr<Job>> writeQueue_;
  std::vector<Event> events_;
  int64_t markedSeq_ = 0;       // snapshots marked
  int64_t copiedSeq_ = 0;       // snapshots fully copied
  int64_t pendingWrites_ = 0;   // jobs queued or being written
  int64_t lastWrittenStep_ = -1;
  bool stop_ = false;
  CheckpointStats stats_;
  double currentBlocked_ = 0;
  std::vector<double> blocked_;  // per checkpoint taken, the last one still growing
  std::thread copier_;
  std::thread writer_;
};

}  // namespace cohort::ckpt
