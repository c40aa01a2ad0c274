// DATA for `cohort score`: which form it takes, and the samples of each
// (serve/detail/score_data.h).

#include "serve/detail/score_data.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cohort/config/load.h"
#include "cohort/core/checksum.h"
#include "cohort/core/error.h"
#include "cohort/data/dataset.h"
#include "cohort/data/shard.h"
#include "cohort/data/shard_source.h"
#include "cohort/storage/storage.h"

namespace cohort::serve::detail {

namespace fs = std::filesystem;

ScoreItem ScoreData::readImage(int64_t, float*) {
  throw DataError(fmt::format("{}: holds token windows, not images", describe()));
}

ScoreItem ScoreData::readTokens(int64_t, int64_t*) {
  throw DataError(fmt::format("{}: holds images, not token windows", describe()));
}

namespace {

void checkImageModel(const ModelInfo& info, const std::string& data) {
  if (info.tokens) {
    throw DataError(fmt::format("{}: image data, but the model is a language model (it scores token "
                                "data: a directory of token shards)",
                                data));
  }
}

// Encoded images (JPEG, PNG) in `data`: the model must have an eval
// transform for them (serve/model.h), checked before any is read.
void checkEncodedImages(const ModelInfo& info, const std::string& data) {
  checkImageModel(info, data);
  try {
    (void)evalTransform(info);
  } catch (const DataError& e) {
    throw DataError(fmt::format("{}: encoded images, but {}", data, e.what()));
  }
}

// An encoded image as the raw pixels the model takes (`out`: C x H x W
// floats), through the eval transform serve uses. Throws DataError when it
// does not decode or is too large.
void decodeInto(const std::string& bytes, const ModelInfo& info, float* out) {
  const at::Tensor pixels = pixelsFromImage(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), info);
  std::memcpy(out, pixels.data_ptr<float>(), static_cast<size_t>(pixels.numel()) * sizeof(float));
}

// How a rerun knows a packed dataset is the same: its manifest (shard names,
// sizes, checksums) and the number of samples kept.
std::string manifestFingerprint(const data::DatasetManifest& m, int64_t limit) {
  const std::string s = data::datasetManifestJson(m) + fmt::format("limit {}", limit);
  return checksumHex(checksum(s.data(), s.size()));
}

std::unique_ptr<data::ShardSource> openSource(const std::string& url, const storage::StorageOptions& storage) {
  return std::make_unique<data::ShardSource>(url, storage, CacheConfig{});
}

// The model's number of the class the data calls `name` (or numbers
// `dataLabel` when it has no names).
std::optional<int64_t> modelLabel(const ModelInfo& info, const std::string& name, int64_t dataLabel) {
  if (!name.empty()) {
    for (int64_t c = 0; c < info.numClasses; ++c) {
      if (info.className(c) == name) return c;
    }
    return std::nullopt;
  }
  if (dataLabel >= 0 && dataLabel < info.numClasses) return dataLabel;
  return std::nullopt;
}

std::string readWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Pixels 0..1 -> 0..255 (the data layer's range -> the model's): IDX and
// synthetic samples, which are not encoded images.
void toRaw(float* px, int64_t n) {
  for (int64_t i = 0; i < n; ++i) px[i] *= 255.0f;
}

bool isImageFile(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// Every JPEG/PNG under a directory, by relative path.
class ImageFolderData : public ScoreData {
 public:
  ImageFolderData(const std::string& root, const ModelInfo& info)
      : root_(root), info_(info) {
    checkEncodedImages(info, root);
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::follow_directory_symlink, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_regular_file(ec) && isImageFile(it->path())) {
        files_.push_back(fs::relative(it->path(), root).generic_string());
      }
    }
    if (ec) throw DataError(fmt::format("{}: cannot list: {}", root, ec.message()));
    if (files_.empty()) {
      throw DataError(fmt::format("{}: no JPEG or PNG images in it or below it (and no dataset.json: "
                                  "not a packed dataset)",
                                  root));
    }
    std::sort(files_.begin(), files_.end());
  }

  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  bool tokens() const override { return false; }
  std::string describe() const override {
    return fmt::format("image folder {} ({} images)", root_, files_.size());
  }
  std::string fingerprint() const override {
    Hasher h;
    for (const auto& f : files_) {
      std::error_code ec;
      const auto bytes = fs::file_size(fs::path(root_) / f, ec);
      const std::string line = fmt::format("{}\t{}\n", f, ec ? -1 : static_cast<int64_t>(bytes));
      h.update(line.data(), line.size());
    }
    return h.hex();
  }

  ScoreItem readImage(int64_t index, float* out) override {
    const std::string& rel = files_[static_cast<size_t>(index)];
    ScoreItem item;
    item.id = rel;
    const size_t slash = rel.find('/');
    if (slash != std::string::npos) item.label = modelLabel(info_, rel.substr(0, slash), -1);
    const std::string path = (fs::path(root_) / rel).string();
    try {
      decodeInto(readWholeFile(path), info_, out);
    } catch (const DataError& e) {
      item.error = fmt::format("{}: {}", path, e.what());
    }
    return item;
  }

 private:
  std::string root_;
  ModelInfo info_;
  std::vector<std::string> files_;
};

// Packed image shards, read record by record (ids are the records' keys).
class ImageShardData : public ScoreData {
 public:
  ImageShardData(std::unique_ptr<data::ShardSource> source, int64_t limit, const ModelInfo& info)
      : info_(info), source_(std::move(source)) {
    checkImageModel(info, source_->describe());
    const data::DatasetManifest& m = source_->manifest();
    if (m.encoding == "raw") {
      if (m.rawShape != std::vector<int64_t>{info.channels, info.height, info.width}) {
        throw DataError(fmt::format("{}: raw images of {}, the model takes {}x{}x{}", source_->describe(),
                                    fmt::join(m.rawShape, "x"), info.channels, info.height, info.width));
      }
    } else {
      checkEncodedImages(info, source_->describe());
    }
    first_.push_back(0);
    for (const auto& s : m.shards) first_.push_back(first_.back() + s.records);
    size_ = limit > 0 ? std::min(limit, first_.back()) : first_.back();
    if (size_ == 0) throw DataError(fmt::format("{}: the dataset holds no records", source_->describe()));
    indexes_.resize(m.shards.size());
    limit_ = limit;
  }

  int64_t size() const override { return size_; }
  bool tokens() const override { return false; }
  std::string describe() const override {
    return fmt::format("image shards {} ({} records)", source_->describe(), size_);
  }
  std::string fingerprint() const override { return manifestFingerprint(source_->manifest(), limit_); }
  void willRead(int64_t begin, int64_t end) override {
    if (begin >= end) return;
    std::vector<int> plan;
    for (int s = shardOf(begin); s <= shardOf(end - 1); ++s) plan.push_back(s);
    source_->plan(std::move(plan));
  }

  ScoreItem readImage(int64_t index, float* out) override {
    const int shard = shardOf(index);
    const auto s = static_cast<size_t>(shard);
    const data::DatasetManifest& m = source_->manifest();
    const std::string where = source_->describe() + "/" + m.shards[s].name;
    if (!indexes_[s]) {
      indexes_[s] = data::readShardIndex(
          [&](int64_t offset, int64_t length) { return source_->read(shard, offset, length); },
          source_->shardBytes(shard), where);
    }
    const data::ShardIndex& ix = *indexes_[s];
    const auto r = static_cast<size_t>(index - first_[s]);
    if (r >= ix.size()) {
      throw DataError(fmt::format("{}: holds {} records, dataset.json says {}", where, ix.size(),
                                  m.shards[s].records));
    }
    const int64_t at = ix.begin(r);
    const data::Record rec = data::parseRecord(source_->read(shard, at, ix.end(r) - at), at, where);
    ScoreItem item;
    item.id = rec.key;
    const std::string name =
        rec.label >= 0 && rec.label < static_cast<int64_t>(m.classes.size()) && !info_.classes.empty()
            ? m.classes[static_cast<size_t>(rec.label)]
            : "";
    item.label = modelLabel(info_, name, rec.label);
    const auto* bytes = reinterpret_cast<const uint8_t*>(rec.payload.data());
    if (m.encoding == "raw") {
      const auto n = static_cast<size_t>(info_.channels * info_.height * info_.width);
      if (rec.payload.size() != n) {
        throw DataError(fmt::format("{}: record '{}' holds {} bytes, {}x{}x{} pixels are {}", where, rec.key,
                                    rec.payload.size(), info_.channels, info_.height, info_.width, n));
      }
      for (size_t k = 0; k < n; ++k) out[k] = static_cast<float>(bytes[k]);
      return item;
    }
    try {
      decodeInto(rec.payload, info_, out);
    } catch (const DataError& e) {
      item.error = fmt::format("{}: image '{}' at offset {}: {}", where, rec.key, at, e.what());
    }
    return item;
  }

 private:
  int shardOf(int64_t index) const {
    return static_cast<int>(std::upper_bound(first_.begin(), first_.end(), index) - first_.begin()) - 1;
  }

  ModelInfo info_;
  std::unique_ptr<data::ShardSource> source_;  // not null
  std::vector<int64_t> first_;  // first sample of each shard
  int64_t size_ = 0, limit_ = 0;
  std::vector<std::optional<data::ShardIndex>> indexes_;  // read on first use
};

// Token shards in the windows the data layer cuts for evaluation.
class TokenData : public ScoreData {
 public:
  // `source`: the dataset, open (its manifest read once, here and for the
  // windows alike).
  TokenData(std::unique_ptr<data::ShardSource> source, const std::string& url, int64_t limit,
            const ModelInfo& info)
      : info_(info), fingerprint_(manifestFingerprint(source->manifest(), limit)) {
    if (!info.tokens) {
      throw DataError(fmt::format("{}: token data, but the model is an image model", source->describe()));
    }
    DatasetConfig d;
    d.kind = DataKind::tokens;
    d.path = url;
    d.limit = limit;
    data::OpenOptions o;
    o.tokenWindow = info.blockSize + 1;
    dataset_ = data::openTokens(d, o, std::move(source));
    if (dataset_->vocabSize() > info.vocabSize) {
      throw DataError(fmt::format("{}: token ids up to {}, the model's vocabulary is {}", url,
                                  dataset_->vocabSize(), info.vocabSize));
    }
  }

  int64_t size() const override { return dataset_->size(); }
  bool tokens() const override { return true; }
  std::string describe() const override { return dataset_->describe(); }
  std::string fingerprint() const override { return fingerprint_; }

  ScoreItem readTokens(int64_t index, int64_t* out) override {
    dataset_->readTokens(index, out, 0);
    ScoreItem item;
    item.id = index * info_.blockSize;  // the window's first token in the text
    return item;
  }

 private:
  ModelInfo info_;
  std::shared_ptr<data::Dataset> dataset_;
  std::string fingerprint_;
};

// IDX files and synthetic samples: the data layer's raw pixels, which must
// have the model's size.
class PixelData : public ScoreData {
 public:
  PixelData(std::shared_ptr<data::Dataset> dataset, bool labelled, std::string fingerprint,
            const ModelInfo& info)
      : dataset_(std::move(dataset)), labelled_(labelled), fingerprint_(std::move(fingerprint)), info_(info) {
    checkImageModel(info, dataset_->describe());
    const data::SampleShape s = dataset_->shape();
    if (s.channels != info.channels || s.height != info.height || s.width != info.width) {
      throw DataError(fmt::format("{}: samples of {}x{}x{}, the model takes {}x{}x{} (data of raw pixels "
                                  "is not resized; use image files for that)",
                                  dataset_->describe(), s.channels, s.height, s.width, info.channels,
                                  info.height, info.width));
    }
  }

  int64_t size() const override { return dataset_->size(); }
  bool tokens() const override { return false; }
  std::string describe() const override { return dataset_->describe(); }
  std::string fingerprint() const override { return fingerprint_; }

  ScoreItem readImage(int64_t index, float* out) override {
    const int64_t label = dataset_->read(index, out);
    toRaw(out, dataset_->shape().numel());
    ScoreItem item;
    item.id = index;
    if (labelled_) item.label = modelLabel(info_, "", label);
    return item;
  }

 private:
  std::shared_ptr<data::Dataset> dataset_;
  bool labelled_;
  std::string fingerprint_;
  ModelInfo info_;
};

// The labels file of an IDX images file: "...-images-idx3-ubyte[.gz]" ->
// "...-labels-idx1-ubyte[.gz]", either compression; "" when there is none.
std::string idxLabelsBeside(const std::string& images) {
  const fs::path p(images);
  std::string name = p.filename().string();
  const size_t at = name.find("images-idx3");
  if (at == std::string::npos) return "";
  name.replace(at, 11, "labels-idx1");
  std::string plain = name;
  if (plain.size() > 3 && plain.compare(plain.size() - 3, 3, ".gz") == 0) plain.resize(plain.size() - 3);
  for (const std::string& candidate : {name, plain, plain + ".gz"}) {
    std::error_code ec;
    if (fs::is_regular_file(p.parent_path() / candidate, ec)) return (p.parent_path() / candidate).string();
  }
  return "";
}

std::unique_ptr<ScoreData> openIdxData(const std::string& images, const std::string& labels, int64_t limit,
                                       const ModelInfo& info) {
  auto dataset = data::openIdx(images, labels, limit, std::max<int64_t>(info.numClasses, 1));
  std::string fp = checksumFile(images) + fmt::format(" limit {}", limit);
  if (!labels.empty()) fp += " " + checksumFile(labels);
  return std::make_unique<PixelData>(dataset, !labels.empty(), fp, info);
}

// The manifest's encoding decides between image and token shards.
std::unique_ptr<ScoreData> openPacked(const std::string& url, int64_t limit, const ModelInfo& info,
                                      const storage::StorageOptions& storage) {
  std::unique_ptr<data::ShardSource> source = openSource(url, storage);
  if (source->manifest().encoding == "tokens") {
    return std::make_unique<TokenData>(std::move(source), url, limit, info);
  }
  return std::make_unique<ImageShardData>(std::move(source), limit, info);
}

// A YAML file holding one dataset section is parsed as data.train of a job,
// with the job schema's rules and messages; the locations in them are moved
// back to the file's own lines and columns.
DatasetConfig loadDatasetSection(const std::string& path, const ModelInfo& info) {
  const std::string text = readWholeFile(path);
  std::string wrapped = "data:\n  train:\n";
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) wrapped += "    " + line + "\n";
  // A language model's job: the schema only lets token data train one.
  if (info.tokens) wrapped += "model: {arch: gpt}\n";
  try {
    return loadJobFromString(wrapped, path).data.train;
  } catch (const ConfigError& e) {
    std::string m = e.what();
    std::string out;
    const std::string prefix = path + ":";
    size_t pos = 0;
    for (size_t at; (at = m.find(prefix, pos)) != std::string::npos;) {
      out += m.substr(pos, at + prefix.size() - pos);
      pos = at + prefix.size();
      int line = 0, col = 0, used = 0;
      if (std::sscanf(m.c_str() + pos, "%d:%d%n", &line, &col, &used) == 2) {
        out += fmt::format("{}:{}", std::max(1, line - 2), std::max(1, col - 4));
        pos += static_cast<size_t>(used);
      }
    }
    out += m.substr(pos);
    for (size_t at; (at = out.find("data.train.")) != std::string::npos;) out.erase(at, 11);
    throw ConfigError(out + " (DATA: one dataset section of a job, the keys of data.train)");
  }
}

std::unique_ptr<ScoreData> openSection(const std::string& path, const ModelInfo& info,
                                       const storage::StorageOptions& storage) {
  const DatasetConfig d = loadDatasetSection(path, info);
  switch (d.kind) {
    case DataKind::idx: return openIdxData(d.images, d.labels, d.limit, info);
    case DataKind::shards: return std::make_unique<ImageShardData>(openSource(d.path, storage), d.limit, info);
    case DataKind::tokens: return std::make_unique<TokenData>(openSource(d.path, storage), d.path, d.limit, info);
    case DataKind::synthetic: {
      auto dataset = data::openDataset(d, std::max<int64_t>(info.numClasses, 1));
      const std::string fp = fmt::format("synthetic {} {} {}x{}x{}", dataset->size(), d.seed, d.shape.at(0),
                                         d.shape.at(1), d.shape.at(2));
      return std::make_unique<PixelData>(dataset, true, fp, info);
    }
    case DataKind::textClasses:
      throw ConfigError(fmt::format("{}: kind text_classes: cohort score does not read labelled texts yet; the "
                                    "training run's evaluation reports their accuracy",
                                    path));
    case DataKind::none: break;
  }
  throw ConfigError(fmt::format("{}: no dataset kind (kind: idx, synthetic, shards or tokens)", path));
}

}  // namespace

std::unique_ptr<ScoreData> openScoreData(const std::string& data, const ModelInfo& info,
                                         const storage::StorageOptions& storage) {
  if (data.find("://") != std::string::npos) return openPacked(data, 0, info, storage);
  std::error_code ec;
  if (!fs::exists(data, ec)) throw UsageError(fmt::format("--data {}: no such file or directory", data));
  const std::string abs = fs::absolute(data).lexically_normal().string();
  if (fs::is_directory(abs, ec)) {
    if (fs::is_regular_file(fs::path(abs) / data::kDatasetManifestName, ec)) return openPacked(abs, 0, info, storage);
    return std::make_unique<ImageFolderData>(abs, info);
  }
  const std::string ext = fs::path(abs).extension().string();
  if (ext == ".yaml" || ext == ".yml") return openSection(abs, info, storage);
  return openIdxData(abs, idxLabelsBeside(abs), 0, info);
}

}  // namespace cohort::serve::detail
