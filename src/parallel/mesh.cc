#include "cohort/parallel/mesh.h"

#include <fmt/format.h>

#include <algorithm>

#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace cohort::parallel {

std::string Mesh::describe() const {
  const std::string at = fmt::format("stage {}/{} of replica {}/{}", stage, stages, replica, replicas);
  return tensors > 1 ? fmt::format("slice {}/{} of {}", tensorRank, tensors, at) : at;
}

namespace {

// A group of one: this rank alone, without a process group.
comm::Comm alone(const comm::Comm& world) {
  comm::Comm c = world;
  c.pg.reset();
  c.rank = 0;
  c.worldSize = 1;
  c.jobRanks = {world.rank};
  return c;
}

}  // namespace

Mesh flatMesh(const comm::Comm& world) {
  Mesh m;
  m.world = world;
  m.data = world;
  m.pipeline = alone(world);
  m.tensor = alone(world);
  m.replicas = world.worldSize;
  m.replica = world.rank;
  return m;
}

Mesh buildMesh(const comm::Comm& world, const MeshShape& shape) {
  const int p = std::max(1, shape.stages);
  const int t = std::max(1, shape.tensors);
  if (p == 1 && t == 1) return flatMesh(world);
  if (world.worldSize % (p * t) != 0) {
    throw ConfigError(
        t == 1 ? fmt::format("distribution.pipeline.stages: {} stages do not divide the {} ranks of the job (each "
                             "data replica holds one rank per stage: the ranks must be a multiple of {})",
                             p, world.worldSize, p)
               : fmt::format("distribution.pipeline.stages x distribution.tensor: {} x {} ranks do not divide the {} "
                             "ranks of the job (each data replica holds {} ranks: the ranks must be a multiple of it)",
                             p, t, world.worldSize, p * t, p * t));
  }
  Mesh m;
  m.world = world;
  m.stages = p;
  m.tensors = t;
  m.tensorRank = world.rank % t;
  m.stage = (world.rank / t) % p;
  m.replicas = world.worldSize / (p * t);
  m.replica = world.rank / (p * t);
  // Every rank forms its groups in the same order: tensor, pipeline, data
  // (a group's members all call comm::subgroup for it). A group's name
  // holds the coordinates its members share.
  std::vector<int> slices, pipe, data;
  for (int k = 0; k < t; ++k) slices.push_back(m.jobRank(m.replica, m.stage, k));
  for (int s = 0; s < p; ++s) pipe.push_back(m.jobRank(m.replica, s));
  for (int r = 0; r < m.replicas; ++r) data.push_back(m.jobRank(r, m.stage));
  m.tensor = t > 1 ? comm::subgroup(world, fmt::format("tensor-{}-{}", m.replica, m.stage), slices) : alone(world);
  m.pipeline = p > 1 ? comm::subgroup(world, fmt::format("pipeline-{}-{}", m.replica, m.tensorRank), pipe)
                     : alone(world);
  m.data = comm::subgroup(world, fmt::format("data-{}-{}", m.stage, m.tensorRank), data);
  log::info("mesh: {} data replicas x {} pipeline stages{}; this rank is {}", m.replicas, p,
            t > 1 ? fmt::format(" x {} tensor ranks", t) : std::string(), m.describe());
  return m;
}

}  // namespace cohort::parallel
