#pragma once

// What rank 0 writes of a model held in parts (ZeRO stage 3, docs/zero.md),
// one unit at a time: model/final.pt (merged with model.lora's adapters on
// request) and model/base.pt; and the digest of a LoRA job's frozen base,
// taken as its units are gathered. No process holds the whole model for
// any of them.

#include <functional>
#include <string>

#include "cohort/config/choices.h"
#include "cohort/models/model.h"
#include "cohort/parallel/ddp.h"

namespace cohort::security {
struct Key;
}

namespace cohort::train::detail {

// Which published tensors (models::publishedStateDict names) are written,
// and the value written for one (given the model's tensor, gathered).
struct UnitWrite {
  std::function<bool(const std::string&)> keep;
  std::function<at::Tensor(const std::string&, const at::Tensor&)> value;
  // Whether each unit's trainable bucket is gathered with it: false when
  // neither `keep` nor `value` reads a trainable parameter (model/base.pt).
  bool trainable = true;
};

// Writes `path` (in `format`) on `rank` 0 in the published state dict's order: each
// unit's trainable and frozen buckets gathered on rank 0 together, written
// and released before the next (the other ranks send their parts), then
// the rest (buffers, tied names). Collective. Returns rank 0's peak
// resident MB (0 elsewhere).
double writeByUnit(parallel::DistributedDataParallel& engine, const models::Model& model, int rank,
                   const std::string& path, WeightsFormat format, const security::Key* key,
                   const UnitWrite& what);

// models::frozenDigest of a model whose frozen parameters the engine holds
// in parts (DdpOptions::shardFrozen): every rank gathers each frozen unit in
// turn (those outside the units for the whole pass, as forward does) and
// hashes the parameters in the model's order, the same bytes as
// frozenDigest. Collective.
std::string frozenDigestByUnit(parallel::DistributedDataParallel& engine, const models::Model& model);

}  // namespace cohort::train::detail
