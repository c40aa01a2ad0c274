// What the split decoders share (parallel/detail/split_decoder.h).

#include "parallel/detail/split_decoder.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>

#include "cohort/models/linear.h"
#include "cohort/core/error.h"
#include "cohort/parallel/tensor_layers.h"
#include "models/recompute.h"
#include "parallel/detail/exchange.h"

namespace cohort::parallel::detail {
namespace {

// ---- Drawing the whole model's random numbers a piece at a time ----------

// Elements drawn at once: a multiple of 16, the block normal_ transforms
// together (pairs of uniforms into pairs of normals). normal_ on a tensor of
// n >= 16 elements fills it with n uniforms, transforms each block of 16
// and, when 16 does not divide n, draws 16 more for its last 16 elements;
// on consecutive pieces of multiples of 16 (the last one of at least 16) it
// therefore draws the same numbers and gives the same values, element by
// element, as on the whole tensor. uniform_ draws one number per element.
constexpr int64_t kPiece = int64_t{1} << 18;

using Keep = std::function<void(int64_t offset, const at::Tensor& piece)>;

// Draws what `op` (normal_ or uniform_) on a contiguous float32 tensor of
// `numel` elements draws, one piece at a time; `keep` sees each piece and
// where it starts in the whole tensor.
void drawPieces(int64_t numel, const std::function<void(at::Tensor&)>& op, const Keep& keep) {
  if (numel <= 0) return;
  at::Tensor scratch = at::empty({std::min(numel, kPiece + 16)});
  for (int64_t at = 0; at < numel;) {
    int64_t n = std::min(kPiece, numel - at);
    if (numel - at - n < 16) n = numel - at;  // the last piece takes a rest shorter than 16
    at::Tensor piece = scratch.narrow(0, 0, n);
    op(piece);
    if (keep) keep(at, piece);
    at += n;
  }
}

// The rows and the columns of a [rows, cols] tensor (1-D: cols 1) a rank
// keeps, in the whole tensor's coordinates.
struct Slice {
  int64_t rows = 0, cols = 1;
  std::vector<std::pair<int64_t, int64_t>> rowRanges;  // [begin, end), in order
  int64_t colBegin = 0, colEnd = 1;
  int64_t keptRows() const {
    int64_t n = 0;
    for (const auto& [b, e] : rowRanges) n += e - b;
    return n;
  }
};

Slice sliceFor(const std::vector<int64_t>& sizes, const TensorCut& cut, int tensors, int rank) {
  Slice s;
  s.rows = sizes.at(0);
  s.cols = sizes.size() > 1 ? sizes[1] : 1;
  s.colEnd = s.cols;
  if (!cut.split()) {
    s.rowRanges.push_back({0, s.rows});
  } else if (cut.dim == 0) {
    const int64_t block = s.rows / cut.blocks, width = block / tensors;
    for (int b = 0; b < cut.blocks; ++b) s.rowRanges.push_back({b * block + rank * width, b * block + (rank + 1) * width});
  } else {
    const int64_t width = s.cols / tensors;
    s.rowRanges.push_back({0, s.rows});
    s.colBegin = rank * width;
    s.colEnd = (rank + 1) * width;
  }
  return s;
}

}  // namespace

at::Tensor drawSlice(const std::vector<int64_t>& sizes, double std, const TensorCut& cut, int tensors, int rank,
                     bool held, const Generator& gen) {
  auto normal = [&](at::Tensor& p) { p.normal_(0.0, std, gen); };
  if (!held) {
    drawPieces(sizes[0] * (sizes.size() > 1 ? sizes[1] : 1), normal, nullptr);
    return at::Tensor();
  }
  const Slice slice = sliceFor(sizes, cut, tensors, rank);
  const int64_t width = slice.colEnd - slice.colBegin;
  at::Tensor out = sizes.size() > 1 ? at::empty({slice.keptRows(), width}) : at::empty({slice.keptRows()});
  float* dst = out.data_ptr<float>();
  // Where each whole row lands in `out` (-1: not kept).
  std::vector<int64_t> rowAt(static_cast<size_t>(slice.rows), -1);
  int64_t next = 0;
  for (const auto& [b, e] : slice.rowRanges) {
    for (int64_t r = b; r < e; ++r) rowAt[static_cast<size_t>(r)] = next++;
  }
  drawPieces(slice.rows * slice.cols, normal, [&](int64_t offset, const at::Tensor& piece) {
    const float* src = piece.data_ptr<float>();
    const int64_t end = offset + piece.numel();
    for (int64_t row = offset / slice.cols; row * slice.cols < end; ++row) {
      const int64_t at = rowAt[static_cast<size_t>(row)];
      if (at < 0) continue;
      const int64_t from = std::max(offset, row * slice.cols + slice.colBegin);
      const int64_t to = std::min(end, row * slice.cols + slice.colEnd);
      if (from >= to) continue;
      std::memcpy(dst + at * width + (from - row * slice.cols - slice.colBegin), src + (from - offset),
                  static_cast<size_t>(to - from) * sizeof(float));
    }
  });
  return out;
}

void drawLinearDefaults(int64_t in, int64_t out, bool bias, const Generator& gen) {
  drawPieces(in * out, [&](at::Tensor& p) { p.uniform_(-1.0, 1.0, gen); }, nullptr);
  if (bias) drawPieces(out, [&](at::Tensor& p) { p.uniform_(-1.0, 1.0, gen); }, nullptr);
}

void drawEmbeddingDefaults(int64_t n, int64_t dim, const Generator& gen) {
  drawPieces(n * dim, [&](at::Tensor& p) { p.normal_(0.0, 1.0, gen); }, nullptr);
}

// ---- The split decoder ---------------------------------------------------

SplitDecoder::SplitDecoder(const comm::Comm& group, const models::ModelPart& part, const TensorSplitOptions& split,
                           const Generator& gen, int64_t vocabSize, int64_t blockSize, int64_t width,
                           bool recompute, std::string arch, std::string blocksPrefix)
    : group_(group),
      part_(part),
      gen_(gen),
      sequence_(split.sequenceParallel && group.worldSize > 1),
      vocabFirst_(group.rank * (vocabSize / group.worldSize)),
      blockSize_(blockSize),
      width_(width),
      recompute_(recompute),
      arch_(std::move(arch)),
      blocksPrefix_(std::move(blocksPrefix)) {
  if (split.sequenceParallel && !part.whole()) {
    throw ConfigError("distribution.sequence_parallel: not supported with pipeline stages yet (their "
                      "activations pass between the stages whole)");
  }
}

SplitDecoder::~SplitDecoder() {
  if (segment_) stopSharedMemory(group_);
}

void SplitDecoder::startExchanges(const TensorSplitOptions& split) {
  if (group_.worldSize == 1) return;
  const ExchangePlan plan =
      planExchange(group_, split.sharedMemoryFloats > 0, "distribution.shared_memory is false",
                   std::max<int64_t>(split.sharedMemoryFloats, 1), /*acrossMachines=*/false, "tensor-parallel exchange");
  if (plan.shm) {
    segment_ = plan.shm;
    useSharedMemory(group_, segment_);
  }
}

at::Tensor SplitDecoder::slice(const std::string& name, const std::vector<int64_t>& sizes, double std, bool held) {
  return drawSlice(sizes, std, tensorCut(name), group_.worldSize, group_.rank, held, gen_);
}

int64_t SplitDecoder::checkInput(const at::Tensor& in) const {
  if (part_.input ? in.dim() != 2 : (in.dim() != 3 || in.size(2) != width_)) {
    throw DataError(fmt::format("{}: expected {}, got [{}]", arch_,
                                part_.input ? "tokens [batch, time]"
                                            : fmt::format("activations [batch, time, {}]", width_),
                                fmt::join(in.sizes(), ", ")));
  }
  const int64_t s = in.size(1);
  if (s > blockSize_) {
    throw DataError(fmt::format("{}: a sequence of {} tokens is longer than model.block_size ({})", arch_, s,
                                blockSize_));
  }
  return s;
}

at::Tensor SplitDecoder::runBlocks(at::Tensor x, const BlockForward& block) {
  const bool again = recompute_ && is_training();
  for (size_t k = 0; k < blockIndex_.size(); ++k) {
    x = inUnit(static_cast<int>(k), [block, k, again](const at::Tensor& in) {
      return again ? models::recomputed([block, k](const at::Tensor& y) { return block(k, y); }, in) : block(k, in);
    }, x);
  }
  return x;
}

at::Tensor SplitDecoder::columnInput(const at::Tensor& x) const {
  return sequence_ ? gatherSequence(x, 1, group_) : copyToSlices(x, group_);
}

at::Tensor SplitDecoder::head(const at::Tensor& x, const at::Tensor& weight) const {
  return models::linear(columnInput(x), weight);
}

at::Tensor SplitDecoder::loss(const at::Tensor& logits, const at::Tensor& targets) {
  return vocabParallelCrossEntropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}), vocabFirst_, group_);
}

std::vector<std::string> SplitDecoder::shardingUnits() const {
  std::vector<std::string> units;
  for (int64_t i : blockIndex_) units.push_back(blocksPrefix_ + std::to_string(i));
  return units;
}

std::vector<std::pair<std::string, TensorCut>> SplitDecoder::splitOf(const std::vector<std::string>& names) {
  std::vector<std::pair<std::string, TensorCut>> cuts;
  for (const std::string& name : names) {
    if (const TensorCut cut = tensorCut(name); cut.split()) cuts.emplace_back(name, cut);
  }
  return cuts;
}

}  // namespace cohort::parallel::detail
