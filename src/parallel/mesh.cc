#include "cohort/parallel/mesh.h"

#include <fmt/format.h>

#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace cohort::parallel {

std::string Mesh::describe() const {
  return fmt::format("stage {}/{} of replica {}/{}", stage, stages, replica, replicas);
}

Mesh flatMesh(const comm::Comm& world) {
  Mesh m;
  m.world = world;
  m.data = world;
  m.pipeline = world;
  m.pipeline.pg.reset();
  m.pipeline.rank = 0;
  m.pipeline.worldSize = 1;
  m.pipeline.jobRanks = {world.rank};
  m.replicas = world.worldSize;
  m.replica = world.rank;
  return m;
}

Mesh buildMesh(const comm::Comm& world, const MeshShape& shape) {
  if (shape.stages <= 1) return flatMesh(world);
  const int p = shape.stages;
  if (world.worldSize % p != 0) {
    throw ConfigError(fmt::format(
        "distribution.pipeline.stages: {} stages do not divide the {} ranks of the job (each data "
        "replica holds one rank per stage: the ranks must be a multiple of {})",
        p, world.worldSize, p));
  }
  Mesh m;
  m.world = world;
  m.stages = p;
  m.stage = world.rank % p;
  m.replicas = world.worldSize / p;
  m.replica = world.rank / p;
  // Every rank forms its groups in the same order: the pipeline group, then
  // the data group (a group's members all call comm::subgroup for it).
  std::vector<int> pipe, data;
  for (int s = 0; s < p; ++s) pipe.push_back(m.jobRank(m.replica, s));
  for (int r = 0; r < m.replicas; ++r) data.push_back(m.jobRank(r, m.stage));
  m.pipeline = comm::subgroup(world, fmt::format("pipeline-{}", m.replica), pipe);
  m.data = comm::subgroup(world, fmt::format("data-{}", m.stage), data);
  log::info("mesh: {} data replicas x {} pipeline stages; this rank is {}", m.replicas, p,
            m.describe());
  return m;
}

}  // namespace cohort::parallel
