#include "cohort/data/pack.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <thread>
#include <vector>

#include "cohort/ckpt/manifest.h"
#include "cohort/core/checksum.h"
#include "cohort/core/error.h"
#include "cohort/security/keys.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"
#include "cohort/core/text.h"
#include "cohort/data/dataset.h"
#include "cohort/data/image.h"
#include "cohort/data/sampler.h"
#include "cohort/data/shard.h"
#include "cohort/data/shard_source.h"
#include "cohort/data/tokens.h"
#include "cohort/core/time.h"
#include "data/detail/destination.h"

namespace cohort::data {

namespace fs = std::filesystem;

namespace {

using detail::Destination;

// One input sample: a file of a class folder, or an IDX sample.
struct Item {
  std::string path;  // folder input
  int64_t index = 0; // IDX input
  std::string key;
  int64_t label = 0;
  int64_t bytes = 0;
};

struct Input {
  std::vector<Item> items;
  std::vector<std::string> classes;
  std::shared_ptr<Dataset> idx;  // IDX input
  std::string encoding = "image";
  std::vector<int64_t> rawShape;
};

bool isImageFile(const fs::path& p) {
  const std::string ext = lowerAscii(p.extension().string());
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

Input listFolder(const std::string& src) {
  Input in;
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(src)) {
    if (e.is_directory()) dirs.push_back(e.path());
  }
  std::sort(dirs.begin(), dirs.end());
  if (dirs.empty()) {
    throw DataError(fmt::format("{}: no class folders (an ImageNet-style folder has one "
                                "subfolder of images per class)", src));
  }
  int64_t ignored = 0;
  for (size_t c = 0; c < dirs.size(); ++c) {
    const std::string cls = dirs[c].filename().string();
    in.classes.push_back(cls);
    std::vector<fs::path> files;
    for (const auto& e : fs::recursive_directory_iterator(dirs[c])) {
      if (!e.is_regular_file()) continue;
      if (isImageFile(e.path())) {
        files.push_back(e.path());
      } else {
        ++ignored;
      }
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) log::warn("{}: class folder '{}' holds no JPEG or PNG files", src, cls);
    for (const auto& f : files) {
      Item it;
      it.path = f.string();
      it.key = fs::relative(f, src).generic_string();
      it.label = static_cast<int64_t>(c);
      it.bytes = static_cast<int64_t>(fs::file_size(f));
      in.items.push_back(std::move(it));
    }
  }
  if (ignored > 0) log::info("{}: {} files that are not .jpg, .jpeg or .png were left out", src, ignored);
  if (in.items.empty()) throw DataError(fmt::format("{}: no JPEG or PNG files in its class folders", src));
  return in;
}

// "train-images-idx3-ubyte.gz" -> "train-labels-idx1-ubyte.gz".
std::string labelsFileFor(const std::string& images) {
  const fs::path p(images);
  std::string name = p.filename().string();
  const auto at = name.find("images-idx3");
  if (at == std::string::npos) {
    throw UsageError(fmt::format("{}: cannot tell its labels file; name it with --labels", images));
  }
  name.replace(at, 11, "labels-idx1");
  return (p.parent_path() / name).string();
}

Input openIdxInput(const std::string& src, const std::string& labelsArg) {
  Input in;
  const std::string labels = labelsArg.empty() ? labelsFileFor(src) : labelsArg;
  in.idx = openIdx(src, labels, 0, 256);
  const SampleShape s = in.idx->shape();
  in.encoding = "raw";
  in.rawShape = {s.channels, s.height, s.width};
  std::vector<float> px(static_cast<size_t>(s.numel()));
  int64_t maxLabel = 0;
  for (int64_t i = 0; i < in.idx->size(); ++i) {
    Item it;
    it.index = i;
    it.key = std::to_string(i);
    it.label = in.idx->read(i, px.data());
    it.bytes = s.numel();
    maxLabel = std::max(maxLabel, it.label);
    in.items.push_back(std::move(it));
  }
  for (int64_t c = 0; c <= maxLabel; ++c) in.classes.push_back(std::to_string(c));
  return in;
}

std::string readFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw DataError(fmt::format("{}: cannot read", path));
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::string shardName(size_t i) { return fmt::format("shard-{:05d}.cohort", i); }

// The tools read each shard once: no copy in the node-local cache.
CacheConfig uncached() {
  CacheConfig c;
  c.enabled = false;
  return c;
}

}  // namespace

namespace {

// The input's items shuffled by options.seed and cut into shards of about
// options.shardBytes: each shard lists its items' positions in `in.items`.
std::vector<std::vector<size_t>> cutIntoShards(const Input& in, const PackOptions& options) {
  const std::vector<int64_t> order =
      permutation(static_cast<int64_t>(in.items.size()), options.seed, 0);
  std::vector<std::vector<size_t>> shards(1);
  int64_t filled = 0;
  for (int64_t i : order) {
    const Item& it = in.items[static_cast<size_t>(i)];
    const int64_t cost = it.bytes + kRecordHeaderBytes + static_cast<int64_t>(it.key.size()) + 8;
    if (filled > 0 && filled + cost > options.shardBytes) {
      shards.emplace_back();
      filled = 0;
    }
    shards.back().push_back(static_cast<size_t>(i));
    filled += cost;
  }
  return shards;
}

struct PackCounters {
  std::atomic<int64_t> items{0}, bytes{0}, skipped{0};
};

// Writes shard `name` of the items `shard` and publishes it. Files that are
// not readable images are left out with a warning.
ShardInfo writeShard(const Input& in, const std::vector<size_t>& shard, const std::string& name,
                     const Destination& dst, const PackOptions& options, PackCounters& done) {
  std::vector<float> px(in.idx ? static_cast<size_t>(in.idx->shape().numel()) : 0);
  std::string raw(px.size(), '\0');
  const std::string tmpPath = dst.scratch(name);
  try {
    ShardWriter w(tmpPath, options.key, name);
    for (size_t i : shard) {
      const Item& it = in.items[i];
      if (in.idx) {
        in.idx->read(it.index, px.data());
        for (size_t k = 0; k < px.size(); ++k) {
          raw[k] = static_cast<char>(static_cast<uint8_t>(std::lround(px[k] * 255.0f)));
        }
        w.add(it.key, it.label, raw.data(), raw.size());
      } else {
        const std::string bytes = readFile(it.path);
        try {
          probeImage(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
        } catch (const DataError& e) {
          log::warn("{}: left out, not a readable image: {}", it.path, e.what());
          ++done.skipped;
          ++done.items;
          continue;
        }
        w.add(it.key, it.label, bytes.data(), bytes.size());
      }
      ++done.items;
      done.bytes += it.bytes;
    }
    ShardInfo info;
    info.name = name;
    info.records = w.records();
    info.bytes = w.finish();
    uint64_t size = 0;
    info.checksum = checksumFile(tmpPath, &size);
    dst.put(name);
    return info;
  } catch (...) {
    std::error_code e;
    fs::remove(tmpPath, e);
    throw;
  }
}

// Runs `work` on up to `threads` threads (at least one must start) and
// calls `report(false)` every half second until all are done.
void runPool(int threads, const std::function<void()>& work, const std::function<void(bool)>& report) {
  std::vector<std::thread> pool;
  std::atomic<int> running{threads};
  std::mutex doneMutex;
  std::condition_variable doneCv;
  for (int t = 0; t < threads; ++t) {
    try {
      pool.emplace_back([&] {
        work();
        std::lock_guard<std::mutex> g(doneMutex);
        --running;
        doneCv.notify_all();
      });
    } catch (...) {
      // Fewer threads than asked for: the ones started do all the work.
      std::lock_guard<std::mutex> g(doneMutex);
      running -= threads - t;
      if (t == 0) throw;
      break;
    }
  }
  {
    std::unique_lock<std::mutex> lock(doneMutex);
    while (!doneCv.wait_for(lock, std::chrono::milliseconds(500), [&] { return running == 0; })) {
      lock.unlock();
      report(false);
      lock.lock();
    }
  }
  for (auto& t : pool) t.join();
}

}  // namespace

PackResult pack(const std::string& src, const std::string& dst, const PackOptions& options) {
  if (!fs::exists(src)) throw DataError(fmt::format("{}: no such file or folder", src));
  Input in = fs::is_directory(src) ? listFolder(src) : openIdxInput(src, options.labels);
  const std::vector<std::vector<size_t>> shards = cutIntoShards(in, options);
  const Destination out(dst, options.storage);

  DatasetManifest m;
  m.name = options.name.empty() ? fs::path(src).lexically_normal().filename().string() : options.name;
  if (m.name.empty()) m.name = fs::path(src).parent_path().filename().string();
  m.encoding = in.encoding;
  m.rawShape = in.rawShape;
  m.classes = in.classes;
  m.source = fs::absolute(src).string();
  m.shards.resize(shards.size());
  if (options.key != nullptr) m.encryptionKeyId = options.key->id;

  std::atomic<size_t> nextShard{0};
  PackCounters done;
  std::mutex errorMutex;
  std::exception_ptr error;
  auto worker = [&] {
    for (;;) {
      const size_t s = nextShard++;
      if (s >= shards.size()) return;
      {
        std::lock_guard<std::mutex> g(errorMutex);
        if (error) return;
      }
      try {
        m.shards[s] = writeShard(in, shards[s], shardName(s), out, options, done);
      } catch (...) {
        std::lock_guard<std::mutex> g(errorMutex);
        if (!error) error = std::current_exception();
      }
    }
  };
  const bool terminal = ::isatty(STDERR_FILENO) != 0;
  const auto start = std::chrono::steady_clock::now();
  const auto total = static_cast<int64_t>(in.items.size());
  auto report = [&](bool last) {
    if (!options.progress) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string line = fmt::format("packing {}: {}/{} records ({:.0f}%), {:.0f} MB, {:.1f} s",
                                         m.name, done.items.load(), total,
                                         100.0 * double(done.items.load()) / double(std::max<int64_t>(1, total)),
                                         double(done.bytes.load()) / 1e6, s);
    if (terminal) {
      std::cerr << "\r" << line << (last ? "\n" : "") << std::flush;
    } else if (last) {
      std::cerr << line << "\n";
    }
  };
  const int cores = options.threads > 0 ? options.threads
                                        : static_cast<int>(std::thread::hardware_concurrency());
  runPool(std::max(1, std::min<int>(cores, static_cast<int>(shards.size()))), worker, report);
  report(true);
  if (error) std::rethrow_exception(error);
  // Shards left empty by skipped files are dropped.
  m.shards.erase(std::remove_if(m.shards.begin(), m.shards.end(),
                                [&](const ShardInfo& s) {
                                  if (s.records > 0) return false;
                                  out.remove(s.name);
                                  return true;
                                }),
                 m.shards.end());
  if (m.shards.empty()) throw DataError(fmt::format("{}: none of its files is a readable image", src));
  m.created = utcNow();
  out.writeManifest(datasetManifestJson(m));
  PackResult r;
  r.manifest = std::move(m);
  r.skipped = done.skipped;
  return r;
}

int inspectCommand(const std::string& path, int64_t records, const storage::StorageOptions& so,
                   std::ostream& out) {
  ShardSource source(path, so, uncached());
  const DatasetManifest& m = source.manifest();
  out << fmt::format("dataset  {}\nname     {}\nencoding {}", source.describe(), m.name, m.encoding);
  if (m.encoding == "raw") out << fmt::format(" {}x{}x{}", m.rawShape[0], m.rawShape[1], m.rawShape[2]);
  if (m.encoding == "tokens") {
    out << fmt::format("\ntokenizer {}{}, vocab {}, {}-byte ids{}", m.tokenizer,
                       m.tokenizerModel.empty() ? "" : " (" + m.tokenizerModel + ")", m.vocabSize, m.tokenBytes,
                       m.textBytes > 0 ? fmt::format(", from {} bytes of text", m.textBytes) : "");
  }
  out << fmt::format("\nrecords  {}\nbytes    {} ({:.1f} MB)\nshards   {}\nclasses  {}", m.records(),
                     m.bytes(), double(m.bytes()) / 1e6, m.shards.size(), m.classes.size());
  for (size_t c = 0; c < std::min<size_t>(m.classes.size(), 10); ++c) {
    out << (c == 0 ? ": " : ", ") << m.classes[c];
  }
  if (m.classes.size() > 10) out << ", ...";
  out << fmt::format("\nsource   {}\ncreated  {}\n\n{:<22} {:>9} {:>14}  {}\n", m.source, m.created,
                     "shard", "records", "bytes", "checksum");
  for (const auto& s : m.shards) {
    out << fmt::format("{:<22} {:>9} {:>14}  {}\n", s.name, s.records, s.bytes, s.checksum);
  }
  if (records > 0 && !m.shards.empty() && m.encoding == "tokens") {
    const int64_t n = std::min(records, m.shards[0].records);
    const std::string bytes = source.read(0, kTokenShardHeaderBytes, m.tokenBytes * n);
    std::vector<int64_t> tokens(static_cast<size_t>(n));
    for (size_t k = 0; k < tokens.size(); ++k) {
      tokens[k] = tokenAt(reinterpret_cast<const unsigned char*>(bytes.data()), m.tokenBytes, static_cast<int64_t>(k));
    }
    out << fmt::format("\nfirst {} tokens of {}, decoded:\n{}\n", n, m.shards[0].name,
                       datasetTokenizer(source)->decode(tokens));
  } else if (records > 0 && !m.shards.empty()) {
    out << fmt::format("\nfirst {} records of {}:\n", records, m.shards[0].name);
    const ShardIndex index = readShardIndex(
        [&](int64_t o, int64_t n) { return source.read(0, o, n); }, source.shardBytes(0),
        m.shards[0].name);
    for (size_t i = 0; i < std::min<size_t>(index.size(), static_cast<size_t>(records)); ++i) {
      const int64_t at = index.begin(i);
      const Record r = parseRecord(source.read(0, at, index.end(i) - at), at, m.shards[0].name);
      const std::string cls = r.label >= 0 && r.label < int64_t(m.classes.size())
                                  ? m.classes[static_cast<size_t>(r.label)] : "?";
      out << fmt::format("  {:>10}  label {:>5} ({})  {} bytes  {}\n", at, r.label, cls,
                         r.payload.size(), r.key);
    }
  }
  return 0;
}

int verifyCommand(const std::string& path, bool decode, const storage::StorageOptions& so,
                  std::ostream& out) {
  ShardSource source(path, so, uncached());
  const DatasetManifest& m = source.manifest();
  int problems = 0;
  int64_t undecodable = 0;
  if (m.encoding == "tokens" && !m.tokenizerModel.empty()) {
    try {
      (void)datasetTokenizer(source);
      out << fmt::format("{}/{}: ok, the tokenizer of these tokens\n", source.describe(), m.tokenizerModel);
    } catch (const DataError& e) {
      out << e.what() << "\n";
      ++problems;
    }
  }
  ImageTransform t;
  t.outHeight = t.outWidth = 32;
  t.resizeShorter = 32;
  std::vector<float> px(static_cast<size_t>(3 * 32 * 32));
  for (size_t s = 0; s < m.shards.size(); ++s) {
    const ShardInfo& info = m.shards[s];
    const std::string where = source.describe() + "/" + info.name;
    try {
      const std::string stored = source.readRaw(static_cast<int>(s), 0, info.bytes);
      Hasher h;
      h.update(stored.data(), stored.size());
      if (h.hex() != info.checksum) {
        out << fmt::format("{}: checksum {}, dataset.json says {}\n", where, h.hex(), info.checksum);
        ++problems;
      }
      // Encrypted: every chunk decrypted and authenticated.
      const std::string bytes = m.encryptionKeyId.empty()
                                    ? stored
                                    : source.read(static_cast<int>(s), 0, source.shardBytes(static_cast<int>(s)));
      if (m.encoding == "tokens") {
        checkTokenShard(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), info,
                        m.vocabSize, where, m.tokenBytes);
        out << fmt::format("{}: ok, {} tokens\n", where, info.records);
        continue;
      }
      int64_t n = 0;
      scanShard([&](int64_t o, int64_t len) {
                  if (o + len > int64_t(bytes.size())) {
                    throw DataError(fmt::format("{}: corrupt or truncated shard at offset {}: "
                                                "the file ends at {}", where, o, bytes.size()));
                  }
                  return bytes.substr(static_cast<size_t>(o), static_cast<size_t>(len));
                },
                static_cast<int64_t>(bytes.size()), where, [&](const Record& r, int64_t offset) {
                  ++n;
                  if (r.label < 0 || r.label >= int64_t(m.classes.size())) {
                    throw DataError(fmt::format("{}: record '{}' at offset {} has label {} of {} classes",
                                                where, r.key, offset, r.label, m.classes.size()));
                  }
                  if (decode && m.encoding == "image") {
                    try {
                      decodeImage(reinterpret_cast<const uint8_t*>(r.payload.data()), r.payload.size(), t,
                                  0, px.data());
                    } catch (const DataError& e) {
                      out << fmt::format("{}: image '{}' at offset {} does not decode: {}\n", where, r.key,
                                         offset, e.what());
                      ++undecodable;
                    }
                  }
                });
      if (n != info.records) {
        out << fmt::format("{}: {} records, dataset.json says {}\n", where, n, info.records);
        ++problems;
      } else {
        out << fmt::format("{}: ok, {} records\n", where, n);
      }
    } catch (const Error& e) {
      out << e.what() << "\n";
      ++problems;
    }
  }
  const bool bad = problems > 0 || undecodable > 0;
  out << fmt::format("{}: {} shards, {} records: {}\n", source.describe(), m.shards.size(), m.records(),
                     bad ? fmt::format("{} shard problems, {} undecodable images", problems, undecodable)
                         : std::string("valid"));
  return bad ? 1 : 0;
}

}  // namespace cohort::data
