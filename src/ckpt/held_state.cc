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
  // Every slice of every stage: its model.bin and its optimizer state (each
  // rank's of its data group's parts with ZeRO; at stage 3 the parameters'
  // parts too).
  const int stages = checkpointStages(m);
  const int slices = checkpointSlices(m);
  std::vector<std::string> need;
  for (int t = 0; t < slices; ++t) {
    for (int s = 0; s < stages; ++s) {
      auto name = [&](const std::string& file) { return sliceFile(t, slices, stageFile(s, stages, file)); };
      nlohmann::json zero = m.extra.value("zero", nlohmann::json());
      if (stages > 1) {
        const nlohmann::json layouts = m.extra["pipeline"].value("stage_zero", nlohmann::json());
        zero = layouts.is_array() && s < static_cast<int>(layouts.size()) ? layouts[static_cast<size_t>(s)]
                                                                          : nlohmann::json();
      }
      need.push_back(name("model.bin"));
      if (!zero.is_object()) {
        need.push_back(name(optimizerFile(false, 0)));
        continue;
      }
      const int group = zero.value("world_size", m.worldSize / (stages * slices));
      for (int r = 0; r < group; ++r) {
        need.push_back(name(optimizerFile(true, r)));
        if (zero.value("model_parts", false)) need.push_back(name(modelPartFile(r)));
      }
    }
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
