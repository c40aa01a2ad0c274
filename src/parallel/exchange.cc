#include "parallel/detail/exchange.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>

#include "cohort/comm/shm.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace cohort::parallel {

const char* exchangeName(Exchange e) {
  switch (e) {
    case Exchange::none: return "none";
    case Exchange::gloo: return "gloo";
    case Exchange::sharedMemory: return "shared_memory";
    case Exchange::hierarchical: return "hierarchical";
  }
  return "?";
}

namespace detail {
namespace {

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

std::string get(const comm::Comm& c, const std::string& key) {
  try {
    c.store->wait({key}, c.timeout);
    return text(c.store->get(key));
  } catch (const c10::Error& e) {
    throw TimeoutError(fmt::format("rank {}: gradient exchange set-up: no {} in the store within {} s: {}",
                                   c.rank, key, c.timeout.count() / 1000.0, e.what_without_backtrace()));
  }
}

// The segment among `members` (ranks of one machine): members[0] creates it
// and publishes its name (or "!" and why not) under `key`; the others open
// it. Returns the segment, or null with `error` set.
std::shared_ptr<comm::ShmAllreduce> openSegment(const comm::Comm& c, const std::string& key,
                                                const std::vector<int>& members,
                                                const std::string& tag, int64_t totalFloats,
                                                std::string& error) {
  const int size = static_cast<int>(members.size());
  const int index = static_cast<int>(std::find(members.begin(), members.end(), c.rank) - members.begin());
  const size_t floats = static_cast<size_t>(totalFloats);
  std::shared_ptr<comm::ShmAllreduce> shm;
  if (index == 0) {
    // The creator's pid makes the name unique on this host.
    const std::string name = fmt::format("/cohort-{}-{}-{}", ::getpid(), tag, c.masterPort);
    try {
      shm = std::make_shared<comm::ShmAllreduce>(name, 0, size, floats, true);
    } catch (const Error& e) {
      error = e.what();
    }
    c.store->set(key, bytes(error.empty() ? name : "!" + error));
  } else {
    const std::string name = get(c, key);
    if (!name.empty() && name[0] == '!') {
      error = name.substr(1);
    } else {
      try {
        shm = std::make_shared<comm::ShmAllreduce>(name, index, size, floats, false);
      } catch (const Error& e) {
        error = e.what();
      }
    }
  }
  if (shm) shm->nameRanks(members);
  return shm;
}

}  // namespace

ExchangePlan planExchange(const comm::Comm& c, bool sharedMemory, const std::string& why,
                          int64_t totalFloats, bool acrossMachines, const std::string& what) {
  ExchangePlan plan;
  plan.local = {c.rank};
  if (c.worldSize == 1) return plan;
  plan.exchange = Exchange::gloo;
  if (!sharedMemory) {
    log::info("{}: Gloo ({})", what, why);
    return plan;
  }
  // Every DDP of a job is built in the same order on every rank: number them
  // for the store keys, per rank (tests run several ranks in one process).
  static std::mutex mutex;
  static std::map<std::string, int> instances;
  int instance = 0;
  {
    std::lock_guard<std::mutex> g(mutex);
    instance = instances[fmt::format("{}#{}", c.storePrefix, c.rank)]++;
  }
  const std::string prefix = fmt::format("ddp/{}", instance);

  // Machines, numbered by their lowest rank (the same on every rank).
  c.store->set(fmt::format("{}/machine/{}", prefix, c.rank), bytes(comm::machineIdentity(c.jobRank(c.rank))));
  std::map<std::string, int> index;
  std::vector<std::vector<int>> members;
  std::vector<int> machineOf(static_cast<size_t>(c.worldSize));
  for (int r = 0; r < c.worldSize; ++r) {
    const std::string id = get(c, fmt::format("{}/machine/{}", prefix, r));
    auto [it, fresh] = index.emplace(id, static_cast<int>(members.size()));
    if (fresh) members.emplace_back();
    members[static_cast<size_t>(it->second)].push_back(r);
    machineOf[static_cast<size_t>(r)] = it->second;
  }
  plan.machines = static_cast<int>(members.size());
  plan.machine = machineOf[static_cast<size_t>(c.rank)];
  plan.local = members[static_cast<size_t>(plan.machine)];
  plan.leader = plan.local.front() == c.rank;
  bool sharing = false;  // some machine has two ranks or more
  for (const auto& m : members) sharing = sharing || m.size() > 1;
  if (!sharing) {
    log::info("{}: Gloo ({} machines, one rank on each)", what, plan.machines);
    return plan;
  }
  if (plan.machines > 1 && !acrossMachines) {
    log::info("{}: Gloo among all ranks ({} machines; {})", what, plan.machines, why);
    return plan;
  }

  std::string error;
  if (plan.local.size() > 1) {
    plan.shm = openSegment(c, fmt::format("{}/shm/{}", prefix, plan.machine), plan.local,
                           fmt::format("{}-{}", instance, plan.machine), totalFloats, error);
  }
  if (plan.machines > 1 && plan.leader) {
    // Every leader joins, whatever its segment did, so that none waits for
    // one that gave up.
    try {
      plan.across = comm::newGroup(c, prefix + "/across", plan.machine, plan.machines);
    } catch (const Error& e) {
      if (error.empty()) error = e.what();
    }
  }
  // Every rank must take the same path: agree on whether every rank has
  // what it needs.
  at::Tensor failed = torch::tensor({error.empty() ? 0.0 : 1.0}, torch::kFloat64);
  comm::allreduceSum(c, failed, (what + " set-up").c_str());
  if (plan.shm && plan.leader) plan.shm->unlink();  // every member has it mapped by now
  if (failed.item<double>() > 0) {
    plan.shm.reset();
    plan.across.reset();
    log::warn("{}: Gloo, as {} could not be set up{}", what,
              plan.machines > 1 ? "the hierarchical exchange" : "shared memory",
              error.empty() ? " on another rank" : ": " + error);
    return plan;
  }
  if (plan.machines == 1) {
    plan.exchange = Exchange::sharedMemory;
    log::info("{}: shared memory ({} MB per rank)", what, totalFloats * 4 >> 20);
    return plan;
  }
  plan.exchange = Exchange::hierarchical;
  log::info(
      "{}: hierarchical: {} machines, shared memory within, Gloo across (this is "
      "machine {} with ranks {}{})",
      what, plan.machines, plan.machine, fmt::join(plan.local, ", "),
      plan.leader ? "; this rank leads it" : "");
  return plan;
}

}  // namespace detail
}  // namespace cohort::parallel
