// The GPT split over a tensor group (parallel/tensor_gpt.h): its modules,
// and the build that gives each rank its slices of the whole model's
// values without any rank holding a whole split matrix.

#include "cohort/parallel/tensor_gpt.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/parallel/tensor_layers.h"
#include "parallel/detail/exchange.h"
#include "models/recompute.h"

namespace cohort::parallel {
namespace {

namespace nn = torch::nn;
using Generator = c10::optional<at::Generator>;

bool endsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

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

// A tensor of `sizes` drawn as normal_(0, std) would draw it whole, of which
// only `slice` is kept (and returned, [kept rows, kept columns] or 1-D).
at::Tensor drawSlice(const std::vector<int64_t>& sizes, double std, const Slice& slice, const Generator& gen) {
  const int64_t width = slice.colEnd - slice.colBegin;
  at::Tensor out = sizes.size() > 1 ? at::empty({slice.keptRows(), width}) : at::empty({slice.keptRows()});
  float* dst = out.data_ptr<float>();
  // Where each whole row lands in `out` (-1: not kept).
  std::vector<int64_t> rowAt(static_cast<size_t>(slice.rows), -1);
  int64_t next = 0;
  for (const auto& [b, e] : slice.rowRanges) {
    for (int64_t r = b; r < e; ++r) rowAt[static_cast<size_t>(r)] = next++;
  }
  drawPieces(
      slice.rows * slice.cols, [&](at::Tensor& p) { p.normal_(0.0, std, gen); },
      [&](int64_t offset, const at::Tensor& piece) {
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

// What building nn::Linear(in, out) and nn::Embedding(n, dim) with their
// default initialization draws, without keeping it.
void drawLinearDefaults(int64_t in, int64_t out, bool bias, const Generator& gen) {
  drawPieces(in * out, [&](at::Tensor& p) { p.uniform_(-1.0, 1.0, gen); }, nullptr);
  if (bias) drawPieces(out, [&](at::Tensor& p) { p.uniform_(-1.0, 1.0, gen); }, nullptr);
}
void drawEmbeddingDefaults(int64_t n, int64_t dim, const Generator& gen) {
  drawPieces(n * dim, [&](at::Tensor& p) { p.normal_(0.0, 1.0, gen); }, nullptr);
}

// ---- The split model's modules -------------------------------------------

// A module that only holds a tensor (wpe): "weight".
class HolderImpl : public nn::Module {
 public:
  explicit HolderImpl(at::Tensor w) : weight(register_parameter("weight", std::move(w))) {}
  at::Tensor weight;
};
TORCH_MODULE(Holder);

// The GPT's LayerNorm (models/gpt.cc): ones and zeros, the bias optional.
class NormImpl : public nn::Module {
 public:
  NormImpl(int64_t n, bool bias) {
    weight_ = register_parameter("weight", at::ones({n}));
    if (bias) bias_ = register_parameter("bias", at::zeros({n}));
  }
  at::Tensor forward(const at::Tensor& x) { return torch::layer_norm(x, {weight_.size(0)}, weight_, bias_, 1e-5); }

 private:
  at::Tensor weight_, bias_;
};
TORCH_MODULE(Norm);

class AttentionImpl : public nn::Module {
 public:
  AttentionImpl(ColumnParallelLinear qkv, RowParallelLinear proj, int64_t heads)
      : heads_(heads), qkv_(register_module("c_attn", std::move(qkv))), proj_(register_module("c_proj", std::move(proj))) {}

  // x [B, S, C] whole -> [B, S, C] whole: this rank's heads, then one sum.
  // `sequence`: x and the result are this rank's slice of the sequence.
  at::Tensor forward(const at::Tensor& x, bool sequence) {
    const at::Tensor all = sequence ? qkv_->forwardGathered(x, 1) : qkv_(x);
    const int64_t b = all.size(0), s = all.size(1), local = qkv_->weight.size(0) / 3, d = local / heads_;
    const std::vector<at::Tensor> qkv = all.split(local, 2);
    auto split = [&](const at::Tensor& m) { return m.reshape({b, s, heads_, d}).transpose(1, 2); };
    const at::Tensor y = models::causalAttention(split(qkv[0]), split(qkv[1]), split(qkv[2]), mask_, x.options());
    return sequence ? proj_->forwardScattered(y, 1) : proj_(y);
  }

 private:
  int64_t heads_;  // this rank's
  at::Tensor mask_;
  ColumnParallelLinear qkv_;
  RowParallelLinear proj_;
};
TORCH_MODULE(Attention);

class MlpImpl : public nn::Module {
 public:
  MlpImpl(ColumnParallelLinear fc, RowParallelLinear proj, bool tanh)
      : approximate_(tanh ? "tanh" : "none"),
        fc_(register_module("c_fc", std::move(fc))),
        proj_(register_module("c_proj", std::move(proj))) {}
  at::Tensor forward(const at::Tensor& x, bool sequence) {
    if (sequence) return proj_->forwardScattered(torch::gelu(fc_->forwardGathered(x, 1), approximate_), 1);
    return proj_(torch::gelu(fc_(x), approximate_));
  }

 private:
  const char* approximate_;
  ColumnParallelLinear fc_;
  RowParallelLinear proj_;
};
TORCH_MODULE(Mlp);

class BlockImpl : public nn::Module {
 public:
  BlockImpl(Norm ln1, Attention attn, Norm ln2, Mlp mlp)
      : ln1_(register_module("ln_1", std::move(ln1))),
        attn_(register_module("attn", std::move(attn))),
        ln2_(register_module("ln_2", std::move(ln2))),
        mlp_(register_module("mlp", std::move(mlp))) {}
  at::Tensor forward(at::Tensor x, bool sequence) {
    x = x + attn_->forward(ln1_(x), sequence);
    return x + mlp_->forward(ln2_(x), sequence);
  }

 private:
  // In the whole model's order, which registration (and the state dict) follows.
  Norm ln1_;
  Attention attn_;
  Norm ln2_;
  Mlp mlp_;
};
TORCH_MODULE(Block);

class SplitGpt : public TensorParallelGpt {
 public:
  SplitGpt(const models::GptOptions& o, const comm::Comm& group, const TensorSplitOptions& split,
           const Generator& gen, const models::ModelPart& part)
      : group_(group),
        part_(part),
        layers_(o.nLayer),
        bias_(o.bias),
        blockSize_(o.blockSize),
        sequence_(split.sequenceParallel && group.worldSize > 1),
        recompute_(o.recompute) {
    const int t = group.worldSize, r = group.rank;
    const int64_t c = o.nEmbd, v = o.vocabSize;
    vocabFirst_ = r * (v / t);
    // The whole model's construction draws (each module's default
    // initialization), then GPT-2's initialization over every parameter in
    // order (models/gpt.cc): the same numbers, in the same order.
    drawEmbeddingDefaults(v, c, gen);
    drawEmbeddingDefaults(o.blockSize, c, gen);
    for (int64_t i = 0; i < o.nLayer; ++i) {
      drawLinearDefaults(c, 3 * c, o.bias, gen);
      drawLinearDefaults(c, c, o.bias, gen);
      drawLinearDefaults(c, 4 * c, o.bias, gen);
      drawLinearDefaults(4 * c, c, o.bias, gen);
    }
    const double residualStd = 0.02 / std::sqrt(2.0 * static_cast<double>(o.nLayer));
    // This rank's slice of the whole model's tensor `name` of `sizes`; a
    // tensor of another pipeline stage is drawn and dropped.
    auto weight = [&](const std::string& name, std::vector<int64_t> sizes, bool held = true) {
      const double std = endsWith(name, "c_proj.weight") ? residualStd : 0.02;
      if (!held) {
        drawPieces(sizes[0] * (sizes.size() > 1 ? sizes[1] : 1), [&](at::Tensor& p) { p.normal_(0.0, std, gen); },
                   nullptr);
        return at::Tensor();
      }
      return drawSlice(sizes, std, sliceFor(sizes, gptTensorCut(name), t, r), gen);
    };
    auto zeros = [&](const std::string& name, int64_t n) {
      const TensorCut cut = gptTensorCut(name);
      return at::zeros({cut.split() ? n / t : n});
    };
    auto transformer = register_module("transformer", std::make_shared<nn::Module>());
    // The token embedding is the head too: the first and the last stage hold it.
    at::Tensor wte = weight("transformer.wte.weight", {v, c}, part.input || part.output);
    if (wte.defined()) {
      wte_ = transformer->register_module("wte", VocabParallelEmbedding(wte, vocabFirst_, group_));
    }
    at::Tensor wpe = weight("transformer.wpe.weight", {o.blockSize, c}, part.input);
    if (wpe.defined()) wpe_ = transformer->register_module("wpe", Holder(wpe));
    auto h = transformer->register_module("h", std::make_shared<nn::Module>());
    for (int64_t i = 0; i < o.nLayer; ++i) {
      const std::string p = fmt::format("transformer.h.{}.", i);
      if (!part.holds(i, o.nLayer)) {
        for (const auto& [name, sizes] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
                 {"attn.c_attn.weight", {3 * c, c}},
                 {"attn.c_proj.weight", {c, c}},
                 {"mlp.c_fc.weight", {4 * c, c}},
                 {"mlp.c_proj.weight", {c, 4 * c}}}) {
          weight(p + name, sizes, false);
        }
        continue;
      }
      Norm ln1(c, o.bias);
      at::Tensor qkvW = weight(p + "attn.c_attn.weight", {3 * c, c});
      at::Tensor qkvB = o.bias ? zeros(p + "attn.c_attn.bias", 3 * c) : at::Tensor();
      at::Tensor projW = weight(p + "attn.c_proj.weight", {c, c});
      at::Tensor projB = o.bias ? zeros(p + "attn.c_proj.bias", c) : at::Tensor();
      Norm ln2(c, o.bias);
      at::Tensor fcW = weight(p + "mlp.c_fc.weight", {4 * c, c});
      at::Tensor fcB = o.bias ? zeros(p + "mlp.c_fc.bias", 4 * c) : at::Tensor();
      at::Tensor mlpW = weight(p + "mlp.c_proj.weight", {c, 4 * c});
      at::Tensor mlpB = o.bias ? zeros(p + "mlp.c_proj.bias", c) : at::Tensor();
      Attention attn(ColumnParallelLinear(qkvW, qkvB, group_), RowParallelLinear(projW, projB, group_),
                     o.nHead / t);
      Mlp mlp(ColumnParallelLinear(fcW, fcB, group_), RowParallelLinear(mlpW, mlpB, group_), o.geluTanh);
      blocks_.push_back(h->register_module(std::to_string(i), Block(ln1, attn, ln2, mlp)));
      blockIndex_.push_back(i);
    }
    if (part.output) lnF_ = transformer->register_module("ln_f", Norm(c, o.bias));
  }

  ~SplitGpt() override {
    if (segment_) stopSharedMemory(group_);
  }

  // The group's exchanges through `segment` for as long as this model lives.
  void exchangeThrough(std::shared_ptr<comm::ShmAllreduce> segment) {
    segment_ = std::move(segment);
    useSharedMemory(group_, segment_);
  }

  int64_t vocabFirst() const override { return vocabFirst_; }
  bool sequenceParallel() const override { return sequence_; }

  at::Tensor forward(const at::Tensor& tokens) override {
    const int64_t expected = part_.input ? 2 : 3;
    if (tokens.dim() != expected) {
      throw DataError(fmt::format("gpt: expected {}, got {} dimension(s)",
                                  part_.input ? "tokens [batch, time]" : "activations [batch, time, n_embd]",
                                  tokens.dim()));
    }
    const int64_t s = tokens.size(1);
    if (s > blockSize_) {
      throw DataError(fmt::format("gpt: a sequence of {} tokens is longer than model.block_size ({})", s, blockSize_));
    }
    at::Tensor x;
    if (!part_.input) {
      // A later pipeline stage: the residual stream [B, S, C], whole.
      x = tokens;
    } else if (sequence_) {
      const at::Tensor& wpe = wpe_->weight;
      // This rank's positions [r S/T, (r+1) S/T): their embeddings' sum.
      const int64_t width = s / group_.worldSize;
      x = wte_->forwardScattered(tokens, 1);
      x = x + torch::embedding(wpe, torch::arange(group_.rank * width, (group_.rank + 1) * width,
                                                  tokens.options().dtype(torch::kLong)));
    } else {
      x = wte_(tokens) + torch::embedding(wpe_->weight, torch::arange(s, tokens.options().dtype(torch::kLong)));
    }
    const bool again = recompute_ && is_training();
    const bool sequence = sequence_;
    for (size_t k = 0; k < blocks_.size(); ++k) {
      // model.recompute: the block's forward runs again in backward, its
      // exchanges with it (every rank of the group recomputes in the same
      // order). ZeRO stage 3: each block is a unit, its slices gathered
      // among the data replicas around its forward and backward.
      Block block = blocks_[k];
      x = inUnit(static_cast<int>(k), [block, again, sequence](const at::Tensor& in) mutable {
        return again ? models::recomputed([block, sequence](const at::Tensor& y) mutable { return block->forward(y, sequence); }, in)
                     : block->forward(in, sequence);
      }, x);
    }
    if (!part_.output) return x;
    x = lnF_(x);
    // The head is this rank's rows of the token embedding (tied).
    return torch::linear(sequence_ ? gatherSequence(x, 1, group_) : copyToSlices(x, group_), wte_->weight);
  }

  at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets) override {
    return vocabParallelCrossEntropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}), vocabFirst_,
                                     group_);
  }

  std::vector<std::pair<std::string, std::string>> tiedNames() const override {
    if (!part_.output) return {};
    return {{models::kTiedHeadName, "transformer.wte.weight"}};
  }

  std::vector<std::string> shardingUnits() const override {
    std::vector<std::string> units;
    for (int64_t i : blockIndex_) units.push_back(fmt::format("transformer.h.{}", i));
    return units;
  }

  std::vector<std::pair<std::string, TensorCut>> wholeCuts() const override {
    std::vector<std::pair<std::string, TensorCut>> cuts{{"transformer.wte.weight", gptTensorCut("transformer.wte.weight")}};
    for (int64_t i = 0; i < layers_; ++i) {
      for (const char* name : {"attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "mlp.c_fc.weight",
                               "mlp.c_fc.bias", "mlp.c_proj.weight"}) {
        const std::string full = fmt::format("transformer.h.{}.{}", i, name);
        if (!bias_ && endsWith(full, ".bias")) continue;
        cuts.emplace_back(full, gptTensorCut(full));
      }
    }
    return cuts;
  }

 private:
  comm::Comm group_;
  models::ModelPart part_;
  int64_t layers_;
  bool bias_;
  std::shared_ptr<comm::ShmAllreduce> segment_;
  int64_t blockSize_;
  bool sequence_;
  bool recompute_;
  int64_t vocabFirst_ = 0;
  VocabParallelEmbedding wte_{nullptr};
  Holder wpe_{nullptr};
  Norm lnF_{nullptr};
  std::vector<Block> blocks_;
  std::vector<int64_t> blockIndex_;  // each held block's index in the whole model
};

}  // namespace

TensorCut gptTensorCut(const std::string& name) {
  if (name == "transformer.wte.weight" || name == models::kTiedHeadName) return {0, 1};
  if (name.rfind("transformer.h.", 0) != 0) return {};
  if (endsWith(name, "attn.c_attn.weight") || endsWith(name, "attn.c_attn.bias")) return {0, 3};
  if (endsWith(name, "mlp.c_fc.weight") || endsWith(name, "mlp.c_fc.bias")) return {0, 1};
  if (endsWith(name, "c_proj.weight")) return {1, 1};  // attention's and the MLP's
  return {};
}

at::Tensor sliceByCut(const at::Tensor& whole, const TensorCut& cut, int tensors, int rank) {
  if (!cut.split()) return whole.contiguous().clone();
  const int64_t size = whole.size(cut.dim), block = size / cut.blocks, width = block / tensors;
  std::vector<at::Tensor> parts;
  for (int b = 0; b < cut.blocks; ++b) parts.push_back(whole.narrow(cut.dim, b * block + rank * width, width));
  return torch::cat(parts, cut.dim).contiguous();
}

void checkGptTensorSplit(const models::GptOptions& o, int tensors) {
  if (tensors < 1) throw ConfigError(fmt::format("tensor parallelism needs at least 1 rank, got {}", tensors));
  for (const auto& [value, what] : {std::pair{o.nHead, std::string("model.n_head")},
                                    std::pair{4 * o.nEmbd, std::string("the MLP's width (4 x model.n_embd)")},
                                    std::pair{o.vocabSize, std::string("model.vocab_size")}}) {
    if (value % tensors != 0) {
      throw ConfigError(fmt::format("distribution.tensor: {} ranks cannot split the model: {} ({}) is not divisible by {}", tensors,
                                    what, value, tensors));
    }
  }
  if (o.dropout != 0) {
    throw ConfigError(fmt::format("model.dropout: {} with tensor parallelism; only 0 is supported so far",
                                  o.dropout));
  }
}

std::shared_ptr<TensorParallelGpt> createTensorParallelGpt(const models::GptOptions& o, const comm::Comm& group,
                                                           TensorSplitOptions split,
                                                           c10::optional<at::Generator> generator,
                                                           const models::ModelPart& part) {
  checkGptTensorSplit(o, group.worldSize);
  if (o.nEmbd % o.nHead != 0) {
    throw ConfigError(fmt::format("model.n_embd: {} is not divisible by model.n_head ({})", o.nEmbd, o.nHead));
  }
  torch::NoGradGuard noGrad;
  if (split.sequenceParallel && !part.whole()) {
    throw ConfigError("distribution.sequence_parallel: not supported with pipeline stages yet (their "
                      "activations pass between the stages whole)");
  }
  auto model = std::make_shared<SplitGpt>(o, group, split, generator, part);
  if (group.worldSize > 1) {
    const detail::ExchangePlan plan =
        detail::planExchange(group, split.sharedMemoryFloats > 0, "distribution.shared_memory is false",
                             std::max<int64_t>(split.sharedMemoryFloats, 1), /*acrossMachines=*/false,
                             "tensor-parallel exchange");
    if (plan.shm) model->exchangeThrough(plan.shm);
  }
  return model;
}

}  // namespace cohort::parallel
