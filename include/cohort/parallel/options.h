#pragma once

// The data-parallel engine's options and figures (parallel/ddp.h), apart
// from the engine: what the training loop sets (train::detail::ddpOptions)
// and reads (Plan::stats()) without LibTorch's autograd or c10d in its
// headers.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace cohort::parallel {

// ZeRO stage 3: this rank's part of one unit, cut as the engine cuts it
// (cutUnit), and the unit's parameter names in the model's order.
struct UnitPart {
  std::vector<std::string> names;
  at::Tensor part;
};

struct DdpOptions {
  double bucketCapMb = 25;
  // false: a parameter without a gradient in a synchronizing step is an
  // error. true: its gradient counts as zero (its bucket then launches only
  // in finishGradients).
  bool findUnusedParameters = false;
  bool broadcastBuffers = true;
  // true: each bucket is divided by the world size before its allreduce, so
  // .grad ends as the mean over ranks. false: the exchange sums, and the
  // caller scales the loss by 1 / world size instead, which costs nothing
  // (autograd carries the scale) where the division is a pass over every
  // gradient: about 8 ms per 64 MB on a CPU.
  bool divideGradients = true;
  // When gradients are float32 on the CPU, ranks on one machine keep their
  // buckets in a shared memory segment and sum them there (comm/shm.h)
  // instead of over Gloo's loopback TCP. When the ranks span several
  // machines, the exchange is hierarchical: each machine sums in shared
  // memory, the lowest rank of each machine sums the machines' sums over
  // Gloo, and shares the result with its machine. Falls back to Gloo among
  // all ranks, with a log line saying why, when that is not possible.
  bool sharedMemory = true;
  // Stage 0 on one rank has nothing to exchange: no buckets are made, and
  // each gradient stays the tensor autograd produced (checked for NaN and
  // Inf in place), which saves a copy of every gradient each step and the
  // buckets' memory. true keeps the buckets there as on several ranks: for
  // tests of the bucket machinery within one process; a job never sets it.
  bool bucketsOnOneRank = false;
  // The gradients on Gloo's wire (the exchange among all ranks, or among
  // one rank per machine): float32, or rounded to a 16-bit type, summed,
  // and widened back. fp16 is summed by Gloo in fp16; Gloo has no bfloat16
  // collectives, so bf16 is gathered from every rank and summed in float32
  // locally. Only float32 buckets are compressed; shared memory never is.
  enum class Compression { none, fp16, bf16 };
  Compression compression = Compression::none;
  // 0: every rank steps every parameter. 1: every rank steps its part of
  // each bucket, then the parts are gathered. 2: as 1, with the gradients
  // reduce-scattered instead of allreduced (not compressed). 3: as 2, with
  // the parameters held in parts too, gathered unit by unit.
  int zeroStage = 0;
  // Stage 3: the name of each sharding unit's submodule, in forward order
  // (models::Model::shardingUnits()); a parameter belongs to the first unit
  // its name starts with (followed by '.'), or to the whole-model unit.
  std::vector<std::string> units;
  // Parameters (by name) kept out of the buckets: neither exchanged nor
  // sharded, only broadcast with the state (a pipeline's tied tensors,
  // whose gradients the pipeline sums itself).
  std::vector<std::string> exclude;
  // Stage 3: units whose part the caller cut already (a model built unit by
  // unit, parallel/unit_parts.h), by unit name ("" for the parameters
  // outside every unit). Their parameters come without storage (or with
  // values the part supersedes): they are neither read, broadcast nor held
  // whole here.
  std::map<std::string, UnitPart> presharded;
  // Stage 3: the parameters without gradients (model.lora's frozen base)
  // are held in parts too, bucketed by unit beside the trainable ones:
  // gathered with their unit around its forward and its backward and
  // released after, never exchanged, stepped or checkpointed. Those not
  // set here stay whole on every rank. `frozenPresharded`: their units cut
  // already, as `presharded`.
  bool shardFrozen = false;
  std::map<std::string, UnitPart> frozenPresharded;
};

// How gradients travel between ranks.
enum class Exchange {
  none,          // one rank: nothing to exchange
  gloo,          // Gloo among all ranks
  sharedMemory,  // every rank on one machine: shared memory
  hierarchical,  // shared memory within each machine, Gloo between one rank per machine
};
const char* exchangeName(Exchange e);

struct DdpStats {
  int64_t buckets = 0;
  int64_t syncs = 0;                  // finishGradients calls that exchanged gradients
  int64_t launchedDuringBackward = 0; // buckets handed to the exchange from hooks (Gloo's
                                      // allreduce started, or published to the shared-memory sum)
  int64_t launchedAtFinish = 0;       // started by finishGradients (unused parameters)
  // gradientsFinite() calls that read the buckets again (the exchange or
  // the copies into the buckets had not checked every element).
  int64_t finitenessPasses = 0;
  bool sharedMemory = false;          // buckets are exchanged through shared memory
  Exchange exchange = Exchange::none;
  int machines = 1;                   // machines the ranks span (by their machine identity)
  // Seconds the training thread spent in shared-memory sums inside
  // backward (synchronous, so all of it is exposed). The hierarchical
  // exchange's copy of the machines' sum runs in finishGradients instead.
  double sharedMemorySeconds = 0;
  int zeroStage = 0;
  // Elements the optimizer steps on this rank (its state is a multiple of
  // it), and gradient and parameter elements this rank holds.
  int64_t optimizerElements = 0;
  int64_t gradientElements = 0;
  int64_t parameterElements = 0;
  // Stage 3: the largest unit (padded elements), and the most elements of
  // units' gathered parameters, full gradients and reduce-scatter buffers
  // this rank held at once, besides its parts.
  int64_t largestUnitElements = 0;
  int64_t unitPeakElements = 0;
  // Stage 3 with DdpOptions::shardFrozen: the elements of this rank's parts
  // of the frozen parameters (with padding).
  int64_t frozenElements = 0;
};

}  // namespace cohort::parallel
