#pragma once

// The ranks of a job as a grid of named process groups, built once where
// the rank starts (train::runWorker) and handed to everything that
// communicates:
//
//   job rank = (replica x stages + stage) x tensors + tensor rank
//
//   tensor    the ranks that split each layer of one stage of one replica
//             (rank in it = tensor rank). The innermost coordinate: they
//             are consecutive job ranks, which the launcher places on one
//             machine, as their exchanges come every layer.
//   pipeline  the stages of one replica, in order (distribution.pipeline.
//             stages; rank in it = stage), of one tensor rank. Neighbouring
//             stages are neighbouring job ranks without a tensor split.
//   data      the ranks that hold the same slice of the same stage, one per
//             replica (rank in it = replica): gradients are exchanged and
//             ZeRO shards among them, and the sampler splits the data over
//             them.
//
// world = replicas x stages x tensors. A dimension of size 1 makes no group
// of its own: without a pipeline and a tensor split the data group is the
// job's own group, and data parallelism runs exactly as it always has.

#include <string>
#include <vector>

#include "cohort/comm/comm.h"

namespace cohort::parallel {

struct MeshShape {
  int stages = 1;   // pipeline stages per replica (distribution.pipeline.stages)
  int tensors = 1;  // ranks splitting each layer of a stage
};

struct Mesh {
  comm::Comm world;     // every rank of the job
  comm::Comm data;      // this stage's (and slice's) ranks, one per replica
  comm::Comm pipeline;  // this replica's stages (pg null with one stage)
  comm::Comm tensor;    // this stage's slices (pg null with one tensor rank)
  int stages = 1;
  int stage = 0;
  int replicas = 1;
  int replica = 0;
  int tensors = 1;
  int tensorRank = 0;

  // The job rank that holds this rank's slice of `stage` in `replica`.
  int jobRank(int replica, int stage) const { return jobRank(replica, stage, tensorRank); }
  int jobRank(int replica, int stage, int tensorRank) const {
    return (replica * stages + stage) * tensors + tensorRank;
  }
  bool firstStage() const { return stage == 0; }
  bool lastStage() const { return stage == stages - 1; }
  bool pipelined() const { return stages > 1; }
  bool tensorSplit() const { return tensors > 1; }
  // "stage 1/2 of replica 0/2" ("slice 1/2 of stage 0/1 of replica 0/2"
  // with a tensor split), for logs and messages.
  std::string describe() const;
};

// Builds the mesh over `world`: collective, every rank calls it with the same
// shape. Every rank forms its groups in one order (tensor, pipeline, data),
// so no group waits on a rank still forming another. Throws ConfigError
// naming distribution.pipeline.stages when stages x tensors does not divide
// the world size, CommError/TimeoutError when a group cannot be formed.
Mesh buildMesh(const comm::Comm& world, const MeshShape& shape);

// The mesh of a job without a pipeline: every group is `world` itself.
Mesh flatMesh(const comm::Comm& world);

}  // namespace cohort::parallel
