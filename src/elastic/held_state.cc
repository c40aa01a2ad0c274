#include "cohort/elastic/held_state.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "cohort/ckpt/held_state.h"
#include "cohort/ckpt/manifest.h"
#include "cohort/core/checksum.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"
#include "cohort/core/time.h"
#include "cohort/core/text.h"

namespace cohort::elastic {
namespace {

using nlohmann::json;

// What one node holds of one step.
struct Holding {
  ckpt::Manifest manifest;  // files: the node's
  int leader = 0;           // the node's lowest rank
};


// The round that trained a held step (-1: written before rounds were
// recorded).
int64_t roundOf(const ckpt::Manifest& m) {
  const auto it = m.extra.find("round");
  return it != m.extra.end() && it->is_number_integer() ? it->get<int64_t>() : -1;
}

std::string readWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("cannot read {}", path));
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TakenUp takeUpHeldState(const comm::Comm& comm, const std::string& dir, int64_t diskStep) {
  const auto start = SteadyClock::now();
  const bool leader = comm.localRank == 0;
  // 1. Each node's lowest rank tells what the node holds (its newest steps).
  json mine = json::array();
  if (leader) {
    const std::vector<ckpt::HeldStep> held = ckpt::listHeldState(dir);
    for (size_t i = 0; i < held.size() && i < 3; ++i) mine.push_back(ckpt::toJson(held[i].manifest));
  }
  comm.store->set(fmt::format("held/{}", comm.rank), bytesOf(mine.dump()));
  std::map<int64_t, std::vector<Holding>> bySteps;  // step -> holdings, by rank
  for (int r = 0; r < comm.worldSize; ++r) {
    const auto raw = comm.store->get(fmt::format("held/{}", r));
    const json list = json::parse(std::string(raw.begin(), raw.end()), nullptr, false);
    if (!list.is_array()) throw CommError(fmt::format("held state: rank {} sent an unreadable list", r));
    for (const json& m : list) {
      Holding h{ckpt::manifestFromJson(m, fmt::format("rank {}'s held state", r)), r};
      bySteps[h.manifest.step].push_back(std::move(h));
    }
  }
  // 2. The newest step whose files together make a whole checkpoint. One
  // step held from two rounds is two histories (a round that went back to
  // an older checkpoint trained it again, or a node the others lost kept
  // it): only the newest round's holdings are put together.
  TakenUp out;
  std::optional<std::vector<Holding>> chosen;
  std::map<std::string, std::pair<ckpt::ManifestFile, int>> files;  // name -> file, holder
  for (auto it = bySteps.rbegin(); it != bySteps.rend() && !chosen; ++it) {
    if (it->first < diskStep) break;  // the disk holds a newer one
    int64_t newest = -1;
    for (const Holding& h : it->second) newest = std::max(newest, roundOf(h.manifest));
    std::vector<Holding> same;
    for (const Holding& h : it->second) {
      if (roundOf(h.manifest) == newest) same.push_back(h);
    }
    if (same.size() < it->second.size() && comm.rank == 0) {
      log::warn("held state of step {}: {} of {} node(s) hold it from an older round than round {}; "
                "those are set aside",
                it->first, it->second.size() - same.size(), it->second.size(), newest);
    }
    std::map<std::string, std::pair<ckpt::ManifestFile, int>> all;
    ckpt::Manifest together = same.front().manifest;
    together.files.clear();
    for (const Holding& h : same) {
      for (const auto& f : h.manifest.files) {
        if (all.emplace(f.name, std::make_pair(f, h.leader)).second) together.files.push_back(f);
      }
    }
    if (ckpt::missingFiles(together).empty()) {
      chosen = std::move(same);
      files = std::move(all);
    } else if (comm.rank == 0) {
      log::info("held state of step {} is not whole across the nodes (a node holding part of it "
                "left)", it->first);
    }
  }
  if (!chosen) return out;
  ckpt::Manifest m = chosen->front().manifest;
  out.step = m.step;
  out.path = dir + "/" + ckpt::checkpointDirName(m.step);
  // 3. Every node gets the files it lacks from the lowest rank holding each.
  // A node's ranks are consecutive (the agent places them so): its
  // leader is the lowest.
  // Copies of a shared file (model.bin, say) differ between nodes in their
  // header (the writer's rank): each node lists its own copy.
  const int myLeader = comm.rank - comm.localRank;
  std::map<std::string, ckpt::ManifestFile> here;
  for (const Holding& h : *chosen) {
    if (h.leader != myLeader) continue;
    for (const auto& f : h.manifest.files) here.emplace(f.name, f);
  }
  m.files.clear();
  for (const auto& [name, fh] : files) {
    const auto& [file, holder] = fh;
    m.files.push_back(here.count(name) ? here.at(name) : file);
    // Does any node lack it? Each leader says so in one allreduce.
    at::Tensor need = torch::tensor({leader && here.count(name) == 0 ? 1.0 : 0.0}, torch::kFloat64);
    comm::allreduceSum(comm, need, "held state: who lacks a file");
    if (need.item<double>() == 0) continue;
    at::Tensor size = torch::tensor({static_cast<int64_t>(file.size)}, torch::kInt64);
    at::Tensor data;
    if (comm.rank == holder) {
      const std::string bytes = readWhole(out.path + "/" + name);
      if (bytes.size() != file.size) {
        throw IoError(fmt::format("held state: {}/{} changed size while being sent", out.path, name));
      }
      data = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
      std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
    } else {
      data = torch::empty({static_cast<int64_t>(file.size)}, torch::kUInt8);
    }
    std::vector<at::Tensor> payload{data};
    comm::broadcast(comm, payload, holder, "held state: a file to the nodes that lack it");
    if (leader && here.count(name) == 0) {
      const std::string path = out.path + "/" + name;
      std::error_code ec;
      std::filesystem::create_directories(out.path, ec);
      writeFileAtomic(path, payload[0].data_ptr(), file.size);
      out.bytesReceived += static_cast<int64_t>(file.size);
    }
  }
  // 4. Each node's manifest: the same everywhere, written last.
  if (leader) {
    ckpt::writeManifest(out.path, m);
    const ckpt::Verification v = ckpt::verifyCheckpoint(out.path, /*checksums=*/true);
    if (!v.valid) throw IoError(fmt::format("held state in {} does not verify: {}", out.path, v.problem));
  }
  comm::barrier(comm, "held state written");
  out.seconds = secondsSince(start);
  return out;
}

}  // namespace cohort::elastic
