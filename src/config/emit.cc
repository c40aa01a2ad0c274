// The resolved job as YAML, the key list for documentation, and the job hash,
// all walking the same schema as the parser.

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "cohort/config/load.h"
#include "config/detail/schema.h"

namespace cohort {
namespace detail {
namespace {

std::string scalarText(int64_t v) { return std::to_string(v); }
std::string scalarText(double v) {
  std::string s = fmt::format("{}", v);
  // Keep a float recognisable as one in the emitted YAML.
  if (s.find_first_of(".eE") == std::string::npos && s.find("inf") == std::string::npos) s += ".0";
  return s;
}
std::string scalarText(bool v) { return v ? "true" : "false"; }

class Emitter {
 public:
  explicit Emitter(YAML::Emitter& out) : out_(out) {}

  template <class T>
  void field(const char* key, T& value, const char*, const Rule& = {}) {
    out_ << YAML::Key << key << YAML::Value;
    emit(value);
  }
  template <class S>
  void section(const char* key, S& value, const char*) {
    out_ << YAML::Key << key << YAML::Value << YAML::BeginMap;
    describe(*this, value);
    out_ << YAML::EndMap;
  }

 private:
  template <class T>
  void emit(const T& v) {
    if constexpr (std::is_same_v<T, std::string>) {
      if (v.empty()) {
        out_ << YAML::DoubleQuoted << "";
      } else {
        out_ << v;
      }
    } else if constexpr (std::is_enum_v<T>) {
      out_ << std::string(choiceName(v));
    } else {
      out_ << scalarText(v);
    }
  }
  void emit(const PipelineSplit& v) {
    if (v.automatic()) {
      out_ << "auto";
    } else {
      emit(v.blocks);
    }
  }
  template <class T>
  void emit(const std::vector<T>& v) {
    out_ << YAML::Flow << YAML::BeginSeq;
    for (const auto& x : v) emit(x);
    out_ << YAML::EndSeq;
  }

  YAML::Emitter& out_;
};

template <class T>
std::string typeName(const T&) {
  if constexpr (std::is_same_v<T, int64_t>) return "int";
  if constexpr (std::is_same_v<T, double>) return "float";
  if constexpr (std::is_same_v<T, bool>) return "bool";
  if constexpr (std::is_same_v<T, std::string> || std::is_enum_v<T>) return "string";
  if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "list of int";
  if constexpr (std::is_same_v<T, std::vector<double>>) return "list of float";
  if constexpr (std::is_same_v<T, std::vector<std::string>>) return "list of string";
  if constexpr (std::is_same_v<T, PipelineSplit>) return "auto or list of int";
  return "?";
}

template <class T>
std::string defaultText(const T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    return v.empty() ? "\"\"" : v;
  } else if constexpr (std::is_enum_v<T>) {
    return std::string(choiceName(v));
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>> ||
                       std::is_same_v<T, std::vector<double>>) {
    std::vector<std::string> parts;
    for (auto x : v) parts.push_back(scalarText(x));
    return fmt::format("[{}]", fmt::join(parts, ", "));
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    return fmt::format("[{}]", fmt::join(v, ", "));
  } else if constexpr (std::is_same_v<T, PipelineSplit>) {
    return v.automatic() ? std::string("auto") : defaultText(v.blocks);
  } else {
    return scalarText(v);
  }
}

class Lister {
 public:
  std::vector<KeyDoc> keys;

  template <class T>
  void field(const char* key, T& value, const char* doc, const Rule& = {}) {
    std::string description = doc;
    if constexpr (std::is_enum_v<T>) {
      description += fmt::format(" One of: {}.", fmt::join(choiceNames<T>(), ", "));
    }
    keys.push_back(KeyDoc{path(key), typeName(value), defaultText(value), description});
  }
  template <class S>
  void section(const char* key, S& value, const char*) {
    prefix_.push_back(key);
    describe(*this, value);
    prefix_.pop_back();
  }

 private:
  std::string path(const char* key) const {
    std::string p;
    for (const auto& s : prefix_) p += s + ".";
    return p + key;
  }
  std::vector<std::string> prefix_;
};

}  // namespace
}  // namespace detail

std::string toYaml(const JobConfig& job) {
  JobConfig copy = job;  // the visitor interface takes mutable references
  takeUrlCredentials(copy);
  YAML::Emitter out;
  out << YAML::BeginMap;
  detail::Emitter e(out);
  detail::describe(e, copy);
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::string jobHash(const JobConfig& job) {
  // Keys that only change how the run is watched are left out, so a rerun
  // with --timeline or another stall threshold still resumes the run.
  JobConfig hashed = job;
  const JobConfig defaults;
  hashed.output.progress = defaults.output.progress;
  hashed.output.tensorboard = defaults.output.tensorboard;
  hashed.output.timeline = defaults.output.timeline;
  hashed.output.profile = defaults.output.profile;
  hashed.output.metricsPort = defaults.output.metricsPort;
  hashed.output.metricsHost = defaults.output.metricsHost;
  hashed.output.metricsTokenFile = defaults.output.metricsTokenFile;
  hashed.output.metricsTlsCert = defaults.output.metricsTlsCert;
  hashed.output.metricsTlsKey = defaults.output.metricsTlsKey;
  hashed.distribution.heartbeatS = defaults.distribution.heartbeatS;
  hashed.distribution.stallWarnS = defaults.distribution.stallWarnS;
  hashed.distribution.stallTimeoutS = defaults.distribution.stallTimeoutS;
  hashed.distribution.stragglerFactor = defaults.distribution.stragglerFactor;
  // How membership is watched, not what is trained (batch_policy stays).
  hashed.elastic.lastCallS = defaults.elastic.lastCallS;
  hashed.elastic.nodeTimeoutS = defaults.elastic.nodeTimeoutS;
  hashed.elastic.belowMinTimeoutS = defaults.elastic.belowMinTimeoutS;
  hashed.elastic.rdzvTimeoutS = defaults.elastic.rdzvTimeoutS;
  hashed.elastic.stateDir = defaults.elastic.stateDir;
  // How a node reaches etcd, which may differ per node (its own certificate).
  hashed.elastic.etcdCaFile = defaults.elastic.etcdCaFile;
  hashed.elastic.etcdCertFile = defaults.elastic.etcdCertFile;
  hashed.elastic.etcdKeyFile = defaults.elastic.etcdKeyFile;
  hashed.elastic.etcdUser = defaults.elastic.etcdUser;
  hashed.elastic.etcdPasswordFile = defaults.elastic.etcdPasswordFile;
  // How a rank computes, not what: the same training either way.
  hashed.compute = defaults.compute;
  // Which key seals the files is not what is trained: a rotated key resumes.
  hashed.security = defaults.security;
  // FNV-1a, 64 bit: stable across builds and machines.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : toYaml(hashed)) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

std::string savedPlanPath(const JobConfig& job) { return job.output.dir + "/plans/" + jobHash(job) + ".json"; }

namespace {

void flatten(const YAML::Node& node, const std::string& prefix,
             std::vector<std::pair<std::string, std::string>>& out) {
  if (node.IsMap()) {
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      flatten(kv.second, prefix.empty() ? key : prefix + "." + key, out);
    }
    return;
  }
  YAML::Emitter e;
  e << YAML::Flow << node;
  out.emplace_back(prefix, e.c_str());
}

std::vector<std::pair<std::string, std::string>> flatYaml(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  try {
    flatten(YAML::Load(text), "", out);
  } catch (const YAML::Exception&) {
    out.clear();
  }
  return out;
}

}  // namespace

std::vector<JobChange> diffJobs(const std::string& beforeYaml, const JobConfig& job) {
  const auto before = flatYaml(beforeYaml);
  const auto after = flatYaml(toYaml(job));
  // A key that cohort gained after `before` was written, at its default,
  // leaves the job what it was.
  const auto defaults = flatYaml(toYaml(JobConfig{}));
  std::vector<JobChange> changes;
  for (const auto& [key, value] : after) {
    std::string old = "(none)";
    for (const auto& [k, v] : before) {
      if (k == key) old = v;
    }
    if (old == "(none)") {
      for (const auto& [k, v] : defaults) {
        if (k == key && v == value) old = value;
      }
    }
    if (old != value) changes.push_back({key, old, value});
  }
  for (const auto& [key, value] : before) {
    bool present = false;
    for (const auto& [k, v] : after) present = present || k == key;
    if (!present) changes.push_back({key, value, "(none)"});
  }
  return changes;
}

std::vector<KeyDoc> describeJobKeys() {
  JobConfig defaults;
  detail::Lister l;
  detail::describe(l, defaults);
  return l.keys;
}

}  // namespace cohort
