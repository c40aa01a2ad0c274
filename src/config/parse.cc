// Job file parsing: YAML -> JobConfig through the schema, with --set
// overrides applied to the YAML tree first, so both go through the same checks
// and every message names where the value came from.

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>
#include <type_traits>

#include "cohort/config/load.h"
#include "cohort/config/step_range.h"
#include "cohort/core/error.h"
#include "cohort/core/text.h"
#include "config/detail/did_you_mean.h"
#include "config/detail/model_checks.h"
#include "config/detail/schema.h"

namespace fs = std::filesystem;

namespace cohort {
namespace detail {

void fail(const std::string& where, const std::string& path, const std::string& msg) {
  throw ConfigError(fmt::format("{}: {}: {}", where, path, msg));
}

namespace {

// Where each key's value came from: "file:line:column" or "--set k=v".
struct Source {
  std::string origin;
  std::map<std::string, std::string> overrides;  // key path -> "--set key.path=value"

  std::string locate(const YAML::Node& n, const std::string& path) const {
    for (const auto& [key, text] : overrides) {
      if (path == key || path.rfind(key + ".", 0) == 0) return text;
    }
    const YAML::Mark m = n.Mark();
    if (m.is_null()) return origin;
    return fmt::format("{}:{}:{}", origin, m.line + 1, m.column + 1);
  }
};

using Locations = std::map<std::string, std::string>;

std::string describeNode(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Scalar: return fmt::format("'{}'", n.Scalar());
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Null: return "nothing";
    default: return "an undefined value";
  }
}


bool parseInt(const std::string& s, int64_t& out) {
  const char* b = s.data();
  const char* e = s.data() + s.size();
  if (b != e && *b == '+') ++b;
  auto r = std::from_chars(b, e, out);
  return r.ec == std::errc() && r.ptr == e && b != e;
}

bool parseDouble(const std::string& s, double& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtod(s.c_str(), &end);
  return errno == 0 && end == s.c_str() + s.size() && std::isfinite(out);
}

bool parseBool(const std::string& s, bool& out) {
  const std::string l = lowerAscii(s);
  if (l == "true" || l == "yes" || l == "on") return out = true, true;
  if (l == "false" || l == "no" || l == "off") return out = false, true;
  return false;
}

void convert(const YAML::Node& n, int64_t& v, const std::string& where, const std::string& path) {
  if (!n.IsScalar() || !parseInt(n.Scalar(), v)) {
    fail(where, path, fmt::format("expected an integer, got {}", describeNode(n)));
  }
}
void convert(const YAML::Node& n, double& v, const std::string& where, const std::string& path) {
  if (!n.IsScalar() || !parseDouble(n.Scalar(), v)) {
    fail(where, path, fmt::format("expected a number, got {}", describeNode(n)));
  }
}
void convert(const YAML::Node& n, bool& v, const std::string& where, const std::string& path) {
  if (!n.IsScalar() || !parseBool(n.Scalar(), v)) {
    fail(where, path, fmt::format("expected true or false, got {}", describeNode(n)));
  }
}
void convert(const YAML::Node& n, std::string& v, const std::string& where, const std::string& path) {
  if (!n.IsScalar()) fail(where, path, fmt::format("expected a string, got {}", describeNode(n)));
  v = n.Scalar();
}
// A choice (config/choices.h): its name, looked up once here. An empty value
// (`key:`) is the name "", which no choice has.
template <class E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
void convert(const YAML::Node& n, E& v, const std::string& where, const std::string& path) {
  const std::vector<std::string> names = choiceNames<E>();
  const std::string list = fmt::format("{}", fmt::join(names, ", "));
  if (!n.IsScalar() && !n.IsNull()) {
    fail(where, path, fmt::format("expected one of: {}, got {}", list, describeNode(n)));
  }
  const std::string name = n.IsNull() ? std::string() : n.Scalar();
  if (const std::optional<E> e = choiceFromName<E>(name)) {
    v = *e;
    return;
  }
  const std::string hint = closestMatch(name, names);
  fail(where, path,
       fmt::format("'{}' is not one of: {}{}", name, list,
                   hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint)));
}
template <class T>
void convert(const YAML::Node& n, std::vector<T>& v, const std::string& where, const std::string& path) {
  if (!n.IsSequence()) fail(where, path, fmt::format("expected a list, got {}", describeNode(n)));
  v.clear();
  size_t i = 0;
  for (const auto& item : n) {
    T x{};
    convert(item, x, where, fmt::format("{}[{}]", path, i++));
    v.push_back(x);
  }
}

// distribution.pipeline.split: `auto`, or a list of blocks per stage.
void convert(const YAML::Node& n, PipelineSplit& v, const std::string& where, const std::string& path) {
  if (n.IsScalar() && n.Scalar() == "auto") {
    v.blocks.clear();
    return;
  }
  if (!n.IsSequence()) {
    fail(where, path,
         fmt::format("expected auto or a list of blocks per stage (e.g. [3, 5]), got {}", describeNode(n)));
  }
  convert(n, v.blocks, where, path);
  if (v.blocks.empty()) fail(where, path, "expected auto or a list of blocks per stage, got an empty list");
}

std::string formatNumber(double x) { return fmt::format("{}", x); }

void checkRange(double x, const Rule& r, const std::string& where, const std::string& path) {
  if (r.min) {
    if (r.minExclusive ? !(x > *r.min) : !(x >= *r.min)) {
      fail(where, path, fmt::format("must be {} {}, got {}", r.minExclusive ? ">" : ">=",
                                    formatNumber(*r.min), formatNumber(x)));
    }
  }
  if (r.max && !(x <= *r.max)) {
    fail(where, path, fmt::format("must be <= {}, got {}", formatNumber(*r.max), formatNumber(x)));
  }
}

void check(int64_t v, const Rule& r, const std::string& w, const std::string& p) {
  checkRange(static_cast<double>(v), r, w, p);
}
void check(double v, const Rule& r, const std::string& w, const std::string& p) { checkRange(v, r, w, p); }
void check(bool, const Rule&, const std::string&, const std::string&) {}
void check(const PipelineSplit& v, const Rule&, const std::string& w, const std::string& p) {
  for (size_t i = 0; i < v.blocks.size(); ++i) {
    checkRange(static_cast<double>(v.blocks[i]), atLeast(1), w, fmt::format("{}[{}]", p, i));
  }
}
void check(const std::string&, const Rule&, const std::string&, const std::string&) {}
template <class E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
void check(E, const Rule&, const std::string&, const std::string&) {}
template <class T>
void check(const std::vector<T>& v, const Rule& r, const std::string& w, const std::string& p) {
  for (size_t i = 0; i < v.size(); ++i) check(v[i], r, w, fmt::format("{}[{}]", p, i));
}

class Parser {
 public:
  Parser(const Source& src, const YAML::Node& root, Locations& locs) : src_(src), locs_(locs) {
    frames_.push_back(Frame{root, "", {}});
  }

  template <class T>
  void field(const char* key, T& value, const char* /*doc*/, const Rule& rule = {}) {
    Frame& f = frames_.back();
    f.known.push_back(key);
    const std::string path = join(f.path, key);
    const YAML::Node n = child(f.node, key);
    if (!n.IsDefined()) {
      locs_[path] = src_.origin;
      return;
    }
    const std::string where = src_.locate(n, path);
    locs_[path] = where;
    if (n.IsNull()) {
      // An empty value: an empty string, and for a choice, a name none has.
      if constexpr (std::is_same_v<T, std::string>) value.clear();
      if constexpr (std::is_enum_v<T>) convert(n, value, where, path);
      return;
    }
    convert(n, value, where, path);
    check(value, rule, where, path);
  }

  template <class S>
  void section(const char* key, S& value, const char* /*doc*/) {
    Frame& f = frames_.back();
    f.known.push_back(key);
    const std::string path = join(f.path, key);
    const YAML::Node n = child(f.node, key);
    const std::string where = n.IsDefined() ? src_.locate(n, path) : src_.origin;
    locs_[path] = where;
    if (n.IsDefined() && !n.IsNull() && !n.IsMap()) {
      fail(where, path, fmt::format("expected a mapping of keys, got {}", describeNode(n)));
    }
    frames_.push_back(Frame{n, path, {}});
    describe(*this, value);
    rejectUnknownKeys();
    frames_.pop_back();
  }

  void rejectUnknownKeys() {
    const Frame& f = frames_.back();
    if (!f.node.IsDefined() || !f.node.IsMap()) return;
    std::map<std::string, std::string> seen;  // key -> where it first stands
    for (auto it = f.node.begin(); it != f.node.end(); ++it) {
      const std::string key = it->first.Scalar();
      const std::string where = src_.locate(it->first, join(f.path, key));
      auto [first, fresh] = seen.emplace(key, where);
      if (!fresh) {
        // yaml-cpp keeps both and reads the first: a silent surprise.
        throw ConfigError(fmt::format("{}: duplicate key '{}'{} (first at {})", where, key,
                                      f.path.empty() ? "" : fmt::format(" in '{}'", f.path),
                                      first->second));
      }
      bool ok = false;
      for (const auto& k : f.known) ok = ok || k == key;
      if (ok) continue;
      const std::string path = join(f.path, key);
      std::string hint = closestMatch(key, f.known);
      throw ConfigError(fmt::format(
          "{}: unknown key '{}'{}{}", src_.locate(it->first, path), key,
          f.path.empty() ? "" : fmt::format(" in '{}'", f.path),
          hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint)));
    }
  }

 private:
  struct Frame {
    YAML::Node node;
    std::string path;
    std::vector<std::string> known;
  };

  static std::string join(const std::string& prefix, const std::string& key) {
    return prefix.empty() ? key : prefix + "." + key;
  }
  static YAML::Node child(const YAML::Node& parent, const char* key) {
    if (!parent.IsDefined() || !parent.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node& p = parent;
    return p[key];
  }

  const Source& src_;
  Locations& locs_;
  std::vector<Frame> frames_;
};

// Applies "a.b.c=value" to the YAML tree, creating sections as needed.
void applyOverride(YAML::Node& root, const std::string& text, Source& src) {
  const size_t eq = text.find('=');
  const std::string option = "--set " + text;
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError(fmt::format("{}: expected key.path=value", option));
  }
  const std::string path = text.substr(0, eq);
  const std::string value = text.substr(eq + 1);
  std::vector<std::string> keys;
  std::stringstream ss(path);
  for (std::string k; std::getline(ss, k, '.');) {
    if (k.empty()) throw ConfigError(fmt::format("{}: empty key in '{}'", option, path));
    keys.push_back(k);
  }
  if (path.back() == '.') throw ConfigError(fmt::format("{}: empty key in '{}'", option, path));

  YAML::Node parsed;
  try {
    parsed = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}: cannot parse the value: {}", option, e.msg));
  }

  YAML::Node cur = root;
  std::string walked;
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    walked = walked.empty() ? keys[i] : walked + "." + keys[i];
    YAML::Node next = cur[keys[i]];
    if (next.IsNull() || !next.IsDefined()) {
      cur[keys[i]] = YAML::Node(YAML::NodeType::Map);
      next = cur[keys[i]];
    } else if (!next.IsMap()) {
      throw ConfigError(fmt::format("{}: '{}' is a value, not a section", option, walked));
    }
    cur.reset(next);
  }
  cur[keys.back()] = parsed;
  src.overrides[path] = option;
}

fs::path absolutePath(const std::string& p) {
  std::error_code ec;
  fs::path a = fs::absolute(p, ec);
  return ec ? fs::path(p) : a.lexically_normal();
}

// Checks across keys, after every key parsed on its own.
void validate(JobConfig& job, const Locations& locs, const std::string& origin) {
  auto where = [&](const std::string& path) {
    auto it = locs.find(path);
    return it == locs.end() ? origin : it->second;
  };

  for (char c : job.name) {
    if (!isNameChar(c)) {
      fail(where("name"), "name",
           fmt::format("'{}' may only contain letters, digits, '-', '_' and '.'", job.name));
    }
  }
  if (job.name.empty()) fail(where("name"), "name", "must not be empty");

  auto checkDataset = [&](DatasetConfig& d, const std::string& prefix, bool required) {
    if (d.kind == DataKind::none) {
      if (required) {
        fail(where(prefix + ".kind"), prefix + ".kind",
             "training data is required (kind: idx, synthetic, shards or tokens)");
      }
      return;
    }
    if (d.kind == DataKind::idx) {
      for (auto [member, key] : {std::pair<std::string*, const char*>{&d.images, "images"},
                                 {&d.labels, "labels"}}) {
        const std::string path = prefix + "." + key;
        if (member->empty()) fail(where(path), path, "is required for kind: idx");
        fs::path abs = absolutePath(*member);
        std::error_code ec;
        if (!fs::is_regular_file(abs, ec)) {
          throw DataError(fmt::format("{}: {}: data file not found: {}", where(path), path,
                                      abs.string()));
        }
        *member = abs.string();
      }
    }
    if (d.kind == DataKind::textClasses) {
      for (auto [member, key] : {std::pair<std::string*, const char*>{&d.path, "path"}, {&d.tokenizer, "tokenizer"}}) {
        const std::string path = prefix + "." + key;
        if (member->empty()) fail(where(path), path, "is required for kind: text_classes");
        fs::path abs = absolutePath(*member);
        std::error_code ec;
        if (!fs::exists(abs, ec)) {
          throw DataError(fmt::format("{}: {}: not found: {}", where(path), path, abs.string()));
        }
        *member = abs.string();
      }
    } else if (!d.tokenizer.empty()) {
      fail(where(prefix + ".tokenizer"), prefix + ".tokenizer",
           fmt::format("is for kind: text_classes (kind: {} data carries its own tokenizer, or none)",
                       choiceName(d.kind)));
    }
    if (d.kind == DataKind::shards || d.kind == DataKind::tokens) {
      const std::string path = prefix + ".path";
      if (d.path.empty()) {
        fail(where(path), path, fmt::format("is required for kind: {}", choiceName(d.kind)));
      }
      if (d.path.find("://") == std::string::npos) {
        fs::path abs = absolutePath(d.path);
        std::error_code ec;
        if (!fs::is_regular_file(abs / "dataset.json", ec)) {
          throw DataError(fmt::format(
              "{}: {}: no packed dataset at {} (dataset.json is missing; make one with `cohort "
              "data {}`)",
              where(path), path, abs.string(), d.kind == DataKind::tokens ? "tokenize" : "pack"));
        }
        d.path = abs.string();
      }
    }
    const AugmentConfig& a = d.augment;
    for (auto [range, key, lo, hi] :
         {std::tuple<const std::vector<double>*, const char*, double, double>{&a.scale, "scale", 0.0, 1.0},
          {&a.ratio, "ratio", 0.0, 1e6}}) {
      const std::string path = prefix + ".augment." + key;
      if (range->size() != 2 || !((*range)[0] > lo) || !((*range)[0] <= (*range)[1]) ||
          !((*range)[1] <= hi)) {
        fail(where(path), path,
             fmt::format("expected [min, max] with {} < min <= max <= {}", lo, hi == 1e6 ? "inf" : "1"));
      }
    }
    if (d.kind == DataKind::synthetic) {
      if (d.shape.size() != 3) {
        fail(where(prefix + ".shape"), prefix + ".shape",
             fmt::format("expected [channels, height, width], got {} values", d.shape.size()));
      }
      for (int64_t s : d.shape) {
        if (s < 1 || s > 65536) {
          fail(where(prefix + ".shape"), prefix + ".shape",
               fmt::format("each size must be in [1, 65536], got {}", s));
        }
      }
    }
    if (d.mean.size() != d.std.size()) {
      fail(where(prefix + ".std"), prefix + ".std",
           fmt::format("has {} values but mean has {}", d.std.size(), d.mean.size()));
    }
    for (double s : d.std) {
      if (!(s > 0)) fail(where(prefix + ".std"), prefix + ".std", "values must be > 0");
    }
  };
  checkDataset(job.data.train, "data.train", true);
  checkDataset(job.data.eval, "data.eval", false);

  // A language model reads token windows, and only a language model does;
  // a text classifier reads labelled texts, and only it does; a TorchScript
  // module reads what the training data holds.
  const ModelArch arch = job.model.arch;
  const bool languageModel = tokenModel(job), texts = textClassifier(job);
  for (auto [d, prefix] : {std::pair<const DatasetConfig*, const char*>{&job.data.train, "data.train"},
                           {&job.data.eval, "data.eval"}}) {
    if (d->kind == DataKind::none) continue;
    if ((d->kind == DataKind::tokens) == languageModel && (d->kind == DataKind::textClasses) == texts) continue;
    const std::string path = std::string(prefix) + ".kind";
    fail(where(path), path,
         arch == ModelArch::torchscript
             ? fmt::format("{} data cannot evaluate a model trained on {} data", choiceName(d->kind),
                           choiceName(job.data.train.kind))
         : languageModel ? fmt::format("model.arch {} trains on token data (kind: tokens), not {}",
                                       choiceName(arch), choiceName(d->kind))
         : texts ? fmt::format("model.arch bert with model.task classify trains on labelled texts (kind: "
                               "text_classes), not {}",
                               choiceName(d->kind))
         : d->kind == DataKind::textClasses
             ? fmt::format("kind text_classes is for model.arch bert with model.task classify, not {}",
                           choiceName(arch))
             : fmt::format("kind tokens is for model.arch gpt, llama, bert or torchscript, not {}",
                           choiceName(arch)));
  }
  if (job.model.recompute == Recompute::blocks &&
      (arch == ModelArch::simpleCnn || arch == ModelArch::torchscript)) {
    fail(where("model.recompute"), "model.recompute",
         fmt::format("blocks is for the gpt and ResNet models; {} has no blocks cohort knows of",
                     choiceName(arch)));
  }
  if (job.output.weightsFormat == WeightsFormat::safetensors && job.security.encryption.finalModel) {
    fail(where("output.weights_format"), "output.weights_format",
         "safetensors files cannot be encrypted, and security.encryption.final_model is true: use pt, "
         "or leave the final weights unencrypted");
  }
  if (job.model.activation != Activation::gelu && arch != ModelArch::gpt) {
    fail(where("model.activation"), "model.activation",
         fmt::format("is for model.arch gpt, not {}", choiceName(arch)));
  }
  if (arch == ModelArch::torchscript && job.model.path.empty()) {
    fail(where("model.arch"), "model.path", "model.arch torchscript needs the module's file in model.path");
  }
  if (arch != ModelArch::torchscript && !job.model.path.empty()) {
    fail(where("model.path"), "model.path", "is for model.arch torchscript");
  }
  if (job.model.lora.rank > 0) {
    if (!decoderArch(arch)) {
      fail(where("model.lora.rank"), "model.lora.rank",
           fmt::format("LoRA adapts the gpt and llama models' layers, not {}", choiceName(arch)));
    }
    if (job.model.lora.targets.empty()) {
      fail(where("model.lora.targets"), "model.lora.targets", "names no layer to adapt");
    }
  }
  const DistributionConfig& dist = job.distribution;
  if (dist.zero >= 2 && dist.compression != GradCompression::none) {
    fail(where("distribution.compression"), "distribution.compression",
         fmt::format("is not applied by distribution.zero {}, whose reduce-scatter sends float32; "
                     "use none, or zero 0 or 1",
                     dist.zero));
  }
  checkPipeline(job, where);
  checkTensor(job, where);
  const ElasticConfig& el = job.elastic;
  for (auto [a, b, keyA, keyB] :
       {std::tuple<const std::string*, const std::string*, const char*, const char*>{
            &el.etcdCertFile, &el.etcdKeyFile, "elastic.etcd_cert_file", "elastic.etcd_key_file"},
        {&el.etcdKeyFile, &el.etcdCertFile, "elastic.etcd_key_file", "elastic.etcd_cert_file"},
        {&el.etcdUser, &el.etcdPasswordFile, "elastic.etcd_user", "elastic.etcd_password_file"},
        {&el.etcdPasswordFile, &el.etcdUser, "elastic.etcd_password_file", "elastic.etcd_user"}}) {
    if (!a->empty() && b->empty()) fail(where(keyA), keyA, fmt::format("needs {} too", keyB));
  }
  if (job.output.mergeLora && job.model.lora.rank == 0) {
    fail(where("output.merge_lora"), "output.merge_lora", "needs LoRA adapters (model.lora.rank > 0)");
  }
  checkModelSizes(job, where);

  for (auto [file, key] : {std::pair<std::string*, const char*>{&job.model.initFrom, "model.init_from"},
                           {&job.model.path, "model.path"}}) {
    if (file->empty()) continue;
    fs::path abs = absolutePath(*file);
    std::error_code ec;
    // A gpt's weights may be a Hugging Face directory (config.json beside them).
    const bool hfDir = file == &job.model.initFrom && (decoderArch(arch) || arch == ModelArch::bert) &&
                       fs::is_directory(abs, ec) &&
                       fs::is_regular_file(abs / "config.json", ec);
    if (!fs::is_regular_file(abs, ec) && !hfDir) {
      throw DataError(fmt::format("{}: {}: file not found: {}", where(key), key, abs.string()));
    }
    *file = abs.string();
  }

  const auto& opt = job.training.optimizer;
  if (opt.betas.size() != 2) {
    fail(where("training.optimizer.betas"), "training.optimizer.betas",
         fmt::format("expected [beta1, beta2], got {} values", opt.betas.size()));
  }
  for (double b : opt.betas) {
    if (!(b >= 0 && b < 1)) {
      fail(where("training.optimizer.betas"), "training.optimizer.betas",
           fmt::format("values must be in [0, 1), got {}", b));
    }
  }
  if (opt.nesterov && !(opt.momentum > 0)) {
    fail(where("training.optimizer.nesterov"), "training.optimizer.nesterov",
         "needs momentum > 0");
  }
  const auto& ms = job.training.schedule.milestones;
  for (size_t i = 0; i < ms.size(); ++i) {
    if (ms[i] < 0 || (i > 0 && ms[i] <= ms[i - 1])) {
      fail(where("training.schedule.milestones"), "training.schedule.milestones",
           "must be non-negative and increasing");
    }
  }
  if (job.training.precision == Precision::fp16) {
#ifndef COHORT_WITH_CUDA
    fail(where("training.precision"), "training.precision",
         "fp16 needs a CUDA build of cohort (cmake -DCOHORT_WITH_CUDA=ON): LibTorch's CPU autocast "
         "has no float16; on a CPU use bf16");
#endif
  }
  if (job.training.lossScale.minScale > job.training.lossScale.maxScale) {
    fail(where("training.loss_scale.min_scale"), "training.loss_scale.min_scale",
         "must not be above max_scale");
  }
  if (job.distribution.backend == Backend::nccl) {
#ifndef COHORT_WITH_CUDA
    fail(where("distribution.backend"), "distribution.backend",
         "nccl needs a CUDA build of cohort (cmake -DCOHORT_WITH_CUDA=ON)");
#endif
  }
  if (!job.checkpoint.dir.empty()) job.checkpoint.dir = absolutePath(job.checkpoint.dir).string();
  if (!job.checkpoint.remote.empty() && job.checkpoint.remote.find("://") == std::string::npos) {
    job.checkpoint.remote = absolutePath(job.checkpoint.remote).string();
  }
  if (job.output.dir.empty()) fail(where("output.dir"), "output.dir", "must not be empty");
  if (!job.output.profile.empty()) {
    try {
      parseStepRange(job.output.profile);
    } catch (const ConfigError& e) {
      fail(where("output.profile"), "output.profile", e.what());
    }
  }
  job.output.dir = absolutePath(job.output.dir).string();
}

JobConfig parseTree(YAML::Node root, Source& src, const std::vector<std::string>& overrides) {
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) {
    throw ConfigError(fmt::format("{}: expected a mapping of keys at the top level, got {}",
                                  src.locate(root, ""), describeNode(root)));
  }
  for (const auto& o : overrides) applyOverride(root, o, src);
  JobConfig job;
  Locations locs;
  Parser parser(src, root, locs);
  describe(parser, job);
  parser.rejectUnknownKeys();
  validate(job, locs, src.origin);
  return job;
}

}  // namespace
}  // namespace detail

JobConfig loadJobFromString(const std::string& yaml, const std::string& origin,
                            const std::vector<std::string>& overrides) {
  detail::Source src{origin, {}};
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(fmt::format("{}:{}:{}: YAML syntax error: {}", origin, e.mark.line + 1,
                                  e.mark.column + 1, e.msg));
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}: YAML error: {}", origin, e.msg));
  }
  try {
    return detail::parseTree(root, src, overrides);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}: YAML error: {}", origin, e.msg));
  }
}

JobConfig loadJob(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    throw ConfigError(fmt::format("job file not found: {}", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("cannot read job file: {}", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return loadJobFromString(ss.str(), path, overrides);
}

void checkRanks(const JobConfig& job, int64_t ranks) {
  const int64_t stages = job.distribution.pipeline.stages;
  const int64_t tensor = job.distribution.tensor;
  if (ranks % (stages * tensor) != 0) {
    throw ConfigError(fmt::format(
        "distribution.tensor: {} tensor ranks x {} pipeline stages do not divide the job's {} ranks "
        "(ranks = data replicas x stages x tensor: start a multiple of {})",
        tensor, stages, ranks, stages * tensor));
  }
  if (ranks % stages != 0) {
    throw ConfigError(fmt::format(
        "distribution.pipeline.stages: {} stages do not divide the job's {} ranks (each data "
        "replica holds one rank per stage: start a multiple of {})",
        stages, ranks, stages));
  }
}

}  // namespace cohort
