// `cohort data tokenize`: text into token datasets (docs/token-format.md).

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "cohort/ckpt/manifest.h"
#include "cohort/core/checksum.h"
#include "cohort/core/error.h"
#include "cohort/data/tokens.h"
#include "cohort/core/time.h"
#include "data/detail/destination.h"

namespace cohort::data {

namespace fs = std::filesystem;

std::vector<int64_t> encodeText(const std::string& tokenizer, const std::string& text) {
  if (tokenizer != kByteTokenizer) {
    throw DataError(fmt::format("tokenizer '{}' is not known to this build (it has: {})", tokenizer,
                                kByteTokenizer));
  }
  std::vector<int64_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string decodeTokens(const std::string& tokenizer, const std::vector<int64_t>& tokens) {
  if (tokenizer != kByteTokenizer) {
    throw DataError(fmt::format("tokenizer '{}' is not known to this build (it has: {})", tokenizer,
                                kByteTokenizer));
  }
  std::string out(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= kByteVocabSize) {
      throw DataError(fmt::format("token {} is not a byte", tokens[i]));
    }
    out[i] = static_cast<char>(tokens[i]);
  }
  return out;
}

namespace {

// Writes one token dataset: tokens go into shard files of at most
// `shardTokens` each; finish() writes dataset.json.
class TokenDatasetWriter {
 public:
  TokenDatasetWriter(const std::string& dst, const std::string& name, const std::string& source,
                     const TokenizeOptions& options)
      : out_(dst, options.storage), shardTokens_(options.shardTokens) {
    m_.name = name;
    m_.encoding = "tokens";
    m_.tokenizer = kByteTokenizer;
    m_.vocabSize = kByteVocabSize;
    m_.source = source;
  }

  void add(const unsigned char* bytes, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (!file_) open();
      buffer_.push_back(static_cast<char>(bytes[i]));  // byte tokens: the id's low byte,
      buffer_.push_back('\0');                         // then its high byte
      if (buffer_.size() >= (1u << 20)) flushBuffer();
      if (++inShard_ == shardTokens_) close();
    }
  }

  DatasetManifest finish() {
    if (file_) close();
    m_.created = utcNow();
    out_.writeManifest(datasetManifestJson(m_));
    return m_;
  }

 private:
  std::string shardName() const { return fmt::format("tokens-{:05d}.bin", m_.shards.size()); }

  void open() {
    const std::string path = out_.scratch(shardName());
    file_ = std::make_unique<std::ofstream>(path, std::ios::binary | std::ios::trunc);
    if (!*file_) throw IoError(fmt::format("{}: cannot create", path));
    char header[kTokenShardHeaderBytes] = {};
    std::copy(kTokenShardMagic, kTokenShardMagic + 8, header);
    header[8] = static_cast<char>(kTokenShardVersion);
    header[12] = static_cast<char>(kTokenShardHeaderBytes);
    file_->write(header, sizeof(header));
    inShard_ = 0;
  }

  void flushBuffer() {
    file_->write(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
    buffer_.clear();
  }

  void close() {
    flushBuffer();
    const std::string name = shardName();
    const std::string path = out_.scratch(name);
    file_->close();
    if (!*file_) throw IoError(fmt::format("{}: write failed", path));
    file_.reset();
    ShardInfo info;
    info.name = name;
    info.records = inShard_;
    uint64_t size = 0;
    info.checksum = checksumFile(path, &size);
    info.bytes = static_cast<int64_t>(size);
    out_.put(name);
    m_.shards.push_back(std::move(info));
  }

  detail::Destination out_;
  int64_t shardTokens_;
  DatasetManifest m_;
  std::unique_ptr<std::ofstream> file_;
  std::string buffer_;
  int64_t inShard_ = 0;
};

std::vector<std::string> textFiles(const std::string& src) {
  std::error_code ec;
  if (fs::is_regular_file(src, ec)) return {src};
  if (!fs::is_directory(src, ec)) throw DataError(fmt::format("{}: no such file or folder", src));
  std::vector<std::string> files;
  for (auto it = fs::recursive_directory_iterator(src, ec); !ec && it != fs::end(it); it.increment(ec)) {
    if (it->is_regular_file()) files.push_back(it->path().string());
  }
  if (ec) throw DataError(fmt::format("{}: cannot list: {}", src, ec.message()));
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TokenizeResult tokenize(const std::string& src, const std::string& dst,
                        const TokenizeOptions& options, std::istream& in) {
  if (!(options.valFraction >= 0 && options.valFraction < 1)) {
    throw UsageError(fmt::format("--val-fraction: must be in [0, 1), got {}", options.valFraction));
  }
  if (options.shardTokens < 1) {
    throw UsageError(fmt::format("--shard-tokens: must be >= 1, got {}", options.shardTokens));
  }
  // The whole stream's length decides where the held-out tail starts: files
  // are measured first; standard input is read into memory.
  std::vector<std::string> files;
  std::string piped;
  int64_t total = 0;
  if (src == "-") {
    piped.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    total = static_cast<int64_t>(piped.size());
  } else {
    files = textFiles(src);
    for (const auto& f : files) total += static_cast<int64_t>(fs::file_size(f));
  }
  if (total == 0) {
    throw DataError(fmt::format("{}: no text to tokenize ({})", src == "-" ? "standard input" : src,
                                files.empty() && src != "-" ? "no files" : "0 bytes"));
  }
  const int64_t valTokens = std::llround(static_cast<double>(total) * options.valFraction);
  const int64_t trainTokens = total - valTokens;
  if (trainTokens == 0) throw UsageError("--val-fraction leaves no training tokens");
  const std::string source = src == "-" ? "standard input" : fs::absolute(src).string();
  const std::string base = storage::isRemoteUrl(dst) ? dst : fs::absolute(dst).string();
  // joinUrl keeps a SAS query at the end of a blob URL.
  const std::string trainDst = storage::isRemoteUrl(dst) ? storage::joinUrl(base, "train") : base + "/train";
  const std::string valDst = storage::isRemoteUrl(dst) ? storage::joinUrl(base, "val") : base + "/val";
  TokenDatasetWriter train(trainDst, "train", source, options);
  std::unique_ptr<TokenDatasetWriter> val;
  if (valTokens > 0) {
    val = std::make_unique<TokenDatasetWriter>(valDst, "val", source, options);
  } else {
    // No validation set: one left from an earlier tokenize stops being one.
    detail::Destination stale(valDst, options.storage);
  }

  int64_t written = 0;
  auto feed = [&](const unsigned char* p, size_t n) {
    const size_t toTrain = static_cast<size_t>(std::clamp<int64_t>(trainTokens - written, 0, n));
    train.add(p, toTrain);
    if (n > toTrain) val->add(p + toTrain, n - toTrain);
    written += static_cast<int64_t>(n);
  };
  const bool terminal = options.progress && ::isatty(STDERR_FILENO) != 0;
  auto report = [&] {
    if (terminal) std::cerr << fmt::format("\rtokenizing: {:.1f} of {:.1f} MB", written / 1e6, total / 1e6) << std::flush;
  };
  if (src == "-") {
    feed(reinterpret_cast<const unsigned char*>(piped.data()), piped.size());
  } else {
    std::vector<char> buf(1 << 20);
    for (const auto& f : files) {
      std::ifstream is(f, std::ios::binary);
      if (!is) throw DataError(fmt::format("{}: cannot open", f));
      while (is) {
        is.read(buf.data(), static_cast<std::streamsize>(buf.size()));
        const auto n = static_cast<size_t>(is.gcount());
        if (n == 0) break;
        // A file that grew since it was measured: the split was computed
        // for its old size.
        if (written + static_cast<int64_t>(n) > total) {
          throw DataError(fmt::format("{}: changed while being tokenized", f));
        }
        feed(reinterpret_cast<const unsigned char*>(buf.data()), n);
      }
      if (is.bad()) throw DataError(fmt::format("{}: read failed", f));
      report();
    }
    if (written != total) throw DataError(fmt::format("{}: changed while being tokenized", src));
  }
  if (terminal) std::cerr << "\n";
  TokenizeResult r;
  r.files = src == "-" ? 1 : static_cast<int64_t>(files.size());
  r.train = train.finish();
  if (val) r.val = val->finish();
  return r;
}

}  // namespace cohort::data
