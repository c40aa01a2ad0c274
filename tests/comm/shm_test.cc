// The shared-memory allreduce between real processes: sums for several world
// sizes and lengths (0, odd, not a multiple of the ranks' shares), every
// rank ending with the same bits, and a missing rank named in the timeout;
// the broadcast from any root, alone and between allreduces. The
// shared-memory channel between two processes: messages in order through a
// ring that wraps, a writer held back by a full ring, a size mismatch and a
// peer that exited named at once. The claimed sum (publish, sumPublished)
// against allreduce's bits, a rank's published part summed by another while
// it still writes, and a rank gone or late named.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "cohort/comm/shm.h"
#include "cohort/comm/shm_channel.h"
#include "cohort/core/error.h"
#include "util/forked.h"

namespace cohort::comm {
namespace {

std::string segmentName(const char* tag) { return "/cohort-test-" + std::to_string(::getpid()) + "-" + tag; }

using test::forkRanks;

class ShmSums : public ::testing::TestWithParam<int> {};

TEST_P(ShmSums, EveryRankGetsTheSameSum) {
  const int world = GetParam();
  const std::vector<size_t> lengths = {0, 1, 7, 16, 1000, 33333, 1 << 18};
  const size_t capacity = 1 << 19;
  const std::string name = segmentName("sums");
  // Rank 0 creates the segment before the others start.
  ShmAllreduce creator(name, 0, world, capacity, true);
  const auto codes = forkRanks(world, [&](int rank) {
    ShmAllreduce shm(name, rank, world, capacity, false);
    float* mine = shm.region();
    size_t offset = 0;
    for (size_t n : lengths) {
      for (size_t i = 0; i < n; ++i) mine[offset + i] = float(rank + 1) * 0.5f + float(i % 13);
      shm.allreduce(offset, n, std::chrono::seconds(60));
      for (size_t i = 0; i < n; ++i) {
        float expect = 0;
        for (int r = 0; r < world; ++r) expect += float(r + 1) * 0.5f + float(i % 13);
        if (mine[offset + i] != expect) {
          std::fprintf(stderr, "rank %d: n %zu element %zu: %g, expected %g\n", rank, n, i,
                       mine[offset + i], expect);
          return 1;
        }
      }
      offset = (offset + n + 64) % (capacity - (1 << 18) - 64);
    }
    // The same range again and again: no call overtakes the previous one.
    for (int k = 0; k < 200; ++k) {
      mine[5] = float(k);
      shm.allreduce(0, 100, std::chrono::seconds(60));
      if (mine[5] != float(k * world)) return 2;
    }
    return 0;
  });
  creator.unlink();
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShmSums, ::testing::Values(1, 2, 3, 4));

// A NaN or Inf anywhere -- in this rank's share of the sum or another's --
// makes every rank's allreduce report a non-finite sum; a later finite sum
// is reported finite again.
TEST_P(ShmSums, EveryRankLearnsOfANonFiniteElementAnywhere) {
  const int world = GetParam();
  const size_t n = 10000;
  const std::string name = segmentName("finite");
  ShmAllreduce creator(name, 0, world, n, true);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // (rank that poisons, element, value); element 9999 lies in the last rank's share.
  struct Poison {
    int rank;
    size_t at;
    float value;
  };
  const std::vector<Poison> poisons = {{0, 3, nan}, {world - 1, 0, inf}, {0, 9999, -inf},
                                       {world - 1, 5000, nan}};
  const auto codes = forkRanks(world, [&](int rank) {
    ShmAllreduce shm(name, rank, world, n, false);
    float* mine = shm.region();
    int code = 0;
    for (const Poison& p : poisons) {
      for (size_t i = 0; i < n; ++i) mine[i] = 1.0f;
      if (rank == p.rank) mine[p.at] = p.value;
      if (shm.allreduce(0, n, std::chrono::seconds(60))) code = 1;
      for (size_t i = 0; i < n; ++i) mine[i] = 1.0f;
      if (!shm.allreduce(0, n, std::chrono::seconds(60))) code = 2;
    }
    return code;
  });
  creator.unlink();
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r;
}

// The claimed sum: buckets published in turn, then sumPublished, for
// several steps and lengths (0, under one chunk, not a whole number of
// chunks). Every rank ends with allreduce's bits (the ranks' values added
// in rank order) in every element, and NaN anywhere is reported everywhere.
TEST_P(ShmSums, AClaimedSumGivesEveryRankAllreducesSumAndFiniteness) {
  const int world = GetParam();
  const std::vector<size_t> lengths = {(size_t{3} << 16) + 7, 0, 1000, size_t{1} << 17, 5};
  const size_t capacity = size_t{1} << 18;
  const std::string name = segmentName("claimed");
  ShmAllreduce creator(name, 0, world, capacity, true);
  auto value = [](int rank, size_t i, size_t step) {
    return float(rank + 1) * 0.37f + float((i * 7 + step) % 101) * 1.3f;
  };
  const auto codes = forkRanks(world, [&](int rank) {
    ShmAllreduce shm(name, rank, world, capacity, false);
    float* mine = shm.region();
    for (size_t step = 0; step < 12; ++step) {
      const size_t n = lengths[step % lengths.size()];
      // Three "buckets", published as each is written (a NaN in the last
      // rank's last element, every fourth step).
      const bool poisoned = step % 4 == 3 && n > 0;
      const size_t cuts[] = {n / 3, 2 * n / 3, n};
      size_t at = 0;
      for (size_t cut : cuts) {
        for (; at < cut; ++at) mine[at] = value(rank, at, step);
        if (poisoned && rank == world - 1 && cut == n) mine[n - 1] = std::numeric_limits<float>::quiet_NaN();
        shm.publish(cut);
      }
      if (shm.sumPublished(n, std::chrono::seconds(60)) == poisoned) return 10 + int(step);
      for (size_t i = 0; i + (poisoned ? 1 : 0) < n; ++i) {
        float expect = value(0, i, step);
        for (int r = 1; r < world; ++r) expect += value(r, i, step);
        if (mine[i] != expect) {
          std::fprintf(stderr, "rank %d step %zu: element %zu of %zu: %g, expected %g\n", rank, step,
                       i, n, mine[i], expect);
          return 2;
        }
      }
    }
    // Allreduce and the claimed sum in turn over the same segment.
    mine[3] = float(rank);
    shm.allreduce(0, 4, std::chrono::seconds(60));
    mine[3] = 1.0f;
    shm.sumPublished(4, std::chrono::seconds(60));
    return mine[3] == float(world) ? 0 : 4;
  });
  creator.unlink();
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r;
}

// What a rank still writing has published is summed by a rank that has
// finished: rank 1 publishes everything and sums; rank 0 publishes its first
// two chunks only, and sees their sum arrive in its own region before it
// writes the rest.
TEST(Shm, ARankStillWritingGetsWhatItPublishedSummedByOneThatFinished) {
  const size_t chunk = size_t{1} << 16;  // the claimed sum's unit
  const size_t n = 5 * chunk;
  const std::string name = segmentName("early");
  ShmAllreduce creator(name, 0, 2, n, true);
  const auto codes = forkRanks(2, [&](int rank) {
    ShmAllreduce shm(name, rank, 2, n, false);
    float* mine = shm.region();
    if (rank == 1) {
      for (size_t i = 0; i < n; ++i) mine[i] = 2.0f;
      return shm.sumPublished(n, std::chrono::seconds(60)) && mine[n - 1] == 3.0f ? 0 : 1;
    }
    for (size_t i = 0; i < 2 * chunk; ++i) mine[i] = 1.0f;
    shm.publish(2 * chunk);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    const volatile float* seen = mine;  // written by the other process
    auto summed = [&] { return seen[0] == 3.0f && seen[2 * chunk - 1] == 3.0f; };
    while (!summed()) {
      if (std::chrono::steady_clock::now() > deadline) return 5;
      std::this_thread::yield();
    }
    for (size_t i = 2 * chunk; i < n; ++i) mine[i] = 1.0f;
    if (!shm.sumPublished(n, std::chrono::seconds(60))) return 6;
    for (size_t i = 0; i < n; ++i) {
      if (mine[i] != 3.0f) return 7;
    }
    return 0;
  });
  creator.unlink();
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

// A rank that exited before publishing is named at once; one that never
// publishes is named when the wait times out.
TEST(Shm, AClaimedSumNamesARankThatExitedOrNeverPublished) {
  const std::string name = segmentName("claimgone");
  ShmAllreduce creator(name, 0, 3, 1 << 17, true);
  const auto codes = forkRanks(3, [&](int rank) {
    ShmAllreduce shm(name, rank, 3, 1 << 17, false);
    if (rank == 2) return 0;  // opened the segment, then left without calling
    if (rank == 1) shm.publish(1 << 16);
    try {
      shm.sumPublished(1 << 17, std::chrono::minutes(10));  // the exit is noticed long before
    } catch (const CommError& e) {
      return std::string(e.what()).find("rank 2 (pid") != std::string::npos ? 0 : 4;
    }
    return 5;
  });
  creator.unlink();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r;

  const std::string late = segmentName("claimlate");
  ShmAllreduce second(late, 0, 2, 64, true);
  const auto waited = forkRanks(1, [&](int) {
    ShmAllreduce shm(late, 0, 2, 64, false);
    try {
      shm.sumPublished(64, std::chrono::milliseconds(300));
    } catch (const TimeoutError& e) {
      const std::string m = e.what();
      if (m.find("waiting for rank(s) 1") == std::string::npos) std::fprintf(stderr, "%s\n", m.c_str());
      return m.find("waiting for rank(s) 1") != std::string::npos ? 0 : 4;
    }
    return 5;
  });
  second.unlink();
  EXPECT_EQ(waited[0], 0);
}

TEST(Shm, AllFiniteFindsNaNAndInfButNotLargeOrTinyValues) {
  std::vector<float> v(1000, 1.0f);
  v[10] = std::numeric_limits<float>::max();
  v[11] = std::numeric_limits<float>::denorm_min();
  v[12] = -0.0f;
  EXPECT_TRUE(allFinite(v.data(), v.size()));
  v[999] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(allFinite(v.data(), v.size()));
  v[999] = -std::numeric_limits<float>::infinity();
  EXPECT_FALSE(allFinite(v.data(), v.size()));
  EXPECT_TRUE(allFinite(v.data(), 999));
}

class ShmBroadcast : public ::testing::TestWithParam<int> {};

TEST_P(ShmBroadcast, EveryRankGetsTheRootsRange) {
  const int world = GetParam();
  const std::vector<size_t> lengths = {0, 1, 7, 1000, 33333, 1 << 18};
  const size_t capacity = 1 << 19;
  const std::string name = segmentName("broadcast");
  ShmAllreduce creator(name, 0, world, capacity, true);
  const auto codes = forkRanks(world, [&](int rank) {
    ShmAllreduce shm(name, rank, world, capacity, false);
    float* mine = shm.region();
    auto value = [](int r, size_t i) { return float(r + 1) * 1000.0f + float(i % 977); };
    size_t offset = 3;
    int call = 0;
    for (size_t n : lengths) {
      const int root = call++ % world;
      // Every rank's own values, with guards just outside the range.
      for (size_t i = 0; i < n + 2; ++i) mine[offset - 1 + i] = value(rank, i);
      shm.broadcast(offset, n, root, std::chrono::seconds(60));
      for (size_t i = 0; i < n; ++i) {
        if (mine[offset + i] != value(root, i + 1)) {
          std::fprintf(stderr, "rank %d: root %d n %zu element %zu: %g, expected %g\n", rank, root, n,
                       i, mine[offset + i], value(root, i + 1));
          return 1;
        }
      }
      if (mine[offset - 1] != value(rank, 0) || mine[offset + n] != value(rank, n + 1)) return 2;
      // The root may overwrite its range at once: every rank has copied it.
      if (rank == root) std::fill(mine + offset, mine + offset + n, -1.0f);
      // Allreduce and broadcast interleaved: a sum, then the root's copy of it.
      mine[offset] = float(rank);
      shm.allreduce(offset, 1, std::chrono::seconds(60));
      if (rank == root) mine[offset] += 0.5f;
      shm.broadcast(offset, 1, root, std::chrono::seconds(60));
      if (mine[offset] != float(world * (world - 1) / 2) + 0.5f) return 3;
      offset = (offset + n + 64) % (capacity - (1 << 18) - 64) + 1;
    }
    return 0;
  });
  creator.unlink();
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShmBroadcast, ::testing::Values(1, 2, 3, 4));

// ZeRO's halves: after reduceScatter rank r's chunk r holds the sum and
// the rest of every region is as it was; after allgather every region holds
// each rank's own chunk; a NaN in one rank's input reaches every rank's
// verdict.
class ShmParts : public ::testing::TestWithParam<int> {};

TEST_P(ShmParts, ReduceScatterSumsOnlyTheOwnChunkAndAllgatherSharesThem) {
  const int world = GetParam();
  const size_t capacity = 1 << 19;
  const std::string name = segmentName("parts");
  ShmAllreduce creator(name, 0, world, capacity, true);
  const auto codes = forkRanks(world, [&](int rank) {
    ShmAllreduce shm(name, rank, world, capacity, false);
    float* mine = shm.region();
    auto input = [](int r, size_t i) { return float(r + 1) * 0.25f + float(i % 11); };
    size_t offset = 5;
    for (size_t chunk : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}}) {
      const size_t n = chunk * static_cast<size_t>(world);
      for (size_t i = 0; i < n + 1; ++i) mine[offset + i] = input(rank, i);
      if (!shm.reduceScatter(offset, n, std::chrono::seconds(60))) return 1;
      for (size_t i = 0; i < n + 1; ++i) {
        const bool own = i / std::max<size_t>(chunk, 1) == static_cast<size_t>(rank) && i < n;
        float expect = input(rank, i);
        if (own) {
          expect = input(0, i);
          for (int r = 1; r < world; ++r) expect += input(r, i);
        }
        if (mine[offset + i] != expect) {
          std::fprintf(stderr, "rank %d: chunk %zu element %zu: %g, expected %g\n", rank, chunk, i,
                       mine[offset + i], expect);
          return 2;
        }
      }
      // Each rank marks its chunk; the gather brings every mark everywhere.
      for (size_t i = 0; i < chunk; ++i) mine[offset + chunk * static_cast<size_t>(rank) + i] = float(rank * 10000 + int(i));
      shm.allgather(offset, n, std::chrono::seconds(60));
      for (size_t i = 0; i < n; ++i) {
        const size_t owner = i / chunk;
        if (mine[offset + i] != float(int(owner) * 10000 + int(i % chunk))) return 3;
      }
      if (mine[offset + n] != input(rank, n)) return 4;  // past the range: untouched
      offset += n + 3;
    }
    // A NaN in the last rank's part of rank 0's input: everyone hears of it.
    const size_t n = 6 * static_cast<size_t>(world);
    for (size_t i = 0; i < n; ++i) mine[i] = 1.0f;
    if (rank == 0) mine[n - 1] = std::numeric_limits<float>::quiet_NaN();
    if (shm.reduceScatter(0, n, std::chrono::seconds(60))) return 5;
    for (size_t i = 0; i < n; ++i) mine[i] = 1.0f;
    if (!shm.reduceScatter(0, n, std::chrono::seconds(60))) return 6;
    return 0;
  });
  creator.unlink();
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r;
}


// ZeRO stage 3's pattern: each rank writes its part, a barrier, every rank
// reads every other rank's part in place; a reduce-scatter elsewhere in the
// regions is what keeps the next write from overtaking those reads.
TEST_P(ShmParts, WhatARankWroteBeforeABarrierIsReadInItsRegionByEveryRank) {
  const int world = GetParam();
  const size_t capacity = 4096;
  const std::string name = segmentName("barrier");
  ShmAllreduce creator(name, 0, world, capacity, true);
  const auto codes = forkRanks(world, [&](int rank) {
    ShmAllreduce shm(name, rank, world, capacity, false);
    for (int k = 0; k < 100; ++k) {
      for (size_t i = 0; i < 64; ++i) shm.region()[i] = float(k * 1000 + rank * 100) + float(i);
      shm.barrier(std::chrono::seconds(60));
      for (int r = 0; r < world; ++r) {
        const float* theirs = shm.regionOf(r);
        for (size_t i = 0; i < 64; ++i) {
          if (theirs[i] != float(k * 1000 + r * 100) + float(i)) {
            std::fprintf(stderr, "rank %d round %d: rank %d's element %zu is %g\n", rank, k, r, i,
                         theirs[i]);
            return 1;
          }
        }
      }
      const size_t n = 8 * static_cast<size_t>(world);
      for (size_t i = 0; i < n; ++i) shm.region()[1024 + i] = 1.0f;
      if (!shm.reduceScatter(1024, n, std::chrono::seconds(60))) return 2;
      if (shm.region()[1024 + 8 * static_cast<size_t>(rank)] != float(world)) return 3;
    }
    return 0;
  });
  creator.unlink();
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShmParts, ::testing::Values(1, 2, 3, 4));

TEST(Shm, ErrorsNameTheRanksOfTheJob) {
  // A segment among ranks 4, 7 and 9 of a job: rank 7 never arrives.
  const std::string name = segmentName("names");
  ShmAllreduce creator(name, 0, 3, 64, true);
  const auto codes = forkRanks(2, [&](int child) {
    const int index = child == 0 ? 0 : 2;
    ShmAllreduce shm(name, index, 3, 64, false);
    shm.nameRanks({4, 7, 9});
    try {
      shm.broadcast(0, 64, 0, std::chrono::milliseconds(300));
    } catch (const TimeoutError& e) {
      const std::string m = e.what();
      const bool named = m.find("waiting for rank(s) 7") != std::string::npos &&
                         m.find(index == 0 ? "rank 4:" : "rank 9:") != std::string::npos;
      if (!named) std::fprintf(stderr, "%s\n", m.c_str());
      return named ? 0 : 4;
    }
    return 5;
  });
  creator.unlink();
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

TEST(Shm, AMissingRankIsNamedWhenTheWaitTimesOut) {
  const std::string name = segmentName("timeout");
  ShmAllreduce creator(name, 0, 3, 64, true);
  // Ranks 0 and 2 call; rank 1 never does.
  const auto codes = forkRanks(2, [&](int child) {
    const int rank = child == 0 ? 0 : 2;
    ShmAllreduce shm(name, rank, 3, 64, false);
    try {
      shm.allreduce(0, 64, std::chrono::milliseconds(300));
    } catch (const TimeoutError& e) {
      return std::string(e.what()).find("waiting for rank(s) 1") != std::string::npos ? 0 : 4;
    }
    return 5;
  });
  creator.unlink();
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

TEST(Shm, ARankThatExitedIsNamedAtOnce) {
  const std::string name = segmentName("exited");
  ShmAllreduce creator(name, 0, 2, 64, true);
  const auto codes = forkRanks(2, [&](int rank) {
    ShmAllreduce shm(name, rank, 2, 64, false);
    if (rank == 1) return 0;  // opened the segment, then left without calling
    try {
      // A long timeout: the exit must be noticed long before it.
      shm.allreduce(0, 64, std::chrono::minutes(10));
    } catch (const CommError& e) {
      return std::string(e.what()).find("rank 1 (pid") != std::string::npos ? 0 : 4;
    }
    return 5;
  });
  creator.unlink();
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

TEST(Shm, OpeningAMissingSegmentNamesIt) {
  try {
    ShmAllreduce shm(segmentName("absent"), 1, 2, 16, false);
    FAIL() << "opened a segment that does not exist";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("absent"), std::string::npos) << e.what();
  }
}

TEST(ShmChannel, MessagesArriveInOrderThroughARingThatWraps) {
  const std::string name = segmentName("channel");
  const size_t slot = 1000;
  ShmChannel writer(name, slot, 3, /*writer=*/true);
  test::ForkedRanks reader(1, [&](int) {
    ShmChannel r(name, slot, 3, /*writer=*/false);
    r.unlink();
    // Messages of varying sizes, each filled with its number.
    for (int k = 0; k < 500; ++k) {
      const size_t n = 1 + static_cast<size_t>(k * 37) % slot;
      std::vector<unsigned char> got(n);
      r.read(got.data(), n, std::chrono::seconds(60), "the writer");
      for (unsigned char c : got) {
        if (c != static_cast<unsigned char>(k)) return 4;
      }
    }
    return 0;
  });
  for (int k = 0; k < 500; ++k) {
    const size_t n = 1 + static_cast<size_t>(k * 37) % slot;
    const std::vector<unsigned char> msg(n, static_cast<unsigned char>(k));
    writer.write(msg.data(), n, std::chrono::seconds(60), "the reader");
  }
  EXPECT_EQ(reader.wait()[0], 0);
}

TEST(ShmChannel, AFullRingHoldsTheWriterAndAnEmptyOneTheReader) {
  const std::string name = segmentName("full");
  ShmChannel writer(name, 8, 2, /*writer=*/true);
  ShmChannel reader(name, 8, 2, /*writer=*/false);
  reader.unlink();
  for (int64_t k = 0; k < 2; ++k) writer.write(&k, sizeof(k), std::chrono::seconds(5), "the reader");
  // Both slots unread: a third message waits (here until its timeout)
  // rather than overwrite one.
  const int64_t third = 2;
  EXPECT_THROW(writer.write(&third, sizeof(third), std::chrono::milliseconds(50), "the reader"), TimeoutError);
  int64_t v = -1;
  reader.read(&v, sizeof(v), std::chrono::seconds(5), "the writer");
  EXPECT_EQ(v, 0);
  writer.write(&third, sizeof(third), std::chrono::seconds(5), "the reader");
  for (int64_t k = 1; k < 3; ++k) {
    reader.read(&v, sizeof(v), std::chrono::seconds(5), "the writer");
    EXPECT_EQ(v, k);
  }
  try {
    reader.read(&v, sizeof(v), std::chrono::milliseconds(50), "stage 0 (rank 0)");
    FAIL() << "read from an empty ring";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("stage 0 (rank 0) did not write"), std::string::npos) << e.what();
  }
  // A message read with another size than it was written: an error, not garbage.
  const int32_t small = 7;
  writer.write(&small, sizeof(small), std::chrono::seconds(5), "the reader");
  try {
    reader.read(&v, sizeof(v), std::chrono::seconds(5), "the writer");
    FAIL() << "read 8 bytes of a 4-byte message";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("4 bytes, 8 expected"), std::string::npos) << e.what();
  }
}

TEST(ShmChannel, AReaderThatExitedIsNamedAtOnce) {
  const std::string name = segmentName("exited-reader");
  ShmChannel writer(name, 8, 1, /*writer=*/true);
  // The reader opens the ring and leaves without reading.
  test::ForkedRanks reader(1, [&](int) {
    ShmChannel r(name, 8, 1, /*writer=*/false);
    return 0;
  });
  const int64_t v = 1;
  writer.write(&v, sizeof(v), std::chrono::seconds(5), "the reader");
  try {
    // A long timeout: the exit must be noticed long before it.
    writer.write(&v, sizeof(v), std::chrono::minutes(10), "stage 1 (rank 1)");
    FAIL() << "wrote into a full ring whose reader exited";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("stage 1 (rank 1) (pid"), std::string::npos) << e.what();
  }
  EXPECT_EQ(reader.wait()[0], 0);
}

}  // namespace
}  // namespace cohort::comm
