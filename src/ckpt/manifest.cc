#include "cohort/ckpt/manifest.h"

#include <fmt/format.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cohort/core/checksum.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "core/detail/json_int.h"
#include "cohort/security/sealed.h"
#include "core/detail/json_int.h"

namespace fs = std::filesystem;

namespace cohort::ckpt {

nlohmann::json toJson(const Manifest& m) {
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : m.files) {
    files.push_back({{"name", f.name}, {"size", f.size}, {"checksum", f.checksum},
                     {"rank", f.rank}});
  }
  return {{"format", "cohort-checkpoint"},
          {"format_version", m.formatVersion},
          {"step", m.step},
          {"epoch", m.epoch},
          {"batch_in_epoch", m.batchInEpoch},
          {"samples_in_epoch", m.samplesInEpoch},
          {"world_size", m.worldSize},
          {"job_hash", m.jobHash},
          {"created", m.created},
          {"checksum_algorithm", "xxh3-64"},
          {"files", files},
          {"extra", m.extra}};
}

Manifest manifestFromJson(const nlohmann::json& j, const std::string& origin) {
  Manifest m;
  try {
    if (j.value("format", "") != "cohort-checkpoint") {
      throw DataError(fmt::format("{}: not a cohort checkpoint manifest", origin));
    }
    m.formatVersion = jsonInt<int>(j.at("format_version"));
    if (m.formatVersion > kCheckpointFormatVersion || m.formatVersion < 1) {
      throw DataError(fmt::format("{}: checkpoint format version {} is not one this cohort reads "
                                  "(1..{})",
                                  origin, m.formatVersion, kCheckpointFormatVersion));
    }
    m.step = jsonInt<int64_t>(j.at("step"));
    m.epoch = jsonInt<int64_t>(j.at("epoch"));
    m.batchInEpoch = jsonInt<int64_t>(j.at("batch_in_epoch"));
    m.samplesInEpoch = jsonInt<int64_t>(j.at("samples_in_epoch"));
    m.worldSize = jsonInt<int>(j.at("world_size"));
    m.jobHash = j.at("job_hash").get<std::string>();
    m.created = j.at("created").get<std::string>();
    for (const auto& f : j.at("files")) {
      ManifestFile mf;
      mf.name = f.at("name").get<std::string>();
      mf.size = jsonInt<uint64_t>(f.at("size"));
      mf.checksum = f.at("checksum").get<std::string>();
      mf.rank = jsonInt(f, "rank", -1);
      if (mf.name.empty() || mf.name.find('/') != std::string::npos || mf.name[0] == '.') {
        throw DataError(fmt::format("{}: file name '{}' is not a plain file name", origin, mf.name));
      }
      m.files.push_back(std::move(mf));
    }
    m.extra = j.value("extra", nlohmann::json::object());
    if (!m.extra.is_object()) throw DataError(fmt::format("{}: 'extra' is not an object", origin));
    if (m.extra.contains("job") && !m.extra["job"].is_string()) {
      throw DataError(fmt::format("{}: 'extra.job' is not a string", origin));
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: malformed manifest: {}", origin, e.what()));
  }
  if (m.step < 0 || m.epoch < 1 || m.batchInEpoch < 0 || m.worldSize < 1) {
    throw DataError(fmt::format("{}: impossible values (step {}, epoch {}, world size {})", origin,
                                m.step, m.epoch, m.worldSize));
  }
  return m;
}

Manifest readManifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  std::ifstream in(path);
  if (!in) throw DataError(fmt::format("{}: missing (the checkpoint is incomplete)", path));
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
  return manifestFromJson(j, path);
}

void writeManifest(const std::string& dir, const Manifest& m) {
  writeFileAtomic(dir + "/manifest.json", toJson(m).dump(2) + "\n");
}

namespace {
int layoutCount(const Manifest& m, const char* section, const char* key) {
  const nlohmann::json j = m.extra.value(section, nlohmann::json());
  return std::max(1, jsonInt(j, key, 1));
}
}  // namespace

int checkpointStages(const Manifest& m) { return layoutCount(m, "pipeline", "stages"); }
int checkpointSlices(const Manifest& m) { return layoutCount(m, "tensor", "tensors"); }

std::string checkpointDirName(int64_t step) { return fmt::format("step-{}", step); }

std::vector<CheckpointDir> listCheckpointDirs(const std::string& dir) {
  std::vector<CheckpointDir> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || name.size() == 5 || name.size() > 24) continue;
    if (!std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    if (!e.is_directory(ec)) continue;
    out.push_back({std::stoll(name.substr(5)), e.path().string()});
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointDir& a, const CheckpointDir& b) { return a.step < b.step; });
  return out;
}

Verification verifyCheckpoint(const std::string& path, bool checksums) {
  Verification v;
  try {
    v.manifest = readManifest(path);
  } catch (const Error& e) {
    v.problem = e.what();
    return v;
  }
  for (const auto& f : v.manifest->files) {
    const std::string file = path + "/" + f.name;
    std::error_code ec;
    const uint64_t size = fs::file_size(file, ec);
    if (ec) {
      v.problem = fmt::format("{}: missing ({})", file, ec.message());
      return v;
    }
    if (size != f.size) {
      v.problem = fmt::format("{}: {} bytes, the manifest says {}", file, size, f.size);
      return v;
    }
    v.bytes += size;
    if (!checksums) continue;
    try {
      const std::string sum = checksumFile(file);
      if (sum != f.checksum) {
        v.problem = fmt::format("{}: checksum {} does not match the manifest's {} (corrupt)", file,
                                sum, f.checksum);
        return v;
      }
      // An encrypted file is authenticated too, when this process has keys:
      // a file altered together with its manifest fails here.
      const security::Keyring* keys = security::installedKeyring();
      if (keys != nullptr && security::isSealedFile(file)) security::verifySealedFile(file, keys);
    } catch (const Error& e) {
      v.problem = e.what();
      return v;
    }
  }
  v.valid = true;
  return v;
}

std::vector<std::string> retentionVictims(const std::vector<CheckpointDir>& dirs,
                                          const std::vector<bool>& valid, int64_t keepLast,
                                          int64_t keepEvery) {
  std::vector<std::string> victims;
  int newestValid = -1;
  for (int i = static_cast<int>(dirs.size()) - 1; i >= 0; --i) {
    if (valid[static_cast<size_t>(i)]) {
      newestValid = i;
      break;
    }
  }
  if (newestValid < 0) return victims;
  int64_t keptRecent = 0;
  for (int i = newestValid; i >= 0; --i) {
    const auto& d = dirs[static_cast<size_t>(i)];
    const bool ok = valid[static_cast<size_t>(i)];
    bool keep = false;
    if (i == newestValid) {
      keep = true;
    } else if (ok && keptRecent < keepLast) {
      keep = true;
    } else if (ok && keepEvery > 0 && d.step % keepEvery == 0) {
      keep = true;
      --keptRecent;  // keepers do not count against keep_last
    }
    if (ok && keep) ++keptRecent;
    if (!keep) victims.push_back(d.path);
  }
  return victims;
}

}  // namespace cohort::ckpt
