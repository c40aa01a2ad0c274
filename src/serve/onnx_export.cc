// `cohort export --format onnx`: the forward of graph_ops.cc as ONNX nodes.
//
// How the graph is produced: LibTorch's C++ API has no ONNX exporter
// (torch.onnx is Python), so cohort writes the graph itself. The model's
// forward is described once over `Ops` (serve/detail/graph_ops.h); OnnxOps
// turns each operation into opset-17 nodes of the default domain, the
// trained tensors become initializers under their state-dict names, and
// serve/detail/onnx_proto.cc encodes the ModelProto.

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <limits>
#include <set>
#include <utility>

#include "cohort/ckpt/tensor_file.h"
#include "cohort/core/base64.h"
#include "cohort/core/error.h"
#include "cohort/core/version.h"
#include "serve/detail/exporters.h"
#include "serve/detail/graph_ops.h"
#include "serve/detail/onnx_proto.h"

namespace cohort::serve::detail {

namespace {

using onnx::Attribute;

std::vector<int64_t> onnxDims(const at::Tensor& t) { return {t.sizes().begin(), t.sizes().end()}; }

class OnnxOps : public Ops {
 public:
  // `source`: where the trained tensors' values are read as the file is
  // written (the weights then have shapes only); else from `weights`.
  OnnxOps(const Weights& weights, onnx::Graph& graph, ckpt::TensorSource* source)
      : Ops(weights), graph_(graph), source_(source) {}

  std::string normalize(const std::string& x, const std::vector<double>& mean,
                        const std::vector<double>& std) override {
    std::vector<float> m, s;
    for (double v : mean) m.push_back(static_cast<float>(v));
    for (double v : std) s.push_back(static_cast<float>(v));
    const int64_t c = static_cast<int64_t>(m.size());
    const std::string scaled = node("Div", {x, scalar("255", 255.0f)}, {}, "scale");
    const std::string centered = node("Sub", {scaled, constant("pixel_mean", {1, c, 1, 1}, m)}, {}, "center");
    return node("Div", {centered, constant("pixel_std", {1, c, 1, 1}, s)}, {}, "normalize");
  }

  std::string conv(const std::string& x, const std::string& prefix, int64_t stride, int64_t pad) override {
    const at::Tensor& w = weight(prefix + ".weight");
    std::vector<std::string> in = {x, init(prefix + ".weight")};
    if (has(prefix + ".bias")) in.push_back(init(prefix + ".bias"));
    return node(
        "Conv", in,
        {Attribute::ofInts("kernel_shape", {w.size(2), w.size(3)}),
         Attribute::ofInts("strides", {stride, stride}), Attribute::ofInts("pads", {pad, pad, pad, pad})},
        prefix);
  }

  std::string batchNorm(const std::string& x, const std::string& prefix) override {
    return node("BatchNormalization",
                {x, init(prefix + ".weight"), init(prefix + ".bias"), init(prefix + ".running_mean"),
                 init(prefix + ".running_var")},
                {Attribute::ofFloat("epsilon", 1e-5f)}, prefix);
  }

  std::string relu(const std::string& x) override { return node("Relu", {x}, {}, "relu"); }

  std::string maxPool(const std::string& x, int64_t kernel, int64_t stride, int64_t pad) override {
    return node(
        "MaxPool", {x},
        {Attribute::ofInts("kernel_shape", {kernel, kernel}), Attribute::ofInts("strides", {stride, stride}),
         Attribute::ofInts("pads", {pad, pad, pad, pad})},
        "maxpool");
  }

  std::string globalAveragePool(const std::string& x) override {
    return flatten(node("GlobalAveragePool", {x}, {}, "avgpool"));
  }

  std::string flatten(const std::string& x) override {
    return node("Flatten", {x}, {Attribute::ofInt("axis", 1)}, "flatten");
  }

  std::string linear(const std::string& x, const std::string& prefix) override {
    // The weight is stored as trained ([out, in]) and transposed by a node
    // the runtime folds, so initializers keep the state dict's layout.
    const std::string y = matmulTransposed(x, prefix + ".weight");
    return has(prefix + ".bias") ? node("Add", {y, init(prefix + ".bias")}, {}, prefix + ".bias") : y;
  }

  std::string add(const std::string& a, const std::string& b) override {
    return node("Add", {a, b}, {}, "add");
  }

  std::string embed(const std::string& tokens, const std::string& wte, const std::string& wpe) override {
    setPositions(tokens);
    return node(
        "Add",
        {node("Gather", {init(wte), tokens}, {}, "wte"), node("Gather", {init(wpe), positions_}, {}, "wpe")},
        {}, "embed");
  }

  std::string layerNorm(const std::string& x, const std::string& prefix) override {
    std::vector<std::string> in = {x, init(prefix + ".weight")};
    if (has(prefix + ".bias")) in.push_back(init(prefix + ".bias"));
    return node("LayerNormalization", in,
                {Attribute::ofInt("axis", -1), Attribute::ofFloat("epsilon", 1e-5f)}, prefix);
  }

  std::string attention(const std::string& x, const std::string& prefix, int64_t heads) override {
    const int64_t c = weight(prefix + ".c_proj.weight").size(0), d = c / heads;
    const std::string qkv = linear(x, prefix + ".c_attn");
    const std::string split = constantInts(fmt::format("split_{}", c), {3}, {c, c, c});
    std::vector<std::string> parts =
        nodeOutputs("Split", {qkv, split}, {Attribute::ofInt("axis", 2)}, prefix + ".split", 3);
    // [B, T, C] -> [B, T, heads, d]; 0 keeps the batch and time sizes.
    const std::string headShape = constantInts(fmt::format("heads_{}_{}", heads, d), {4}, {0, 0, heads, d});
    auto perHead = [&](const std::string& m, std::vector<int64_t> perm) {
      const std::string r = node("Reshape", {m, headShape}, {}, prefix + ".heads");
      return node("Transpose", {r}, {Attribute::ofInts("perm", std::move(perm))}, prefix + ".transpose");
    };
    const std::string q = perHead(parts[0], {0, 2, 1, 3});
    const std::string kT = perHead(parts[1], {0, 2, 3, 1});
    const std::string v = perHead(parts[2], {0, 2, 1, 3});
    std::string y = mix(q, kT, v, d, prefix);
    y = node("Reshape", {y, constantInts(fmt::format("embd_{}", c), {3}, {0, 0, c})}, {}, prefix + ".merge");
    return linear(y, prefix + ".c_proj");
  }

  std::string gelu(const std::string& x, bool tanh) override {
    // 0.5 x (1 + erf(x / sqrt 2)), or 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))):
    // opset 17 has no Gelu.
    std::string e;
    if (tanh) {
      const std::string cube = node("Mul", {node("Mul", {x, x}, {}, "gelu"), x}, {}, "gelu");
      const std::string inner =
          node("Add", {x, node("Mul", {cube, scalar("gelu_c", 0.044715f)}, {}, "gelu")}, {}, "gelu");
      e = node("Tanh",
               {node("Mul", {inner, scalar("sqrt_2_pi", static_cast<float>(std::sqrt(2.0 / M_PI)))}, {}, "gelu")},
               {}, "gelu");
    } else {
      e = node("Erf", {node("Div", {x, scalar("sqrt2", static_cast<float>(std::sqrt(2.0)))}, {}, "gelu")}, {},
               "gelu");
    }
    const std::string onePlus = node("Add", {e, scalar("one_f", 1.0f)}, {}, "gelu");
    return node("Mul", {node("Mul", {x, onePlus}, {}, "gelu"), scalar("half", 0.5f)}, {}, "gelu");
  }

  std::string matmulTransposed(const std::string& x, const std::string& w) override {
    const std::string wT = node("Transpose", {init(w)}, {Attribute::ofInts("perm", {1, 0})}, w + ".T");
    return node("MatMul", {x, wT}, {}, w + ".matmul");
  }

  std::string embedTokens(const std::string& tokens, const std::string& wte) override {
    setPositions(tokens);
    return node("Gather", {init(wte), tokens}, {}, "embed_tokens");
  }

  std::string rmsNorm(const std::string& x, const std::string& prefix, double eps) override {
    // opset 17 has no RMSNormalization (it arrives in 23).
    const std::string meanSquare = node("ReduceMean", {node("Mul", {x, x}, {}, prefix + ".square")},
                                        {Attribute::ofInts("axes", {-1}), Attribute::ofInt("keepdims", 1)},
                                        prefix + ".mean");
    const std::string rms = node(
        "Sqrt", {node("Add", {meanSquare, scalar(fmt::format("eps_{}", eps), static_cast<float>(eps))}, {}, prefix)},
        {}, prefix + ".rms");
    const std::string normed = node("Mul", {x, node("Reciprocal", {rms}, {}, prefix)}, {}, prefix);
    return node("Mul", {init(prefix + ".weight"), normed}, {}, prefix + ".weight");
  }

  std::pair<std::string, std::string> rotaryTables(const at::Tensor& cos, const at::Tensor& sin) override {
    // The first T rows: the rows at the token positions 0 .. T-1.
    auto cut = [&](const char* name, const at::Tensor& table) {
      const at::Tensor t = table.to(torch::kFloat).contiguous();
      const std::vector<float> values(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
      return node("Gather", {constant(name, onnxDims(t), values), positions_}, {Attribute::ofInt("axis", 0)},
                  name);
    };
    return {cut("rope_cos", cos), cut("rope_sin", sin)};
  }

  std::string rotaryAttention(const std::string& x, const std::string& prefix, int64_t heads, int64_t kvHeads,
                              const std::pair<std::string, std::string>& rotary) override {
    const int64_t width = weight(prefix + ".q_proj.weight").size(0), d = width / heads, half = d / 2;
    // [B, T, n d] -> [B, n, T, d]; 0 keeps the batch and time sizes.
    auto perHead = [&](const std::string& proj, int64_t n) {
      const std::string shape = constantInts(fmt::format("heads_{}_{}", n, d), {4}, {0, 0, n, d});
      const std::string r = node("Reshape", {linear(x, prefix + "." + proj), shape}, {}, prefix + ".heads");
      return node("Transpose", {r}, {Attribute::ofInts("perm", {0, 2, 1, 3})}, prefix + ".transpose");
    };
    // m cos + rotate_half(m) sin, rotate_half(m) = [-second half, first half].
    auto rotate = [&](const std::string& m) {
      std::vector<std::string> halves =
          nodeOutputs("Split", {m, constantInts(fmt::format("halves_{}", half), {2}, {half, half})},
                      {Attribute::ofInt("axis", -1)}, prefix + ".halves", 2);
      const std::string turned =
          node("Concat", {node("Neg", {halves[1]}, {}, prefix + ".rotate"), halves[0]},
               {Attribute::ofInt("axis", -1)}, prefix + ".rotate");
      return node("Add",
                  {node("Mul", {m, rotary.first}, {}, prefix + ".cos"),
                   node("Mul", {turned, rotary.second}, {}, prefix + ".sin")},
                  {}, prefix + ".rotary");
    };
    // [B, kv, T, d] -> [B, heads, T, d], each key/value head repeated for
    // its group of query heads, as the model widens them.
    auto widen = [&](const std::string& m) {
      if (kvHeads == heads) return m;
      const int64_t group = heads / kvHeads;
      const std::string grouped = node(
          "Expand",
          {node("Unsqueeze", {m, constantInts("axis_2", {1}, {2})}, {}, prefix + ".group"),
           constantInts(fmt::format("group_{}", group), {5}, {1, 1, group, 1, 1})},
          {}, prefix + ".group");
      return node("Reshape", {grouped, constantInts(fmt::format("widen_{}_{}", heads, d), {4}, {0, heads, -1, d})},
                  {}, prefix + ".widen");
    };
    const std::string q = rotate(perHead("q_proj", heads));
    const std::string k = widen(rotate(perHead("k_proj", kvHeads)));
    const std::string v = widen(perHead("v_proj", kvHeads));
    const std::string kT = node("Transpose", {k}, {Attribute::ofInts("perm", {0, 1, 3, 2})}, prefix + ".keys");
    const std::string y = mix(q, kT, v, d, prefix);
    return linear(node("Reshape", {y, constantInts(fmt::format("embd_{}", width), {3}, {0, 0, width})}, {},
                       prefix + ".merge"),
                  prefix + ".o_proj");
  }

  std::string silu(const std::string& x) override {
    return node("Mul", {x, node("Sigmoid", {x}, {}, "silu")}, {}, "silu");
  }

  std::string mul(const std::string& a, const std::string& b) override { return node("Mul", {a, b}, {}, "mul"); }

 private:
  // The token positions 0 .. T-1 of tokens [B, T], for the causal mask and
  // the rotary tables.
  void setPositions(const std::string& tokens) {
    const std::string shape = node("Shape", {tokens}, {}, "tokens_shape");
    const std::string time =
        node("Gather", {shape, int64Scalar("one_i64", 1)}, {Attribute::ofInt("axis", 0)}, "time");
    positions_ =
        node("Range", {int64Scalar("zero_i64", 0), time, int64Scalar("one_i64", 1)}, {}, "positions");
  }

  // Causal attention of q [B, H, T, d] over the transposed keys kT [B, H,
  // d, T] and the values v [B, H, T, d]: [B, T, H, d].
  std::string mix(const std::string& q, const std::string& kT, const std::string& v, int64_t d,
                  const std::string& prefix) {
    std::string att = node("MatMul", {q, kT}, {}, prefix + ".scores");
    att = node("Mul",
               {att, scalar(fmt::format("inv_sqrt_{}", d),
                            static_cast<float>(1.0 / std::sqrt(static_cast<double>(d))))},
               {}, prefix + ".scaled");
    att = node("Where", {futureMask(), scalar("neg_inf", -std::numeric_limits<float>::infinity()), att}, {},
               prefix + ".causal");
    att = node("Softmax", {att}, {Attribute::ofInt("axis", -1)}, prefix + ".softmax");
    const std::string y = node("MatMul", {att, v}, {}, prefix + ".mix");
    return node("Transpose", {y}, {Attribute::ofInts("perm", {0, 2, 1, 3})}, prefix + ".merge");
  }

  // A node with one output, named after `hint` and a counter.
  std::string node(const std::string& op, std::vector<std::string> inputs, std::vector<Attribute> attributes,
                   const std::string& hint) {
    return nodeOutputs(op, std::move(inputs), std::move(attributes), hint, 1)[0];
  }

  std::vector<std::string> nodeOutputs(const std::string& op, std::vector<std::string> inputs,
                                       std::vector<Attribute> attributes, const std::string& hint,
                                       int count) {
    onnx::Node n;
    n.opType = op;
    n.name = fmt::format("{}/{}_{}", hint, op, graph_.nodes.size());
    for (int k = 0; k < count; ++k)
      n.outputs.push_back(count == 1 ? n.name : fmt::format("{}:{}", n.name, k));
    n.inputs = std::move(inputs);
    n.attributes = std::move(attributes);
    graph_.nodes.push_back(std::move(n));
    return graph_.nodes.back().outputs;
  }

  // The trained tensor `name` as an initializer (once), its float32 bytes
  // copied as the file is written: from the model's tensor, or read from
  // the source when the first of them is asked for and given back after
  // the last, so that one tensor is held at a time.
  std::string init(const std::string& name) {
    if (added_.insert(name).second) {
      const at::Tensor& t = weight(name);
      onnx::Tensor out;
      out.name = name;
      out.type = onnx::DataType::kFloat;
      out.dims = onnxDims(t);
      out.size = static_cast<uint64_t>(t.numel()) * sizeof(float);
      if (source_ == nullptr) {
        out.fill = [t](uint64_t at, uint64_t n, char* dst) {
          std::memcpy(dst, static_cast<const char*>(t.data_ptr()) + at, n);
        };
      } else {
        auto held = std::make_shared<at::Tensor>();
        out.fill = [source = source_, name, held, size = out.size](uint64_t at, uint64_t n, char* dst) {
          if (!held->defined()) *held = source->load(name).to(torch::kFloat).contiguous();
          std::memcpy(dst, static_cast<const char*>(held->data_ptr()) + at, n);
          if (at + n == size) {
            held->reset();
            source->drop(name);
          }
        };
      }
      graph_.initializers.push_back(std::move(out));
    }
    return name;
  }

  std::string constant(const std::string& name, std::vector<int64_t> dims, const std::vector<float>& values) {
    if (added_.insert(name).second) {
      graph_.initializers.push_back(onnx::Tensor::floats(name, std::move(dims), values));
    }
    return name;
  }
  std::string constantInts(const std::string& name, std::vector<int64_t> dims,
                           const std::vector<int64_t>& values) {
    if (added_.insert(name).second) {
      graph_.initializers.push_back(onnx::Tensor::int64s(name, std::move(dims), values));
    }
    return name;
  }
  std::string scalar(const std::string& name, float v) { return constant(name, {}, {v}); }
  std::string int64Scalar(const std::string& name, int64_t v) { return constantInts(name, {}, {v}); }

  // [T, T] bool, true above the diagonal (a position's future), from the
  // positions of embed(): built once, for the graph's dynamic time axis.
  std::string futureMask() {
    if (future_.empty()) {
      const std::string rows =
          node("Unsqueeze", {positions_, constantInts("axis_1", {1}, {1})}, {}, "mask_rows");
      const std::string cols =
          node("Unsqueeze", {positions_, constantInts("axis_0", {1}, {0})}, {}, "mask_cols");
      future_ = node("Greater", {cols, rows}, {}, "future");
    }
    return future_;
  }

  onnx::Graph& graph_;
  ckpt::TensorSource* source_;
  std::set<std::string> added_;
  std::string positions_, future_;  // of the token input, for the causal mask
};

onnx::Dim onnxBatchDim(int64_t batch) { return batch > 0 ? onnx::Dim{batch, ""} : onnx::Dim{0, "batch"}; }

}  // namespace

void writeOnnx(const TrainedModel& m, int64_t batch, int64_t opset, const std::string& path) {
  Weights weights;
  if (m.model) {
    weights = exportWeights(*m.model);
  } else {
    for (const auto& [name, t] : m.weights->entries()) {
      if (!isTiedSecondName(m.job.model, name)) weights.emplace(name, t);
    }
  }
  onnx::Model model;
  model.opset = opset;
  model.producerVersion = version();
  model.docString = fmt::format("{} trained by cohort ({})", m.info.arch, m.info.weights);
  onnx::Graph& g = model.graph;
  g.name = m.info.arch;
  OnnxOps ops(weights, g, m.model ? nullptr : m.weights.get());
  const ModelInfo& info = m.info;
  if (info.tokens) {
    g.inputs.push_back({"tokens", onnx::DataType::kInt64, {onnxBatchDim(batch), {0, "time"}}});
    g.outputs.push_back(
        {"logits", onnx::DataType::kFloat, {onnxBatchDim(batch), {0, "time"}, {info.vocabSize, ""}}});
  } else {
    g.inputs.push_back({"pixels",
                        onnx::DataType::kFloat,
                        {onnxBatchDim(batch), {info.channels, ""}, {info.height, ""}, {info.width, ""}}});
    g.outputs.push_back({"logits", onnx::DataType::kFloat, {onnxBatchDim(batch), {info.numClasses, ""}}});
  }
  const std::string logits = describeForward(ops, m, g.inputs[0].name);
  // The last node writes the graph's output under its public name.
  for (auto& out : g.nodes.back().outputs) {
    if (out == logits) out = "logits";
  }
  size_t bytes = 0;
  for (const auto& t : g.initializers) bytes += t.fill ? t.size : t.raw.size();
  // A protobuf message is at most 2 GiB; larger models would need ONNX's
  // external data files, which cohort does not write.
  if (bytes > (size_t{2000} << 20)) {
    throw UsageError(
        fmt::format("{}: {} MiB of weights is past the 2 GiB an ONNX file holds without external "
                    "data, which cohort does not write; export it with --format torchscript",
                    m.info.weights, bytes >> 20));
  }
  model.metadata = {{kInfoMetadataKey, info.toJson().dump()}, {"opset", std::to_string(opset)}};
  if (info.text && !info.text->model().empty()) {
    model.metadata.emplace_back(kTokenizerExtraFile, base64Encode(info.text->model()));
  }
  // Streamed into the file: the initializers' bytes are read as they are
  // written, one tensor at a time.
  const std::filesystem::path target(path);
  if (target.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(target.parent_path(), ec);
    if (ec) throw IoError(fmt::format("cannot create directory {}: {}", target.parent_path().string(), ec.message()));
  }
  const onnx::Encoded encoded(model);
  ckpt::writeFileFrom(path, encoded.size(), [&](uint64_t at, uint64_t n, char* dst) { encoded.copy(at, n, dst); });
}

}  // namespace cohort::serve::detail
