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
  // Blocks for the new positions, then the slots of every row's positions,
  // gathered per pool.
  std::vector<int64_t> ends(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    KvCache& c = *caches[r];
    if (c.pool == nullptr) c.pool = std::make_shared<KvPool>();
    ends[r] = out.lengths[r] + out.counts[r];
    out.longest = std::max(out.longest, ends[r]);
    const int64_t bt = c.pool->blockTokens();
    const int64_t need = (ends[r] + bt - 1) / bt - static_cast<int64_t>(c.blocks.size());
    if (need > 0) {
      const std::vector<int64_t> more = c.pool->allocate(need);
      c.blocks.insert(c.blocks.end(), more.begin(), more.end());
    }
  }
  std::vector<size_t> todo(rows.size());
  for (size_t r = 0; r < todo.size(); ++r) todo[r] = r;
  while (!todo.empty()) {
    KvPool* pool = caches[todo.front()]->pool.get();
    const int64_t bt = pool->blockTokens();
    std::vector<int64_t> members, source, dest, read;
    std::vector<size_t> rest;
    for (size_t r : todo) {
      const KvCache& c = *caches[r];
      if (c.pool.get() != pool) {
        rest.push_back(r);
        continue;
      }
      members.push_back(static_cast<int64_t>(r));
      auto slot = [&](int64_t p) { return c.blocks[static_cast<size_t>(p / bt)] * bt + p % bt; };
      for (int64_t i = 0; i < out.counts[r]; ++i) {
        source.push_back(static_cast<int64_t>(r) * t + i);
        dest.push_back(slot(out.lengths[r] + i));
      }
      for (int64_t p = 0; p < out.longest; ++p) read.push_back(p < ends[r] ? slot(p) : 0);
    }
    auto onDevice = [&](const std::vector<int64_t>& v) { return torch::tensor(v, torch::kLong).to(device); };
    out.groups.push_back({pool, onDevice(members), onDevice(source), onDevice(dest), onDevice(read)});
    todo = std::move(rest);
  }
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
                           const std::vector<KvCache*>& /*caches: rows.groups has their slots*/, size_t layer,
                           const DecodeRows& rows, int64_t /*capacity*/) {
  const int64_t b = q.size(0), heads = q.size(1), t = q.size(2), d = q.size(3), kv = k.size(1);
  const int64_t group = heads / kv;
  const std::vector<int64_t>& lengths = rows.lengths;
  const std::vector<int64_t>& counts = rows.counts;
  const int64_t longest = rows.longest;
  bool ragged = false;
  for (size_t r = 0; r < counts.size(); ++r) ragged = ragged || lengths[r] + counts[r] != longest;
  // Each new position's key and value into its slot; then every row's
  // positions 0 .. longest - 1 gathered from their slots, [B, KV, longest, D].
  const at::Tensor newKeys = k.permute({0, 2, 1, 3}).reshape({b * t, kv, d});
  const at::Tensor newValues = v.permute({0, 2, 1, 3}).reshape({b * t, kv, d});
  at::Tensor keys, values;
  for (const DecodeRows::Group& g : rows.groups) {
    at::Tensor& keyStore = g.pool->keys(layer, kv, d, k.options());
    at::Tensor& valueStore = g.pool->values(layer, kv, d, v.options());
    keyStore.index_copy_(0, g.dest, newKeys.index_select(0, g.source));
    valueStore.index_copy_(0, g.dest, newValues.index_select(0, g.source));
    const int64_t n = g.rows.size(0);
    const at::Tensor ks = keyStore.index_select(0, g.read).view({n, longest, kv, d}).permute({0, 2, 1, 3});
    const at::Tensor vs = valueStore.index_select(0, g.read).view({n, longest, kv, d}).permute({0, 2, 1, 3});
    if (rows.groups.size() == 1) {
      keys = ks.contiguous();
      values = vs.contiguous();
    } else {
      if (!keys.defined()) {
        keys = torch::zeros({b, kv, longest, d}, k.options());
        values = torch::zeros({b, kv, longest, d}, v.options());
      }
      keys.index_copy_(0, g.rows, ks);
      values.index_copy_(0, g.rows, vs);
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
