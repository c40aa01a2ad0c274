#pragma once

// Sum-allreduce among the ranks of one machine through a shared memory
// segment, instead of Gloo's loopback TCP: no sockets, no kernel copies.
//
// The segment holds one region per rank of `floatsPerRank` floats; a caller
// keeps its data there (DDP's gradient buckets are allocated in it, and its
// hook copies each gradient into them). allreduce(offset, n) sums the n floats
// at `offset` of every rank's region and leaves the sum in every region:
//
//   arrive(1); wait until every rank arrived(1)      // all inputs are final
//   rank r sums its 1/N-th of the range over the N regions and writes the
//     sum into all N regions                          // reduce-scatter + all-gather in one pass
//   arrive(2); wait until every rank arrived(2)       // all sums are written
//
// publish(end) and sumPublished(n) split the same sum over a step: each
// rank publishes how much of its region it has written as its buckets fill
// during backward, and sumPublished cuts [0, n) into chunks that any rank
// claims. A rank done with backward early sums the chunks the others have
// published while they still compute, instead of waiting for them at every
// bucket; every chunk's sum still goes into every region.
//
// broadcast(offset, n, root) copies root's range into every other region,
// between the same two barriers (the first makes root's data final, the
// second keeps root from overwriting it before every rank has copied).
//
// Waiting uses a futex in the segment (no spinning that would take a core
// from training). Every rank must make the same calls (allreduce or
// broadcast, with the same offset, n and root) in the same order. This
// header does not include LibTorch.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace cohort::comm {

// Whether none of the n floats is NaN or Inf.
bool allFinite(const float* data, size_t n);

class ShmAllreduce {
 public:
  static constexpr int kMaxRanks = 256;

  // Creates (create = true; exactly one rank) or opens the POSIX shared
  // memory object `name`; the creator reserves every page up front. Throws
  // IoError naming it (e.g. /dev/shm too small).
  ShmAllreduce(const std::string& name, int rank, int worldSize, size_t floatsPerRank, bool create);
  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  // Removes the name; the memory lives on while mapped. Call once every rank
  // has opened it, so that nothing is left in /dev/shm after a crash.
  void unlink();

  // This rank's region (floatsPerRank floats, zero at creation).
  float* region() const;
  size_t floatsPerRank() const { return floatsPerRank_; }
  int rank() const { return rank_; }
  int worldSize() const { return world_; }

  // Sums floats [offset, offset + n) of every rank's region into all of
  // them, and returns whether every element of the sum is finite (the same
  // answer on every rank). Blocks until every rank has made this call;
  // throws CommError when a rank's process has exited, and TimeoutError
  // naming the ranks that did not arrive within `timeout`.
  bool allreduce(size_t offset, size_t n, std::chrono::milliseconds timeout);

  // The sum of allreduce(0, n), claimed in chunks over one step. publish(end):
  // floats [0, end) of this rank's region hold its input of the next
  // sumPublished (ends grow over the step; a smaller one is ignored).
  // sumPublished(n) publishes n, then claims chunks and sums each one once
  // every rank has published it, and returns when every chunk's sum is in
  // every region, with whether all are finite (the same answer on every
  // rank). The sums' bits are allreduce's. Every rank makes the same
  // sumPublished calls with the same n; throws as allreduce (naming the
  // ranks that have not published, or not summed what they claimed).
  void publish(size_t end);
  bool sumPublished(size_t n, std::chrono::milliseconds timeout);

  // Copies floats [offset, offset + n) of rank `root`'s region into every
  // other rank's region. Blocks until every rank has made this call; root
  // also until every rank has copied (the others return as soon as they
  // have). Throws as allreduce.
  void broadcast(size_t offset, size_t n, int root, std::chrono::milliseconds timeout);

  // ZeRO's halves of allreduce, over a range [offset, offset + n) whose n
  // divides into one chunk per rank (chunk r: [r n/N, (r+1) n/N)).
  // reduceScatter: rank r sums chunk r over every region into its own
  // region only (the other ranks' regions keep their inputs); returns
  // whether every chunk's sum is finite (the same answer on every rank).
  // allgather: every rank copies chunk j of rank j's region into its own,
  // for every j. Both block as allreduce does and throw as it does.
  bool reduceScatter(size_t offset, size_t n, std::chrono::milliseconds timeout);
  void allgather(size_t offset, size_t n, std::chrono::milliseconds timeout);

  // Rank `index`'s region, for reading what that rank wrote before the last
  // barrier both passed (ZeRO stage 3 reads the other ranks' parts there).
  float* regionOf(int index) const;
  // Returns once every rank has called it: what each rank wrote to its
  // region before is then visible to all. Throws as allreduce.
  void barrier(std::chrono::milliseconds timeout);

  // The names of the ranks in error messages: by default their index in the
  // segment; a group formed from some ranks of a job passes their ranks in
  // the job (one per index).
  void nameRanks(std::vector<int> names);

 private:
  struct Header;
  void arrive(int phase, uint64_t seq);
  void waitAll(int phase, uint64_t seq, std::chrono::steady_clock::time_point deadline);
  // Waits on futex word `phase` until there(r) holds for every rank r;
  // throws naming the ranks it does not hold for (`what`: the operation).
  void waitFor(int phase, const std::function<bool(int)>& there, const std::string& what,
               std::chrono::steady_clock::time_point deadline);
  // Sums floats [begin, end) of every region into all of them; whether the
  // sum is finite.
  bool sumIntoEveryRegion(size_t begin, size_t end);
  // Every call's first barrier: numbers the call, arrives, waits for every
  // rank (their inputs are final); returns the call's number.
  uint64_t enter(std::chrono::steady_clock::time_point deadline);
  // The chunk of each rank in [offset, offset + n), which must lie in a
  // region and divide into one chunk per rank.
  size_t chunkOf(size_t offset, size_t n) const;
  // The second barrier of a sum, through which every rank learns whether
  // all ranks' parts were finite.
  bool agreeFinite(bool finite, uint64_t seq, std::chrono::steady_clock::time_point deadline);
  int nameOf(int index) const;

  std::string name_;
  int rank_;
  int world_;
  size_t floatsPerRank_;
  size_t bytes_ = 0;
  void* base_ = nullptr;
  Header* header_ = nullptr;
  float* data_ = nullptr;
  size_t regionStride_ = 0;  // floats from one rank's region to the next
  uint64_t seq_ = 0;
  uint64_t sums_ = 0;       // sumPublished calls made
  uint64_t chunkBase_ = 0;  // their chunks in all
  bool creator_ = false;
  bool unlinked_ = false;
  std::vector<int> names_;
};

}  // namespace cohort::comm
