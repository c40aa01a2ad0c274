#include "cohort/elastic/rendezvous.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "core/detail/json_int.h"

namespace cohort::elastic {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct State {
  int64_t round = 0;
  std::string status = "open";
  std::vector<std::string> members;
  std::map<std::string, std::string> addrs;
  std::vector<std::string> waiting;
  std::vector<std::string> known;  // every node that was ever a member or waited
  std::string jobHash;
  int exitCode = 0;
};

State parse(const std::string& text, const std::string& key) {
  try {
    const json j = json::parse(text);
    State s;
    s.round = jsonInt<int64_t>(j.at("round"));
    s.status = j.at("status").get<std::string>();
    s.members = j.value("members", std::vector<std::string>{});
    s.addrs = j.value("addrs", std::map<std::string, std::string>{});
    s.waiting = j.value("waiting", std::vector<std::string>{});
    s.known = j.value("known", std::vector<std::string>{});
    s.jobHash = j.value("job_hash", "");
    s.exitCode = jsonInt<int>(j, "exit_code", 0);
    return s;
  } catch (const json::exception& e) {
    throw CommError(fmt::format("rendezvous record {} is unreadable: {}", key, e.what()));
  }
}

std::string dump(const State& s) {
  return json{{"round", s.round},     {"status", s.status},   {"members", s.members},
              {"addrs", s.addrs},     {"waiting", s.waiting}, {"known", s.known},
              {"job_hash", s.jobHash}, {"exit_code", s.exitCode}}
      .dump();
}

bool has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

void drop(std::vector<std::string>& v, const std::string& x) {
  v.erase(std::remove(v.begin(), v.end(), x), v.end());
}

}  // namespace

std::string aliveKey(const std::string& prefix, const std::string& node) {
  return prefix + "/alive/" + node;
}

Rendezvous::Rendezvous(Kv& kv, RendezvousOptions options)
    : kv_(kv), o_(std::move(options)), stateKey_(o_.prefix + "/state") {
  if (o_.minNodes < 1 || o_.maxNodes < o_.minNodes) {
    throw ConfigError(fmt::format("--nnodes {}:{}: MIN must be at least 1 and at most MAX",
                                  o_.minNodes, o_.maxNodes));
  }
}

Round Rendezvous::join() {
  // When MIN members were first seen in this round (kNotYet: they are not).
  constexpr Clock::time_point kNotYet = Clock::time_point::max();
  Clock::time_point minSince = kNotYet;
  const auto start = Clock::now();
  int64_t lastRound = -1;
  size_t lastCount = 0;
  for (;;) {
    if (o_.interrupted && o_.interrupted()) {
      Round r;
      r.status = Round::Status::interrupted;
      return r;
    }
    const std::optional<Versioned> v = kv_.get(stateKey_);
    if (!v) {
      State s;
      s.jobHash = o_.jobHash;
      s.members = {o_.nodeId};
      s.known = {o_.nodeId};
      s.addrs[o_.nodeId] = o_.address;
      kv_.compareAndSet(stateKey_, 0, dump(s));
      continue;
    }
    State s = parse(v->value, stateKey_);
    if (s.jobHash != o_.jobHash) {
      throw ConfigError(fmt::format(
          "job id '{}' is in use by a job with another job file (its hash {}, this node's {}): "
          "every node must run the same job file; a new job needs a new id",
          o_.jobId, s.jobHash.substr(0, 12), o_.jobHash.substr(0, 12)));
    }
    Round r;
    r.round = s.round;
    if (s.status == "closed") {
      r.status = Round::Status::closed;
      r.exitCode = s.exitCode;
      return r;
    }
    const bool member = has(s.members, o_.nodeId);
    const auto count = static_cast<int>(s.members.size());
    if (s.round != lastRound || s.members.size() != lastCount) {
      log::info("rendezvous round {} ({}): {} of {}..{} nodes [{}]{}", s.round, s.status, count,
                o_.minNodes, o_.maxNodes, fmt::join(s.members, ", "),
                s.waiting.empty() ? "" : fmt::format("; waiting [{}]", fmt::join(s.waiting, ", ")));
      lastRound = s.round;
      lastCount = s.members.size();
    }
    if (s.status == "frozen") {
      if (member) {
        std::sort(s.members.begin(), s.members.end());
        r.members = s.members;
        r.addrs = s.addrs;
        r.nodeRank = static_cast<int>(std::find(s.members.begin(), s.members.end(), o_.nodeId) -
                                      s.members.begin());
        return r;
      }
      // A frozen round whose members are gone will never re-form by itself.
      std::vector<std::string> dead;
      for (const auto& m : s.members) {
        if (!kv_.alive(aliveKey(o_.prefix, m))) dead.push_back(m);
      }
      if (!dead.empty()) {
        if (o_.lost) o_.lost(dead, s.round);
        State next;
        next.round = s.round + 1;
        next.jobHash = s.jobHash;
        next.known = s.known;
        if (kv_.compareAndSet(stateKey_, v->version, dump(next))) {
          log::info("rendezvous: round {} lost [{}]; opened round {}", s.round, fmt::join(dead, ", "),
                    next.round);
        }
        continue;
      }
      if (!has(s.waiting, o_.nodeId)) {
        s.waiting.push_back(o_.nodeId);
        if (!has(s.known, o_.nodeId)) s.known.push_back(o_.nodeId);
        if (kv_.compareAndSet(stateKey_, v->version, dump(s))) {
          log::info("rendezvous: round {} is running; waiting to be admitted at its next step "
                    "boundary", s.round);
        }
        continue;
      }
    } else {  // open
      // Members that died before the round froze are dropped.
      std::vector<std::string> dead;
      for (const auto& m : s.members) {
        if (m != o_.nodeId && !kv_.alive(aliveKey(o_.prefix, m))) dead.push_back(m);
      }
      if (!dead.empty()) {
        // They never started ranks in this round; ranks of an earlier one
        // may still run.
        if (o_.lost && s.round > 0) o_.lost(dead, s.round - 1);
        for (const auto& m : dead) {
          drop(s.members, m);
          s.addrs.erase(m);
        }
        kv_.compareAndSet(stateKey_, v->version, dump(s));
        continue;
      }
      if (!member && count < o_.maxNodes) {
        s.members.push_back(o_.nodeId);
        s.addrs[o_.nodeId] = o_.address;
        drop(s.waiting, o_.nodeId);
        if (!has(s.known, o_.nodeId)) s.known.push_back(o_.nodeId);
        kv_.compareAndSet(stateKey_, v->version, dump(s));
        continue;
      }
      if (member) {
        if (count < o_.minNodes) {
          minSince = kNotYet;
        } else if (minSince == kNotYet) {
          minSince = Clock::now();
        }
        const bool lastCallOver = minSince != kNotYet && Clock::now() - minSince >= o_.lastCall;
        // A re-form need not wait for the last call once every node known
        // to the job that is still alive is in: nobody else is coming but
        // a newcomer, which the next re-form admits.
        bool everyoneIn = s.round > 0 && count >= o_.minNodes;
        for (const auto& n : s.known) {
          if (!everyoneIn) break;
          everyoneIn = has(s.members, n) || !kv_.alive(aliveKey(o_.prefix, n));
        }
        if (count >= o_.maxNodes || lastCallOver || everyoneIn) {
          s.status = "frozen";
          if (kv_.compareAndSet(stateKey_, v->version, dump(s))) {
            log::info("rendezvous: froze round {} with {} nodes", s.round, count);
          }
          continue;
        }
      }
      if (count < o_.minNodes && o_.belowMinFor.count() > 0 &&
          Clock::now() - start >= o_.belowMinFor) {
        r.status = Round::Status::belowMin;
        r.members = s.members;
        return r;
      }
    }
    kv_.waitChange(stateKey_, v->version, o_.poll);
  }
}

Change Rendezvous::check(const Round& r) {
  Change c;
  const std::optional<Versioned> v = kv_.get(stateKey_);
  if (!v) {
    c.kind = Change::Kind::reformed;
    c.detail = "the rendezvous record is gone";
    return c;
  }
  const State s = parse(v->value, stateKey_);
  if (s.status == "closed") {
    c.kind = Change::Kind::closed;
    c.detail = std::to_string(s.exitCode);
    return c;
  }
  if (s.round != r.round) {
    c.kind = Change::Kind::reformed;
    c.detail = fmt::format("round {} opened", s.round);
    return c;
  }
  std::vector<std::string> lost;
  for (const auto& m : r.members) {
    if (!kv_.alive(aliveKey(o_.prefix, m))) lost.push_back(m);
  }
  if (!lost.empty()) {
    if (o_.lost) o_.lost(lost, r.round);
    c.kind = Change::Kind::lost;
    c.detail = fmt::format("{}", fmt::join(lost, ", "));
    c.nodes = std::move(lost);
    return c;
  }
  std::vector<std::string> waiting;
  for (const auto& w : s.waiting) {
    if (kv_.alive(aliveKey(o_.prefix, w))) waiting.push_back(w);
  }
  if (!waiting.empty() && static_cast<int>(r.members.size()) < o_.maxNodes) {
    c.kind = Change::Kind::waiting;
    c.detail = fmt::format("{}", fmt::join(waiting, ", "));
  }
  return c;
}

void Rendezvous::openNext(const Round& r, const std::string& why) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::optional<Versioned> v = kv_.get(stateKey_);
    if (!v) return;
    const State s = parse(v->value, stateKey_);
    if (s.round != r.round || s.status == "closed") return;  // done by another member
    State next;
    next.round = s.round + 1;
    next.jobHash = s.jobHash;
    next.waiting = s.waiting;
    next.known = s.known;
    if (kv_.compareAndSet(stateKey_, v->version, dump(next))) {
      log::info("rendezvous: opened round {} ({})", next.round, why);
      return;
    }
  }
  throw CommError("rendezvous: could not open the next round: the record keeps changing");
}

void Rendezvous::close(int exitCode) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::optional<Versioned> v = kv_.get(stateKey_);
    State s = v ? parse(v->value, stateKey_) : State{};
    if (v && s.status == "closed") return;
    s.status = "closed";
    s.exitCode = exitCode;
    s.jobHash = v ? s.jobHash : o_.jobHash;
    if (kv_.compareAndSet(stateKey_, v ? v->version : 0, dump(s))) return;
  }
  throw CommError("rendezvous: could not close the job: the record keeps changing");
}

void Rendezvous::publishStore(int64_t round, const std::string& hostPort) {
  kv_.put(fmt::format("{}/round/{}/store", o_.prefix, round), hostPort);
}

std::optional<std::string> Rendezvous::waitStore(const Round& r, std::chrono::milliseconds timeout) {
  const std::string key = fmt::format("{}/round/{}/store", o_.prefix, r.round);
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (auto v = kv_.get(key)) return v->value;
    if (Clock::now() >= deadline) return std::nullopt;
    const Change::Kind k = check(r).kind;
    if (k != Change::Kind::none && k != Change::Kind::waiting) return std::nullopt;
    kv_.waitChange(key, 0, o_.poll);
  }
}

}  // namespace cohort::elastic
