#include "models/attention.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "cohort/core/error.h"

namespace cohort::models {

DecodeRows decodeRows(const std::vector<at::Tensor>& rows, const std::vector<KvCache*>& caches, int64_t capacity,
                      const char* model, const at::Device& device) {
  if (rows.empty() || rows.size() != caches.size()) {
    throw DataError(fmt::format("{}: decode takes a cache per row; got {} row(s) and {} cache(s)", model,
                                rows.size(), caches.size()));
  }
  DecodeRows out;
  int64_t t = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const at::Tensor& row = rows[r];
    if (row.dim() != 1 || row.size(0) < 1 || row.scalar_type() != torch::kLong) {
      throw DataError(fmt::format("{}: decode takes rows of token ids int64 [time >= 1]; row {} is {} [{}]", model,
                                  r, c10::toString(row.scalar_type()), fmt::join(row.sizes(), ", ")));
    }
    const int64_t length = caches[r]->length, count = row.size(0);
    if (length + count > capacity) {
      throw DataError(fmt::format("{}: {} cached positions and {} new ones pass model.block_size ({})", model,
                                  length, count, capacity));
    }
    out.lengths.push_back(length);
    out.counts.push_back(count);
    t = std::max(t, count);
  }
  const auto b = static_cast<int64_t>(rows.size());
  out.tokens = torch::zeros({b, t}, torch::kLong);
  out.positions = torch::zeros({b, t}, torch::kLong);
  for (int64_t r = 0; r < b; ++r) {
    const auto i = static_cast<size_t>(r);
    out.tokens[r].narrow(0, 0, out.counts[i]).copy_(rows[i]);
    out.positions[r].copy_(
        torch::arange(out.lengths[i], out.lengths[i] + t, torch::kLong).clamp_max(capacity - 1));
  }
  out.tokens = out.tokens.to(device);
  out.positions = out.positions.to(device);
  return out;
}

void advanceCaches(const DecodeRows& rows, const std::vector<KvCache*>& caches) {
  for (size_t r = 0; r < rows.counts.size(); ++r) caches[r]->length += rows.counts[r];
}

void checkStageInput(const at::Tensor& hidden, const DecodeRows& rows, int64_t width, const char* model) {
  const auto b = static_cast<int64_t>(rows.counts.size());
  const int64_t t = rows.tokens.size(1);
  if (!hidden.defined() || hidden.dim() != 3 || hidden.size(0) != b || hidden.size(1) != t ||
      hidden.size(2) != width) {
    throw DataError(fmt::format("{}: a later pipeline stage decodes activations [{}, {}, {}], got [{}]", model, b,
                                t, width, hidden.defined() ? fmt::format("{}", fmt::join(hidden.sizes(), ", ")) : ""));
  }
}

at::Tensor lastOfEachRow(const at::Tensor& x, const DecodeRows& rows, const std::vector<KvCache*>& caches) {
  advanceCaches(rows, caches);
  std::vector<int64_t> last(rows.counts.size());
  for (size_t r = 0; r < rows.counts.size(); ++r) last[r] = rows.counts[r] - 1;
  const auto b = static_cast<int64_t>(last.size());
  return x.index({torch::arange(b, torch::kLong).to(x.device()), torch::tensor(last, torch::kLong).to(x.device())});
}

at::Tensor cachedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::vector<KvCache*>& caches, size_t layer, const DecodeRows& rows,
                           int64_t capacity) {
  const int64_t b = q.size(0), heads = q.size(1), t = q.size(2), d = q.size(3), kv = k.size(1);
  const int64_t group = heads / kv;
  const std::vector<int64_t>& lengths = rows.lengths;
  const std::vector<int64_t>& counts = rows.counts;
  int64_t longest = 0;
  bool ragged = false;
  for (int64_t r = 0; r < b; ++r) {
    const auto i = static_cast<size_t>(r);
    KvCache& kc = *caches[i];
    if (kc.keys.size() <= layer) {
      kc.keys.push_back(torch::zeros({kv, capacity, d}, k.options()));
      kc.values.push_back(torch::zeros({kv, capacity, d}, v.options()));
    }
    kc.keys[layer].narrow(1, lengths[i], counts[i]).copy_(k[r].narrow(1, 0, counts[i]));
    kc.values[layer].narrow(1, lengths[i], counts[i]).copy_(v[r].narrow(1, 0, counts[i]));
    ragged = ragged || (r > 0 && lengths[i] + counts[i] != longest);
    longest = std::max(longest, lengths[i] + counts[i]);
  }
  at::Tensor keys, values;
  if (b == 1) {
    keys = caches[0]->keys[layer].narrow(1, 0, longest).unsqueeze(0);
    values = caches[0]->values[layer].narrow(1, 0, longest).unsqueeze(0);
  } else {
    keys = torch::zeros({b, kv, longest, d}, k.options());
    values = torch::zeros({b, kv, longest, d}, v.options());
    for (int64_t r = 0; r < b; ++r) {
      const auto i = static_cast<size_t>(r);
      const KvCache& kc = *caches[i];
      const int64_t n = lengths[i] + counts[i];
      keys[r].narrow(1, 0, n).copy_(kc.keys[layer].narrow(1, 0, n));
      values[r].narrow(1, 0, n).copy_(kc.values[layer].narrow(1, 0, n));
    }
  }
  // A group's query heads side by side against their one key/value head:
  // [B, KV, G T, D] x [B, KV, D, longest], the cache never copied per head.
  const at::Tensor grouped = group == 1 ? q : q.reshape({b, kv, group * t, d});
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  at::Tensor att = torch::matmul(grouped, keys.transpose(2, 3)) * scale;  // [B, KV, G T, longest]
  if (t > 1 || ragged) {
    // Query i of row r is at position lengths[r] + i and sees keys j up to
    // it, and none of another row's padding.
    auto column = [&](const std::vector<int64_t>& of) { return torch::tensor(of, torch::kLong).view({b, 1, 1}); };
    const at::Tensor j = torch::arange(longest, torch::kLong).view({1, 1, longest});
    std::vector<int64_t> ends(static_cast<size_t>(b));
    for (size_t r = 0; r < ends.size(); ++r) ends[r] = lengths[r] + counts[r];
    const at::Tensor at_ = column(lengths) + torch::arange(t, torch::kLong).view({1, t, 1});
    const at::Tensor hidden = ((j > at_) | (j >= column(ends))).view({b, 1, 1, t, longest}).to(att.device());
    att = att.view({b, kv, group, t, longest})
              .masked_fill(hidden, -std::numeric_limits<double>::infinity())
              .view({b, kv, group * t, longest});
  }
  att = torch::softmax(att, -1);
  return torch::matmul(att, values).view({b, heads, t, d}).transpose(1, 2).contiguous().view({b, t, heads * d});
}

}  // namespace cohort::models
