// `cohort export --format torchscript`.
//
// How the module is produced: a torch::jit::Module is built in C++ with the
// model's tree of submodules, its trained tensors registered under their
// state-dict names, and a forward defined from TorchScript source that
// ScriptOps writes from the same description the ONNX graph comes from
// (graph_ops.cc). Tracing was the other way; LibTorch's C++ tracer records
// sizes read in C++ (the GPT's view(B, T, ...)) as constants, which would
// fix the batch and the sequence length. Source keeps every axis free, and
// the saved code is readable (module.code in Python).
//
// A model of arch torchscript is the user's own module: it is loaded again
// from model.path, given the trained tensors, and wrapped in a module whose
// forward normalizes the pixels and calls it (attribute "net").

#include <fmt/format.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "cohort/ckpt/mapped_tensors.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"
#include "serve/detail/exporters.h"
#include "serve/detail/graph_ops.h"

namespace cohort::serve::detail {

namespace {

std::vector<std::string> scriptNameParts(const std::string& name) {
  std::vector<std::string> out;
  std::stringstream in(name);
  for (std::string p; std::getline(in, p, '.');) out.push_back(p);
  return out;
}

bool isIndexPart(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

// A dotted state-dict name as a TorchScript expression on self:
// layer1.0.conv1.weight -> getattr(self.layer1, "0").conv1.weight.
std::string scriptRef(const std::string& name) {
  std::string e = "self";
  for (const auto& part : scriptNameParts(name))
    e = isIndexPart(part) ? fmt::format("getattr({}, \"{}\")", e, part) : e + "." + part;
  return e;
}

std::string scriptNumber(double v) { return fmt::format("{:.17g}", v); }

std::string scriptFloatList(const std::vector<double>& values) {
  std::string s = "[";
  for (size_t i = 0; i < values.size(); ++i) s += (i > 0 ? ", " : "") + scriptNumber(values[i]);
  return s + "]";
}

std::string scriptNormalize(const std::string& x, const std::vector<double>& mean,
                            const std::vector<double>& std) {
  return fmt::format(
      "(({}.to(6) / 255.0 - torch.tensor({}, dtype=6, device={}.device).view(1, -1, 1, 1))"
      " / torch.tensor({}, dtype=6, device={}.device).view(1, -1, 1, 1))",
      x, scriptFloatList(mean), x, scriptFloatList(std), x);
}

class ScriptOps : public Ops {
 public:
  using Ops::Ops;

  // The forward's body so far.
  const std::string& body() const { return body_; }

  std::string normalize(const std::string& x, const std::vector<double>& mean,
                        const std::vector<double>& std) override {
    return let(scriptNormalize(x, mean, std));
  }
  std::string conv(const std::string& x, const std::string& prefix, int64_t stride, int64_t pad) override {
    return let(fmt::format("torch.conv2d({}, {}, {}, [{}, {}], [{}, {}])", x, scriptRef(prefix + ".weight"),
                           optional(prefix + ".bias"), stride, stride, pad, pad));
  }
  std::string batchNorm(const std::string& x, const std::string& p) override {
    return let(fmt::format("torch.batch_norm({}, {}, {}, {}, {}, False, 0.1, 1e-05, False)", x,
                           scriptRef(p + ".weight"), scriptRef(p + ".bias"), scriptRef(p + ".running_mean"),
                           scriptRef(p + ".running_var")));
  }
  std::string relu(const std::string& x) override { return let(fmt::format("torch.relu({})", x)); }
  std::string maxPool(const std::string& x, int64_t k, int64_t s, int64_t p) override {
    return let(fmt::format("torch.max_pool2d({}, [{}, {}], [{}, {}], [{}, {}])", x, k, k, s, s, p, p));
  }
  std::string globalAveragePool(const std::string& x) override {
    return let(fmt::format("torch.flatten(torch.adaptive_avg_pool2d({}, [1, 1]), 1)", x));
  }
  std::string flatten(const std::string& x) override { return let(fmt::format("torch.flatten({}, 1)", x)); }
  std::string linear(const std::string& x, const std::string& prefix) override {
    return let(fmt::format("torch.linear({}, {}, {})", x, scriptRef(prefix + ".weight"),
                           optional(prefix + ".bias")));
  }
  std::string add(const std::string& a, const std::string& b) override {
    return let(fmt::format("{} + {}", a, b));
  }

  std::string embed(const std::string& tokens, const std::string& wte, const std::string& wpe) override {
    const std::string positions =
        let(fmt::format("torch.arange({0}.size(1), dtype=4, device={0}.device)", tokens));
    return let(fmt::format("torch.embedding({}, {}) + torch.embedding({}, {})", scriptRef(wte), tokens,
                           scriptRef(wpe), positions));
  }
  std::string layerNorm(const std::string& x, const std::string& p) override {
    return let(fmt::format("torch.layer_norm({}, [{}], {}, {}, 1e-05)", x, weight(p + ".weight").size(0),
                           scriptRef(p + ".weight"), optional(p + ".bias")));
  }
  std::string attention(const std::string& x, const std::string& prefix, int64_t heads) override {
    const int64_t c = weight(prefix + ".c_proj.weight").size(0), d = c / heads;
    const std::string b = let(fmt::format("{}.size(0)", x)), t = let(fmt::format("{}.size(1)", x));
    const std::string qkv = let(fmt::format("{}.split({}, 2)", linear(x, prefix + ".c_attn"), c));
    auto head = [&](int k) {
      return let(fmt::format("{}[{}].view({}, {}, {}, {}).transpose(1, 2)", qkv, k, b, t, heads, d));
    };
    const std::string q = head(0), k = head(1), v = head(2);
    return linear(causal(q, k, v, d, b, t, c), prefix + ".c_proj");
  }
  std::string gelu(const std::string& x, bool tanh) override {
    return let(tanh ? fmt::format("torch.gelu({}, approximate='tanh')", x) : fmt::format("torch.gelu({})", x));
  }
  std::string matmulTransposed(const std::string& x, const std::string& w) override {
    return let(fmt::format("torch.linear({}, {})", x, scriptRef(w)));
  }

  std::string embedTokens(const std::string& tokens, const std::string& wte) override {
    time_ = let(fmt::format("{}.size(1)", tokens));
    return let(fmt::format("torch.embedding({}, {})", scriptRef(wte), tokens));
  }
  std::string rmsNorm(const std::string& x, const std::string& p, double eps) override {
    // The mean of squares in float32 whatever x's dtype, as the model.
    const std::string f = let(fmt::format("{}.float()", x));
    return let(fmt::format("{} * ({} * torch.rsqrt({}.pow(2).mean(-1, keepdim=True) + {})).to({}.dtype)",
                           scriptRef(p + ".weight"), f, f, scriptNumber(eps), x));
  }
  std::pair<std::string, std::string> rotaryTables(const at::Tensor& cos, const at::Tensor& sin) override {
    // Buffers of the module (constants()), so that they follow it to a device.
    constants_.emplace_back("rope_cos", exportTensor(cos));
    constants_.emplace_back("rope_sin", exportTensor(sin));
    return {let(fmt::format("self.rope_cos.narrow(0, 0, {})", time_)),
            let(fmt::format("self.rope_sin.narrow(0, 0, {})", time_))};
  }
  std::string rotaryAttention(const std::string& x, const std::string& prefix, int64_t heads, int64_t kvHeads,
                              const std::pair<std::string, std::string>& rotary) override {
    const int64_t width = weight(prefix + ".q_proj.weight").size(0), d = width / heads, half = d / 2;
    const std::string b = let(fmt::format("{}.size(0)", x)), t = let(fmt::format("{}.size(1)", x));
    auto perHead = [&](const std::string& proj, int64_t n) {
      return let(fmt::format("{}.view({}, {}, {}, {}).transpose(1, 2)", linear(x, prefix + "." + proj), b, t, n, d));
    };
    auto rotate = [&](const std::string& m) {
      return let(fmt::format("{0} * {1} + torch.cat([-{0}.narrow(-1, {3}, {3}), {0}.narrow(-1, 0, {3})], -1) * {2}",
                             m, rotary.first, rotary.second, half));
    };
    auto widen = [&](const std::string& m) {
      if (kvHeads == heads) return m;
      return let(fmt::format("{}.unsqueeze(2).expand([{}, {}, {}, {}, {}]).reshape([{}, {}, {}, {}])", m, b, kvHeads,
                             heads / kvHeads, t, d, b, heads, t, d));
    };
    const std::string q = rotate(perHead("q_proj", heads));
    const std::string k = widen(rotate(perHead("k_proj", kvHeads)));
    const std::string v = widen(perHead("v_proj", kvHeads));
    return linear(causal(q, k, v, d, b, t, width), prefix + ".o_proj");
  }
  std::string silu(const std::string& x) override { return let(fmt::format("torch.silu({})", x)); }
  std::string mul(const std::string& a, const std::string& b) override {
    return let(fmt::format("{} * {}", a, b));
  }

  // Tensors the forward reads that are not the model's: to register as
  // buffers of the module under these names.
  const std::vector<std::pair<std::string, at::Tensor>>& constants() const { return constants_; }

 private:
  // Causal attention of q, k, v [b, H, t, d]: [b, t, width].
  std::string causal(const std::string& q, const std::string& k, const std::string& v, int64_t d,
                     const std::string& b, const std::string& t, int64_t width) {
    std::string att = let(fmt::format("torch.matmul({}, {}.transpose(-2, -1)) * {}", q, k,
                                      scriptNumber(1.0 / std::sqrt(static_cast<double>(d)))));
    const std::string future =
        let(fmt::format("torch.ones([{0}, {0}], dtype=11, device={1}.device).triu(1)", t, q));
    att = let(fmt::format("torch.softmax({}.masked_fill({}, float(\"-inf\")), -1)", att, future));
    return let(
        fmt::format("torch.matmul({}, {}).transpose(1, 2).contiguous().view({}, {}, {})", att, v, b, t, width));
  }

  std::string let(const std::string& expr) {
    const std::string v = fmt::format("v{}", next_++);
    body_ += fmt::format("    {} = {}\n", v, expr);
    return v;
  }
  std::string optional(const std::string& name) const { return has(name) ? scriptRef(name) : "None"; }

  std::string body_;
  int next_ = 0;
  std::string time_;  // the tokens' T, from embedTokens
  std::vector<std::pair<std::string, at::Tensor>> constants_;
};

// The submodule tree of the state dict's names, each tensor registered on
// its module (a buffer when the model holds it as one). Each module gets a
// class of its own, named after its path.
// Children and tensors keep the model's order, so the state dict lists
// them as the model's does.
struct ScriptTree {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::vector<std::string> order;  // of the children
  std::map<std::string, ScriptTree> children;

  ScriptTree& child(const std::string& name) {
    if (children.count(name) == 0) order.push_back(name);
    return children[name];
  }
};

torch::jit::Module buildScriptModule(const ScriptTree& tree, const std::string& path,
                                     const std::set<std::string>& buffers,
                                     const std::shared_ptr<torch::jit::CompilationUnit>& cu,
                                     const std::string& className) {
  std::string qualified = "__torch__.cohort_export." + className;
  if (!path.empty()) {
    std::string flat = path;
    for (char& ch : flat) ch = ch == '.' ? '_' : ch;
    qualified += "_" + flat;
  }
  torch::jit::Module m(c10::QualifiedName(qualified), cu);
  for (const auto& name : tree.order) {
    const ScriptTree& child = tree.children.at(name);
    m.register_module(
        name, buildScriptModule(child, path.empty() ? name : path + "." + name, buffers, cu, className));
  }
  for (const auto& [name, t] : tree.tensors) {
    const std::string full = path.empty() ? name : path + "." + name;
    m.register_parameter(name, t, /*is_buffer=*/buffers.count(full) > 0);
  }
  return m;
}

std::string scriptClassName(ModelArch arch) {
  switch (arch) {
    case ModelArch::simpleCnn:
      return "SimpleCnn";
    case ModelArch::gpt:
      return "Gpt";
    case ModelArch::llama:
      return "Llama";
    case ModelArch::torchscript:
      return "Normalized";
    default:
      return "ResNet";
  }
}

// Streamed into the file (no image of it in memory); the pages of a mapped
// tensor are given back once written out.
void saveScript(const torch::jit::Module& module, const ModelInfo& info, const std::string& path,
                const ckpt::MappedTensors* mapped) {
  torch::jit::ExtraFilesMap extra{{kInfoExtraFile, info.toJson().dump()}};
  // A SentencePiece model travels with the module: a served export has no
  // dataset to read it from.
  if (info.text && !info.text->model().empty()) extra.emplace(kTokenizerExtraFile, info.text->model());
  // A temporary name, fsync and rename: a reader never sees half a module.
  AtomicFile file(path);
  std::string error;
  // After a failed write the rest is only counted: LibTorch's zip writer
  // fails on a short write by throwing, and its destructor writes again
  // while that unwinds, which would end the process. The error is thrown
  // here once the serializer has returned; the temporary file goes.
  const auto writer = [&](const void* data, size_t n) -> size_t {
    if (!error.empty()) return n;
    try {
      file.write(data, n);
    } catch (const std::exception& e) {
      error = e.what();
      return n;
    }
    if (mapped != nullptr) mapped->release(data, n);
    return n;
  };
  try {
    torch::jit::ExportModule(module, writer, extra);
  } catch (const c10::Error& e) {
    if (!error.empty()) throw IoError(error);
    throw IoError(
        fmt::format("{}: cannot write the TorchScript module: {}", path, e.what_without_backtrace()));
  }
  if (!error.empty()) throw IoError(error);
  file.commit();
}

// arch torchscript: the user's module with the trained tensors, wrapped.
torch::jit::Module wrapUserModule(const TrainedModel& m) {
  torch::jit::Module user = torch::jit::load(m.job.model.path, torch::kCPU);
  const ckpt::StateDict trained = ckpt::stateDict(*m.model);
  std::map<std::string, at::Tensor> byName(trained.begin(), trained.end());
  torch::NoGradGuard noGrad;
  auto copyIn = [&](const std::string& name, const at::Tensor& into) {
    const auto it = byName.find(name);
    if (it == byName.end()) throw DataError(fmt::format("export: the trained model has no tensor {}", name));
    into.detach().copy_(it->second);
  };
  for (const auto& p : user.named_parameters()) copyIn(p.name, p.value);
  for (const auto& b : user.named_buffers()) copyIn(b.name, b.value);
  user.eval();
  torch::jit::Module root(c10::QualifiedName("__torch__.cohort_export.Normalized"),
                          user._ivalue()->compilation_unit(),
                          /*shouldMangle=*/true);
  root.register_module("net", user);
  const std::string in = m.info.tokens ? "tokens" : "pixels";
  root.define(fmt::format("def forward(self, {0}: Tensor) -> Tensor:\n    return self.net.forward({1})\n", in,
                          m.info.tokens ? in : scriptNormalize(in, m.info.mean, m.info.std)));
  return root;
}

bool onTmpfs(const std::string& dir) {
  struct statfs fs {};
  return ::statfs(dir.c_str(), &fs) == 0 && fs.f_type == TMPFS_MAGIC;
}

// Where the tensors are spilled: beside the output, unless that is memory
// (tmpfs), where the spilled pages could not be given back: /var/tmp then.
std::string spillDirectory(const std::string& path) {
  const std::filesystem::path target(path);
  const std::string dir = target.has_parent_path() ? target.parent_path().string() : std::string(".");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!onTmpfs(dir)) return dir;
  if (!onTmpfs("/var/tmp") && ::access("/var/tmp", W_OK) == 0) {
    log::info("export: {} is in memory (tmpfs): the tensors are spilled to /var/tmp instead", dir);
    return "/var/tmp";
  }
  log::warn("export: {} and /var/tmp are in memory (tmpfs): the spilled tensors stay resident", dir);
  return dir;
}

}  // namespace

void writeTorchScript(const TrainedModel& m, const std::string& path) {
  torch::NoGradGuard noGrad;
  std::unique_ptr<ckpt::MappedTensors> mapped;  // outlives the module, which holds views of it
  torch::jit::Module module;
  if (m.job.model.arch == ModelArch::torchscript) {
    module = wrapUserModule(m);
  } else {
    Weights weights;
    std::vector<std::string> order = m.order;
    std::set<std::string> buffers = m.buffers;
    if (m.model) {
      weights = exportWeights(*m.model);
      order.clear();
      for (const auto& entry : ckpt::stateDict(*m.model)) order.push_back(entry.first);
      for (const auto& b : m.model->named_buffers()) buffers.insert(b.key());
    } else {
      // A model no process holds: its tensors are read one at a time into a
      // file beside the module's, which the module's tensors map.
      std::vector<std::string> names;
      for (const auto& name : order) {
        if (!isTiedSecondName(m.job.model, name)) names.push_back(name);
      }
      mapped = std::make_unique<ckpt::MappedTensors>(*m.weights, names, spillDirectory(path), exportTensor);
      weights = mapped->tensors();
    }
    ScriptTree tree;
    for (const auto& name : order) {
      const auto it = weights.find(name);
      if (it == weights.end()) continue;  // a LoRA adapter, merged into its layer; the tied head
      std::vector<std::string> parts = scriptNameParts(name);
      ScriptTree* node = &tree;
      for (size_t i = 0; i + 1 < parts.size(); ++i) node = &node->child(parts[i]);
      node->tensors.emplace_back(parts.back(), it->second);
    }
    module = buildScriptModule(tree, "", buffers, std::make_shared<torch::jit::CompilationUnit>(),
                               scriptClassName(m.job.model.arch));
    const std::string input = m.info.tokens ? "tokens" : "pixels";
    ScriptOps ops(weights);
    const std::string out = describeForward(ops, m, input);
    for (const auto& [name, t] : ops.constants()) module.register_buffer(name, t);
    module.define(
        fmt::format("def forward(self, {}: Tensor) -> Tensor:\n{}    return {}\n", input, ops.body(), out));
  }
  module.eval();
  saveScript(module, m.info, path, mapped.get());
}

}  // namespace cohort::serve::detail
