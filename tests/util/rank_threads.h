#pragma once

// Ranks as threads of this process, each with its own store connection and
// process group: for tests of collectives that need no separate processes.

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "cohort/comm/comm.h"
#include "util/process.h"

namespace cohort::test {

// Runs body(comm) on `world` ranks, each a thread, and joins them. A rank's
// exception is a test failure naming the rank. Every rank's connection
// lives until all have joined: rank 0 hosts the store, and a rank 0 whose
// body ends at once (an error every rank raises) must not close it while
// another rank is still connecting.
template <class F>
void withRankThreads(int world, const std::string& storePrefix, F&& body) {
  const int port = freePort();
  std::vector<comm::Comm> comms(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        comm::CommOptions o;
        o.rank = rank;
        o.worldSize = world;
        o.masterPort = port;
        o.hostStore = rank == 0;
        o.timeout = std::chrono::seconds(60);
        o.storePrefix = storePrefix;
        comm::Comm& c = comms[static_cast<size_t>(rank)];
        c = comm::connect(o);
        body(c);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << rank << ": " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace cohort::test
