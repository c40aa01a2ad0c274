#include "cohort/ckpt/held_state.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "cohort/ckpt/rank_state.h"
#include "cohort/ckpt/tensor_file.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"
#include "cohort/security/keys.h"

namespace cohort::ckpt {
namespace fs = std::filesystem;

std::string heldPartFile(int rank) { return fmt::format("part-{}.json", rank); }

void writeHeldState(const std::string& dir, Manifest m, const std::vector<SnapshotFile>& files,
                    int rank) {
  const std::string stepDir = dir + "/" + checkpointDirName(m.step);
  std::error_code ec;
  fs::create_directories(stepDir, ec);
  if (ec) throw IoError(fmt::format("cannot create {}: {}", stepDir, ec.message()));
  const security::Keyring* keys = security::installedKeyring();
  const security::Key* key = keys != nullptr ? &keys->current : nullptr;
  m.files.clear();
  for (const SnapshotFile& file : files) {
    std::vector<at::Tensor> held;  // keeps each record's bytes alive
    std::vector<TensorRecord> records;
    for (const SnapshotItem& item : *file.items) {
      at::Tensor t = item.make ? item.make() : item.tensor;
      t = t.detach().to(c10::kCPU).contiguous();
      held.push_back(t);
      records.push_back({item.name, t.scalar_type(), t.sizes().vec(), t.data_ptr(),
                         static_cast<uint64_t>(t.nbytes())});
    }
    const WrittenFile w = writeTensorFile(stepDir + "/" + file.name, records, file.meta, key);
    m.files.push_back({w.name, w.size, w.checksum, rank});
  }
  if (key != nullptr) m.extra["encryption"] = {{"algorithm", "AES-256-GCM"}, {"key_id", key->id}};
  writeFileAtomic(stepDir + "/" + heldPartFile(rank), toJson(m).dump(2) + "\n");
}

std::vector<HeldStep> listHeldState(const std::string& dir) {
  std::vector<HeldStep> out;
  for (const CheckpointDir& d : listCheckpointDirs(dir)) {
    HeldStep h;
    h.path = d.path;
    bool any = false;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(d.path, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("part-", 0) != 0 || e.path().extension() != ".json") continue;
      try {
        std::ifstream in(e.path());
        const Manifest part = manifestFromJson(nlohmann::json::parse(in), e.path().string());
        if (!any) {
          h.manifest = part;
          h.manifest.files.clear();
          any = true;
        }
        for (const ManifestFile& f : part.files) {
          const auto size = fs::file_size(d.path + "/" + f.name, ec);
          if (ec || size != f.size) continue;  // torn or missing: not held
          h.manifest.files.push_back(f);
        }
      } catch (const std::exception& err) {
        log::warn("held state: {} is unreadable, left out: {}", e.path().string(), err.what());
      }
    }
    if (any) out.push_back(std::move(h));
  }
  std::sort(out.begin(), out.end(),
            [](const HeldStep& a, const HeldStep& b) { return a.manifest.step > b.manifest.step; });
  return out;
}

std::vector<std::string> requiredFiles(const Manifest& m) {
  std::vector<std::string> need = {"model.bin"};
  const nlohmann::json zero = m.extra.contains("zero") ? m.extra["zero"] : nlohmann::json();
  if (!zero.is_object()) {
    need.push_back(optimizerFile(false, 0));
    return need;
  }
  for (int r = 0; r < m.worldSize; ++r) {
    need.push_back(optimizerFile(true, r));
    if (zero.value("model_parts", false)) need.push_back(modelPartFile(r));
  }
  return need;
}

std::vector<std::string> missingFiles(const Manifest& m) {
  std::vector<std::string> out;
  for (const auto& need : requiredFiles(m)) {
    bool found = false;
    for (const auto& f : m.files) found = found || f.name == need;
    if (!found) out.push_back(need);
  }
  return out;
}

void pruneHeldState(const std::string& dir, int64_t keep) {
  for (const CheckpointDir& d : listCheckpointDirs(dir)) {
    if (d.step == keep) continue;
    std::error_code ec;
    fs::remove_all(d.path, ec);
    if (ec) log::warn("held state: cannot remove {}: {}", d.path, ec.message());
  }
}

}  // namespace cohort::ckpt
