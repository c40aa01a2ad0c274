#pragma once

// The ranks of a job as a grid of named process groups, built once where
// the rank starts (train::runWorker) and handed to everything that
// communicates:
//
//   job rank = replica x stages + stage
//
//   pipeline  the stages of one replica, in order (distribution.pipeline.
//             stages; rank in it = stage). Neighbouring stages are
//             neighbouring job ranks, so they share a machine whenever the
//             launcher places consecutive ranks together.
//   data      the ranks that hold the same stage, one per replica (rank in
//             it = replica): gradients are exchanged and ZeRO shards among
//             them, and the sampler splits the data over them.
//
// Without a pipeline (one stage) the data group is the job's own group and
// no other group is made: data parallelism runs exactly as it always has.
// A tensor dimension would be one more coordinate between stage and
// replica.

#include <string>
#include <vector>

#include "cohort/comm/comm.h"

namespace cohort::parallel {

struct MeshShape {
  int stages = 1;  // pipeline stages per replica (distribution.pipeline.stages)
};

struct Mesh {
  comm::Comm world;     // every rank of the job
  comm::Comm data;      // this stage's ranks, one per replica
  comm::Comm pipeline;  // this replica's stages (pg null with one stage)
  int stages = 1;
  int stage = 0;
  int replicas = 1;
  int replica = 0;

  int jobRank(int replica, int stage) const { return replica * stages + stage; }
  bool firstStage() const { return stage == 0; }
  bool lastStage() const { return stage == stages - 1; }
  bool pipelined() const { return stages > 1; }
  // "stage 1/2 of replica 0/2", for logs and messages.
  std::string describe() const;
};

// Builds the mesh over `world`: collective, every rank calls it with the same
// shape. Throws ConfigError naming distribution.pipeline.stages when it does
// not divide the world size, CommError/TimeoutError when a group cannot be
// formed.
Mesh buildMesh(const comm::Comm& world, const MeshShape& shape);

// The mesh of a job without a pipeline: every group is `world` itself.
Mesh flatMesh(const comm::Comm& world);

}  // namespace cohort::parallel
