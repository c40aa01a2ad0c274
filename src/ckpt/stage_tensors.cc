#include "cohort/ckpt/stage_tensors.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <functional>
#include <limits>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/rank_state.h"
#include "ckpt/detail/parts.h"
#include "cohort/core/error.h"
#include "core/detail/json_int.h"

namespace cohort::ckpt {

namespace {

// extra.tensor.cuts: each split tensor's dimension and blocks.
std::map<std::string, std::pair<int64_t, int>> cutsOf(const Manifest& m) {
  std::map<std::string, std::pair<int64_t, int>> cuts;
  const nlohmann::json tensor = m.extra.value("tensor", nlohmann::json());
  if (!tensor.is_object()) return cuts;
  const nlohmann::json byName = tensor.value("cuts", nlohmann::json::object());
  for (const auto& [name, cut] : byName.items()) {
    cuts[name] = {jsonInt<int64_t>(cut.value("dim", nlohmann::json(0))), jsonInt<int>(cut.value("blocks", nlohmann::json(1)))};
  }
  return cuts;
}

// The region of a whole tensor of `whole` elements along `dim` that slice
// `t` of `slices` holds, cut in `blocks` blocks: "rows [0, 5) and [10, 15)".
std::string sliceRegion(int64_t whole, int64_t dim, int blocks, int slices, int t) {
  const int64_t block = whole / blocks, width = block / slices;
  std::vector<std::string> ranges;
  for (int b = 0; b < blocks; ++b) {
    const int64_t from = b * block + t * width;
    ranges.push_back(fmt::format("[{}, {})", from, from + width));
  }
  const char* what = dim == 0 ? "rows" : dim == 1 ? "columns" : "elements";
  return fmt::format("{} {} of its {} along dimension {}", what, fmt::join(ranges, " and "), whole, dim);
}

// Throws DataError naming `name`, its region in slice t, and `why`, when
// `piece` (slice t's part of a tensor of shape `whole`) is missing or not
// of the slice's shape.
void checkSlice(const std::string& dir, const std::string& what, const at::Tensor& piece,
                const std::vector<int64_t>& whole, int64_t dim, int blocks, int slices, int t, const std::string& why) {
  std::vector<int64_t> shape = whole;
  if (dim >= 0 && dim < static_cast<int64_t>(shape.size())) shape[static_cast<size_t>(dim)] /= slices;
  if (piece.defined() && piece.sizes().vec() == shape) return;
  throw DataError(fmt::format("{}: the checkpoint lacks a region of {}: tensor slice {} of {} held {} ({}){}", dir, what,
                              t, slices, sliceRegion(whole[static_cast<size_t>(dim)], dim, blocks, slices, t),
                              piece.defined() ? fmt::format("a piece of shape [{}], not [{}]",
                                                            fmt::join(piece.sizes(), ", "), fmt::join(shape, ", "))
                                              : std::string("missing"),
                              why.empty() ? "" : ": " + why));
}

// The region of a tensor of shape `whole` that rank `index` of `parts`
// holds when it is cut along `dim` in `blocks` blocks, each cut in `parts`,
// from a checkpoint that holds it in `held` slices of the same cut (1:
// whole): `piece(j, lo, hi)` reads indices [lo, hi) along `dim` of slice
// j's tensor (block b's [j ws, (j+1) ws) are at [b ws, (b+1) ws) there).
at::Tensor regionOf(const std::vector<int64_t>& whole, int64_t dim, int blocks, int parts, int index, int held,
                    const std::function<at::Tensor(int, int64_t, int64_t)>& piece) {
  const int64_t block = whole[static_cast<size_t>(dim)] / blocks, width = block / parts, ws = block / held;
  std::vector<at::Tensor> pieces;
  for (int b = 0; b < blocks; ++b) {
    const int64_t from = index * width, to = from + width;  // within the block
    for (int64_t j = from / ws; j < held && j * ws < to; ++j) {
      pieces.push_back(piece(static_cast<int>(j), std::max(from, j * ws) - j * ws + b * ws,
                             std::min(to, (j + 1) * ws) - j * ws + b * ws));
    }
  }
  return at::cat(pieces, dim).contiguous();
}

// Whether `whole` can be cut so along `dim` (else it is read whole and cut).
bool regionFits(const std::vector<int64_t>& whole, int64_t dim, int blocks, int parts, int held) {
  if (dim < 0 || dim >= static_cast<int64_t>(whole.size())) return false;
  const int64_t size = whole[static_cast<size_t>(dim)];
  return size % (int64_t{blocks} * parts) == 0 && size % (int64_t{blocks} * held) == 0;
}

// Rank `index` of `parts`'s region of `t`, cut along `dim` in `blocks`.
at::Tensor cutOf(const at::Tensor& t, int64_t dim, int blocks, int parts, int index) {
  const int64_t block = t.size(dim) / blocks, width = block / parts;
  std::vector<at::Tensor> pieces;
  for (int b = 0; b < blocks; ++b) pieces.push_back(t.narrow(dim, b * block + index * width, width));
  return at::cat(pieces, dim).contiguous();
}

using detail::kElementKinds;
using detail::memoryOrder;

std::vector<int64_t> ints(const nlohmann::json& j) { return jsonInts<int64_t>(j); }

// Bucket k's parameters: (name, elements).
std::vector<std::pair<std::string, int64_t>> members(const nlohmann::json& z, size_t k) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& name : z["buckets"][k]) {
    int64_t n = 1;
    for (int64_t s : ints(z["params"].at(name.get<std::string>())["shape"])) n *= s;
    out.emplace_back(name.get<std::string>(), n);
  }
  return out;
}

}  // namespace

// Files of parts, one per rank, and the bucket last put together from them.
struct StageTensors::Bucketed {
  std::function<std::string(int)> file;  // rank r's file name
  bool optimizer = false;
  size_t cached = std::numeric_limits<size_t>::max();
  std::map<std::string, at::Tensor> cache;
};

StageTensors::StageTensors(const std::string& dir, const Manifest& m, int stage, int slice)
    : dir_(dir), stage_(stage), slice_(slice) {
  slices_ = checkpointSlices(m);
  if (slice < 0 || slice >= slices_) {
    throw DataError(fmt::format("{}/manifest.json: the checkpoint has {} tensor slice(s), not slice {}", dir, slices_,
                                slice));
  }
  stages_ = checkpointStages(m);
  if (stages_ == 1) {
    if (m.extra.contains("zero")) zero_ = m.extra["zero"];
  } else {
    const nlohmann::json& layouts = m.extra["pipeline"].value("stage_zero", nlohmann::json());
    if (layouts.is_array()) {
      if (stage >= static_cast<int>(layouts.size())) {
        throw DataError(fmt::format("{}/manifest.json: extra.pipeline.stage_zero has no stage {}", dir, stage));
      }
      zero_ = layouts[static_cast<size_t>(stage)];
    }
  }
  if (!zero_.is_null() && (!zero_.contains("world_size") || !zero_.contains("buckets") || !zero_.contains("params"))) {
    throw DataError(fmt::format("{}/manifest.json: extra.zero lacks world_size, buckets or params "
                                "(written by an older cohort?)", dir));
  }
  if (!zero_.is_null()) {
    for (size_t k = 0; k < zero_["buckets"].size(); ++k) {
      for (const auto& [name, n] : members(zero_, k)) bucketOf_[name] = k;
    }
    optimizer_ = std::make_unique<Bucketed>();
    optimizer_->file = [this](int r) { return file(optimizerFile(true, r)); };
    optimizer_->optimizer = true;
  }
  const TensorFileReader& rest = reader(file("model.bin"));
  if (zero_.is_null() || !zero_.value("model_parts", false)) {
    for (const TensorInfo& i : rest.tensors()) entries_.emplace_back(i.name, withoutData(i.shape, dtypeFromName(i.dtype)));
    return;  // the parameters are in model.bin
  }
  model_ = std::make_unique<Bucketed>();
  model_->file = [this](int r) { return file(modelPartFile(r)); };
  // The parts' files are opened when a bucket is first asked for (a
  // sealed one is decrypted whole then): a same-cut resume reads only its
  // own (ownModelParts) and opens none of the others here. The entries of
  // parameters in parts are float32, as every trained parameter is; what
  // load() returns has the part's own type.
  for (const auto& entry : zero_.value("model_order", nlohmann::json::array())) {
    const std::string name = entry.get<std::string>();
    if (rest.has(name)) {
      const TensorInfo* info = nullptr;
      for (const TensorInfo& i : rest.tensors()) {
        if (i.name == name) info = &i;
      }
      entries_.emplace_back(name, withoutData(info->shape, dtypeFromName(info->dtype)));
    } else if (auto b = bucketOf_.find(name); b != bucketOf_.end()) {
      entries_.emplace_back(name, withoutData(ints(zero_["params"].at(name)["shape"]), at::kFloat));
    } else {
      throw DataError(fmt::format("{}: '{}' is in neither {} nor the parameter parts "
                                  "(extra.zero.model_order)", dir, name, file("model.bin")));
    }
  }
  if (entries_.size() != rest.tensors().size() + bucketOf_.size()) {
    throw DataError(fmt::format("{}: {} and the parameter parts hold {} tensors, extra.zero.model_order "
                                "names {}", dir, file("model.bin"), rest.tensors().size() + bucketOf_.size(),
                                entries_.size()));
  }
}

StageTensors::~StageTensors() = default;

const StateDict& StageTensors::entries() const { return entries_; }
const nlohmann::json& StageTensors::zero() const { return zero_; }
std::string StageTensors::file(const std::string& name) const {
  return sliceFile(slice_, slices_, stageFile(stage_, stages_, name));
}

int64_t StageTensors::bucketElements(size_t k) const {
  int64_t total = 0;
  for (const auto& m : members(zero_, k)) total += m.second;
  return total;
}

const TensorFileReader& StageTensors::reader(const std::string& name) {
  auto& r = readers_[name];
  if (!r) r = std::make_unique<TensorFileReader>(dir_ + "/" + name);
  return *r;
}

void StageTensors::lacksPart(const std::string& path, const std::string& key, const std::string& suffix,
                             int64_t elements, int r, int64_t chunk, size_t k) const {
  // The tensors whose elements rank r's part held.
  std::vector<std::string> held;
  int64_t offset = 0;
  for (const auto& [name, n] : members(zero_, k)) {
    const int64_t from = std::max(offset, r * chunk), to = std::min(offset + n, (r + 1) * chunk);
    if (from < to) held.push_back(fmt::format("'{}{}' elements [{}, {})", name, suffix, from - offset, to - offset));
    offset += n;
  }
  if (held.size() > 4) {
    const size_t more = held.size() - 3;
    held.resize(3);
    held.push_back(fmt::format("and {} more", more));
  }
  throw DataError(fmt::format("{}: the checkpoint lacks a region: '{}' is {}: rank {}'s elements [{}, {}) of "
                              "bucket {} (extra.zero), which held {}",
                              path, key,
                              elements >= 0 ? fmt::format("of {} elements, not {}", elements, chunk)
                                            : std::string("missing"),
                              r, r * chunk, (r + 1) * chunk, k,
                              held.empty() ? std::string("padding only") : fmt::format("{}", fmt::join(held, ", "))));
}

at::Tensor StageTensors::partRange(Bucketed& b, const std::string& name, const std::string& suffix, int64_t dim,
                                   int64_t begin, int64_t end) {
  const size_t k = bucketOf_.at(name);
  const nlohmann::json& info = zero_["params"].at(name);
  const std::vector<int64_t> shape = ints(info["shape"]);
  // Row-major parameters only (the parts hold elements in memory order).
  std::vector<int64_t> contiguous(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) contiguous[d - 1] = contiguous[d] * shape[d];
  int64_t offset = 0;  // of the parameter in its bucket
  for (const auto& [member, count] : members(zero_, k)) {
    if (member == name) break;
    offset += count;
  }
  if (ints(info["strides"]) != contiguous || shape.empty()) {
    unpack(b, k);
    return b.cache.at(name + suffix).narrow(dim, begin, end - begin).contiguous();
  }
  const int world = jsonInt<int>(zero_["world_size"]);
  const int64_t chunk = (bucketElements(k) + world - 1) / world;
  const std::string key = fmt::format("part{}{}", k, suffix);
  // Elements [from, to) of the parameter, from the ranks' parts that hold them.
  auto elements = [&](int64_t from, int64_t to, std::vector<at::Tensor>& pieces) {
    for (int r = static_cast<int>((offset + from) / chunk); r < world && r * chunk < offset + to; ++r) {
      const TensorFileReader& f = reader(b.file(r));
      int64_t held = -1;
      for (const TensorInfo& i : f.tensors()) {
        if (i.name == key) held = i.shape.empty() ? 1 : i.shape[0];
      }
      if (held != chunk) lacksPart(f.path(), key, suffix, held, r, chunk, k);
      const int64_t lo = std::max(offset + from, r * chunk) - r * chunk;
      const int64_t hi = std::min(offset + to, (r + 1) * chunk) - r * chunk;
      pieces.push_back(f.readRange(key, 0, lo, hi));
    }
  };
  // Row-major: along `dim`, each leading index's run of [begin, end).
  int64_t outer = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[static_cast<size_t>(d)];
  const int64_t inner = contiguous[static_cast<size_t>(dim)], size = shape[static_cast<size_t>(dim)];
  std::vector<at::Tensor> pieces;
  for (int64_t o = 0; o < outer; ++o) elements((o * size + begin) * inner, (o * size + end) * inner, pieces);
  std::vector<int64_t> got = shape;
  got[static_cast<size_t>(dim)] = end - begin;
  return torch::cat(pieces).view(got);
}

std::vector<int64_t> StageTensors::optimizerShape(const std::string& name) {
  if (zero_.is_null()) {
    for (const TensorInfo& i : optimizerReader().tensors()) {
      if (i.name == name) return i.shape;
    }
    return {};
  }
  const size_t dot = name.rfind('.');
  auto b = dot == std::string::npos ? bucketOf_.end() : bucketOf_.find(name.substr(0, dot));
  const TensorFileReader& first = reader(optimizer_->file(0));
  if (b == bucketOf_.end()) {  // kept whole beside the parts
    for (const TensorInfo& i : first.tensors()) {
      if (i.name == name && name.rfind("part", 0) != 0) return i.shape;
    }
    return {};
  }
  if (!first.has(fmt::format("part{}{}", b->second, name.substr(dot)))) return {};
  return ints(zero_["params"].at(b->first)["shape"]);
}

at::Tensor StageTensors::optimizerStateRange(const std::string& name, int64_t dim, int64_t begin, int64_t end) {
  if (zero_.is_null()) return optimizerReader().readRange(name, dim, begin, end);
  const size_t dot = name.rfind('.');
  auto b = dot == std::string::npos ? bucketOf_.end() : bucketOf_.find(name.substr(0, dot));
  if (b == bucketOf_.end()) return reader(optimizer_->file(0)).readRange(name, dim, begin, end);
  return partRange(*optimizer_, b->first, name.substr(dot), dim, begin, end);
}

void StageTensors::unpack(Bucketed& b, size_t k) {
  if (b.cached == k) return;
  b.cache.clear();
  b.cached = std::numeric_limits<size_t>::max();
  const int world = jsonInt<int>(zero_["world_size"]);
  const int64_t chunk = (bucketElements(k) + world - 1) / world;
  const std::string part = fmt::format("part{}", k);
  std::vector<std::string> suffixes;
  if (!b.optimizer) suffixes.push_back("");
  for (const char* kind : kElementKinds) {
    if (b.optimizer && reader(b.file(0)).has(part + "." + kind)) suffixes.push_back(std::string(".") + kind);
  }
  for (const std::string& suffix : suffixes) {
    const std::string key = part + suffix;
    std::vector<at::Tensor> pieces;
    for (int r = 0; r < world; ++r) {
      const TensorFileReader& f = reader(b.file(r));
      at::Tensor piece = f.has(key) ? f.read(key) : at::Tensor();
      if (!piece.defined() || piece.numel() != chunk) {
        lacksPart(f.path(), key, suffix, piece.defined() ? piece.numel() : -1, r, chunk, k);
      }
      pieces.push_back(piece.flatten());
    }
    const at::Tensor flat = torch::cat(pieces);
    pieces.clear();
    int64_t offset = 0;
    for (const auto& [name, n] : members(zero_, k)) {
      const auto& info = zero_["params"].at(name);
      at::Tensor t = at::empty_strided(ints(info["shape"]), ints(info["strides"]), flat.options());
      memoryOrder(t).copy_(flat.narrow(0, offset, n));
      b.cache[name + suffix] = t;
      offset += n;
    }
  }
  if (b.optimizer && reader(b.file(0)).has(part + ".step")) {
    const at::Tensor step = reader(b.file(0)).read(part + ".step");
    for (const auto& [name, n] : members(zero_, k)) b.cache[name + ".step"] = step.clone();
  }
  b.cached = k;
}

at::Tensor StageTensors::load(const std::string& name) {
  auto b = model_ ? bucketOf_.find(name) : bucketOf_.end();
  if (b == bucketOf_.end()) return reader(file("model.bin")).read(name);
  // Only this parameter's elements, from the parts that hold them (a
  // parameter not laid out row-major: its bucket put together, below).
  const std::vector<int64_t> shape = ints(zero_["params"].at(name)["shape"]);
  if (!shape.empty() && model_->cached != b->second) return partRange(*model_, name, "", 0, 0, shape[0]);
  unpack(*model_, b->second);
  auto it = model_->cache.find(name);
  if (it == model_->cache.end()) {  // dropped: put the bucket together again
    model_->cached = std::numeric_limits<size_t>::max();
    unpack(*model_, b->second);
    it = model_->cache.find(name);
  }
  return it->second;
}

void StageTensors::drop(const std::string& name) {
  if (model_) model_->cache.erase(name);
}

at::Tensor StageTensors::loadRange(const std::string& name, int64_t dim, int64_t begin, int64_t end) {
  if (model_ && bucketOf_.count(name) != 0) return partRange(*model_, name, "", dim, begin, end);
  return reader(file("model.bin")).readRange(name, dim, begin, end);
}

uint64_t StageTensors::bytesRead() const {
  uint64_t n = 0;
  for (const auto& [name, r] : readers_) n += r->bytesRead();
  return n;
}

std::vector<std::string> StageTensors::optimizerNames() {
  std::vector<std::string> out;
  if (zero_.is_null()) {
    for (const TensorInfo& i : reader(file(optimizerFile(false, 0))).tensors()) out.push_back(i.name);
    return out;
  }
  const TensorFileReader& first = reader(optimizer_->file(0));
  for (size_t k = 0; k < zero_["buckets"].size(); ++k) {
    const std::string part = fmt::format("part{}", k);
    for (const char* kind : kElementKinds) {
      if (!first.has(part + "." + kind)) continue;
      for (const auto& [name, n] : members(zero_, k)) out.push_back(name + "." + kind);
    }
    if (first.has(part + ".step")) {
      for (const auto& [name, n] : members(zero_, k)) out.push_back(name + ".step");
    }
  }
  // Kept whole beside the parts (a pipeline's tied tensors, which every
  // rank steps whole): under their own names.
  for (const TensorInfo& i : first.tensors()) {
    if (i.name.rfind("part", 0) != 0) out.push_back(i.name);
  }
  return out;
}

const TensorFileReader& StageTensors::optimizerReader() { return reader(file(optimizerFile(false, 0))); }

at::Tensor StageTensors::optimizerState(const std::string& name) {
  if (zero_.is_null()) {
    const TensorFileReader& f = reader(file(optimizerFile(false, 0)));
    return f.has(name) ? f.read(name) : at::Tensor();
  }
  const size_t dot = name.rfind('.');
  auto b = dot == std::string::npos ? bucketOf_.end() : bucketOf_.find(name.substr(0, dot));
  if (b == bucketOf_.end()) {
    // Kept whole beside the parts: the same in every rank's file.
    const TensorFileReader& first = reader(optimizer_->file(0));
    return name.rfind("part", 0) != 0 && first.has(name) ? first.read(name) : at::Tensor();
  }
  unpack(*optimizer_, b->second);
  auto it = optimizer_->cache.find(name);
  return it == optimizer_->cache.end() ? at::Tensor() : it->second;
}

CheckpointTensors::CheckpointTensors(const std::string& dir, const Manifest& m) : dir_(dir) {
  slices_ = checkpointSlices(m);
  cuts_ = cutsOf(m);
  for (int s = 0; s == 0 || s < stages_.front()->stages(); ++s) {
    const size_t first = stages_.size();
    for (int t = 0; t < slices_; ++t) stages_.push_back(std::make_unique<StageTensors>(dir, m, s, t));
    for (const auto& [name, t] : stages_[first]->entries()) {
      if (!stageOf_.emplace(name, first).second) continue;
      auto cut = cuts_.find(name);
      if (cut == cuts_.end()) {
        entries_.emplace_back(name, t);
        continue;
      }
      std::vector<int64_t> shape = t.sizes().vec();
      if (cut->second.first < 0 || cut->second.first >= static_cast<int64_t>(shape.size())) {
        throw DataError(fmt::format("{}/manifest.json: extra.tensor.cuts cuts '{}' along dimension {}, which it "
                                    "does not have", dir, name, cut->second.first));
      }
      shape[static_cast<size_t>(cut->second.first)] *= slices_;
      entries_.emplace_back(name, withoutData(shape, t.scalar_type()));
    }
  }
}

at::Tensor CheckpointTensors::load(const std::string& name) {
  auto it = stageOf_.find(name);
  if (it == stageOf_.end()) return stages_.front()->load(name);  // its error names the file
  auto cut = cuts_.find(name);
  if (cut == cuts_.end()) return stages_[it->second]->load(name);
  std::vector<int64_t> whole;
  for (const auto& [n, t] : entries_) {
    if (n == name) whole = t.sizes().vec();
  }
  std::vector<at::Tensor> slices;
  for (int t = 0; t < slices_; ++t) {
    StageTensors& slice = *stages_[it->second + static_cast<size_t>(t)];
    at::Tensor piece;
    std::string why;
    try {
      piece = slice.load(name);
    } catch (const DataError& e) {
      why = e.what();
    }
    checkSlice(dir_, "'" + name + "'", piece, whole, cut->second.first, cut->second.second, slices_, t, why);
    slices.push_back(piece);
  }
  return joinSlices(slices, cut->second.first, cut->second.second);
}

at::Tensor CheckpointTensors::loadRegion(const std::string& name, int64_t dim, int blocks, int parts, int index) {
  auto it = stageOf_.find(name);
  std::vector<int64_t> whole;
  for (const auto& [n, t] : entries_) {
    if (n == name) whole = t.sizes().vec();
  }
  auto cut = cuts_.find(name);
  const bool sameCut = cut == cuts_.end() || (cut->second.first == dim && cut->second.second == blocks);
  if (it == stageOf_.end() || !sameCut || !regionFits(whole, dim, blocks, parts, cut == cuts_.end() ? 1 : slices_)) {
    return cutOf(load(name), dim, blocks, parts, index);  // read whole and cut
  }
  return regionOf(whole, dim, blocks, parts, index, cut == cuts_.end() ? 1 : slices_,
                  [&](int j, int64_t lo, int64_t hi) {
                    StageTensors& f = *stages_[it->second + static_cast<size_t>(j)];
                    try {
                      return f.loadRange(name, dim, lo, hi);
                    } catch (const DataError& e) {
                      checkSlice(dir_, "'" + name + "'", at::Tensor(), whole, dim, blocks,
                                 cut == cuts_.end() ? 1 : slices_, j, e.what());
                      throw;
                    }
                  });
}

uint64_t CheckpointTensors::bytesRead() const {
  uint64_t n = 0;
  for (const auto& s : stages_) n += s->bytesRead();
  return n;
}

uint64_t CheckpointTensors::bytesWhole() const {
  uint64_t n = 0;
  for (const auto& [name, t] : entries_) n += static_cast<uint64_t>(t.numel()) * t.element_size();
  return n;
}

void CheckpointTensors::drop(const std::string& name) {
  auto it = stageOf_.find(name);
  if (it == stageOf_.end()) return;
  for (int t = 0; t < slices_; ++t) stages_[it->second + static_cast<size_t>(t)]->drop(name);
}

CheckpointOptimizer::CheckpointOptimizer(const std::string& dir, const Manifest& m) : dir_(dir), cuts_(cutsOf(m)) {
  for (int s = 0; s == 0 || s < stages_.front().front()->stages(); ++s) {
    stages_.emplace_back();
    stages_.back().push_back(std::make_unique<StageTensors>(dir, m, s));
    for (int t = 1; t < stages_.back().front()->slices(); ++t) {
      stages_.back().push_back(std::make_unique<StageTensors>(dir, m, s, t));
    }
    for (const std::string& name : stages_.back().front()->optimizerNames()) {
      if (holder_.emplace(name, stages_.size() - 1).second) names_.push_back(name);
    }
  }
}

CheckpointOptimizer::~CheckpointOptimizer() = default;

at::Tensor CheckpointOptimizer::state(const std::string& name) {
  auto it = holder_.find(name);
  if (it == holder_.end()) return {};
  auto& slices = stages_[it->second];
  const size_t dot = name.rfind('.');
  auto cut = cuts_.find(name.substr(0, dot));
  if (cut == cuts_.end() || name.compare(dot + 1, std::string::npos, "step") == 0) {
    return slices.front()->optimizerState(name);
  }
  std::vector<at::Tensor> parts;
  for (auto& slice : slices) parts.push_back(slice->optimizerState(name));
  // Slice 0's shape says the whole one's; a slice that lacks its part is named.
  if (!parts.front().defined()) return {};
  std::vector<int64_t> whole = parts.front().sizes().vec();
  const int64_t dim = cut->second.first;
  if (dim < 0 || dim >= static_cast<int64_t>(whole.size())) {
    throw DataError(fmt::format("{}/manifest.json: extra.tensor.cuts cuts '{}' along dimension {}, which its optimizer "
                                "state '{}' does not have", dir_, name.substr(0, dot), dim, name));
  }
  whole[static_cast<size_t>(dim)] *= static_cast<int64_t>(slices.size());
  for (size_t t = 0; t < parts.size(); ++t) {
    checkSlice(dir_, "optimizer state '" + name + "'", parts[t], whole, dim, cut->second.second,
               static_cast<int>(slices.size()), static_cast<int>(t), "");
  }
  return joinSlices(parts, cut->second.first, cut->second.second);
}

at::Tensor CheckpointOptimizer::stateRegion(const std::string& name, int64_t dim, int blocks, int parts, int index) {
  auto it = holder_.find(name);
  if (it == holder_.end()) return {};
  auto& slices = stages_[it->second];
  const size_t dot = name.rfind('.');
  auto cut = cuts_.find(name.substr(0, dot));
  const bool sameCut = cut == cuts_.end() || (cut->second.first == dim && cut->second.second == blocks);
  const int held = cut == cuts_.end() ? 1 : static_cast<int>(slices.size());
  std::vector<int64_t> whole = slices.front()->optimizerShape(name);
  if (whole.empty() || !sameCut || name.compare(dot + 1, std::string::npos, "step") == 0 ||
      dim >= static_cast<int64_t>(whole.size())) {
    const at::Tensor t = state(name);
    return t.defined() && t.dim() > dim ? cutOf(t, dim, blocks, parts, index) : t;
  }
  whole[static_cast<size_t>(dim)] *= held;
  if (!regionFits(whole, dim, blocks, parts, held)) return cutOf(state(name), dim, blocks, parts, index);
  // Each slice's region only: from its optimizer.bin, or from the ZeRO
  // parts that hold it.
  return regionOf(whole, dim, blocks, parts, index, held, [&](int j, int64_t lo, int64_t hi) {
    StageTensors& slice = *slices[static_cast<size_t>(j)];
    if (slice.optimizerShape(name).empty()) {
      checkSlice(dir_, "optimizer state '" + name + "'", at::Tensor(), whole, dim, blocks, held, j, "");
    }
    return slice.optimizerStateRange(name, dim, lo, hi);
  });
}

at::Tensor joinSlices(const std::vector<at::Tensor>& slices, int64_t dim, int blocks) {
  COHORT_ASSERT(!slices.empty() && blocks >= 1, "joinSlices takes at least one slice and one block");
  const int64_t width = slices.front().size(dim) / blocks;
  std::vector<at::Tensor> parts;
  for (int b = 0; b < blocks; ++b) {
    for (const at::Tensor& s : slices) parts.push_back(s.narrow(dim, b * width, width));
  }
  return at::cat(parts, dim);
}

}  // namespace cohort::ckpt
