#include "cohort/data/shard.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cohort/core/checksum.h"
#include "cohort/core/error.h"
#include "cohort/security/sealed.h"

namespace cohort::data {
namespace {

constexpr char kShardMagic[8] = {'C', 'O', 'H', 'O', 'R', 'T', 'S', 'H'};
constexpr char kIndexMagic[8] = {'C', 'O', 'H', 'O', 'R', 'T', 'I', 'X'};
constexpr char kRecordMagic[4] = {'C', 'R', 'E', 'C'};

template <typename T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // the format is little-endian, as is every host cohort runs on
  out.append(b, sizeof(T));
}

template <typename T>
T get(const std::string& in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof(T));
  return v;
}

uint64_t recordChecksum(int64_t label, const char* key, size_t keyBytes, const char* payload,
                        size_t payloadBytes) {
  Hasher h;
  h.update(&label, sizeof(label));
  h.update(key, keyBytes);
  h.update(payload, payloadBytes);
  return h.digest();
}

[[noreturn]] void corrupt(const std::string& shard, int64_t offset, const std::string& what) {
  throw DataError(fmt::format("{}: corrupt or truncated shard at offset {}: {}", shard, offset, what));
}

}  // namespace

ShardWriter::ShardWriter(const std::string& path, const security::Key* key,
                         const std::string& label)
    : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw IoError(fmt::format("{}: cannot create: {}", path, std::strerror(errno)));
  if (key != nullptr) {
    sealer_ = std::make_unique<security::StreamSealer>(*key, label,
                                                       security::kRandomAccessChunkBytes);
    writeOut(sealer_->header().data(), sealer_->header().size());
  }
  std::string header(kShardMagic, 8);
  put<uint32_t>(header, kShardVersion);
  put<uint32_t>(header, static_cast<uint32_t>(kShardHeaderBytes));
  write(header.data(), header.size());
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
}

void ShardWriter::write(const void* data, size_t size) {
  buffer_.append(static_cast<const char*>(data), size);
  offset_ += static_cast<int64_t>(size);
  if (buffer_.size() >= (4u << 20)) flush();
}

void ShardWriter::writeOut(const char* p, size_t left) {
  fileBytes_ += static_cast<int64_t>(left);
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw IoError(fmt::format("{}: write failed: {}", path_, std::strerror(errno)));
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void ShardWriter::flush(bool last) {
  if (!sealer_) {
    writeOut(buffer_.data(), buffer_.size());
    buffer_.clear();
    return;
  }
  // Whole chunks, keeping the end back: the last chunk is sealed as the last.
  const size_t c = sealer_->chunkBytes();
  size_t done = 0;
  std::string sealed;
  while (buffer_.size() - done > c || (last && done < buffer_.size())) {
    const size_t n = std::min(c, buffer_.size() - done);
    const bool isLast = last && done + n == buffer_.size();
    sealer_->seal(chunk_++, buffer_.data() + done, n, isLast, sealed);
    writeOut(sealed.data(), sealed.size());
    done += n;
  }
  buffer_.erase(0, done);
}

void ShardWriter::add(const std::string& key, int64_t label, const void* payload, size_t size) {
  COHORT_ASSERT(fd_ >= 0, "shard already finished: ", path_);
  if (key.size() > static_cast<size_t>(kMaxKeyBytes)) {
    throw DataError(fmt::format("record key longer than {} bytes: {}", kMaxKeyBytes, key.substr(0, 80)));
  }
  if (size > static_cast<size_t>(kMaxPayloadBytes)) {
    throw DataError(fmt::format("record {}: payload of {} bytes is over the limit", key, size));
  }
  offsets_.push_back(static_cast<uint64_t>(offset_));
  std::string h(kRecordMagic, 4);
  put<uint32_t>(h, static_cast<uint32_t>(key.size()));
  put<uint64_t>(h, size);
  put<int64_t>(h, label);
  put<uint64_t>(h, recordChecksum(label, key.data(), key.size(), static_cast<const char*>(payload), size));
  write(h.data(), h.size());
  write(key.data(), key.size());
  write(payload, size);
}

int64_t ShardWriter::finish() {
  const int64_t indexOffset = offset_;
  std::string index;
  for (uint64_t o : offsets_) put<uint64_t>(index, o);
  write(index.data(), index.size());
  std::string footer(kIndexMagic, 8);
  put<uint32_t>(footer, kShardVersion);
  put<uint32_t>(footer, 0);
  put<uint64_t>(footer, offsets_.size());
  put<uint64_t>(footer, static_cast<uint64_t>(indexOffset));
  put<uint64_t>(footer, checksum(index.data(), index.size()));
  footer.append(kShardMagic, 8);
  write(footer.data(), footer.size());
  flush(true);  // write() only flushes past 4 MiB
  if (sealer_) {
    const std::string header = sealer_->finalHeader(static_cast<uint64_t>(offset_));
    if (::pwrite(fd_, header.data(), header.size(), 0) != static_cast<ssize_t>(header.size())) {
      throw IoError(fmt::format("{}: write failed: {}", path_, std::strerror(errno)));
    }
  }
  const bool synced = ::fsync(fd_) == 0;
  const int syncErrno = errno;
  const bool closed = ::close(fd_) == 0;
  fd_ = -1;
  if (!synced || !closed) {
    ::unlink(path_.c_str());
    throw IoError(fmt::format("{}: cannot flush: {}", path_, std::strerror(synced ? errno : syncErrno)));
  }
  return fileBytes_;
}

ShardIndex readShardIndex(const ReadAt& read, int64_t fileBytes, const std::string& shardName) {
  if (fileBytes < kShardHeaderBytes + kShardFooterBytes) {
    corrupt(shardName, 0, fmt::format("{} bytes is too small for a shard", fileBytes));
  }
  const std::string header = read(0, kShardHeaderBytes);
  if (std::memcmp(header.data(), kShardMagic, 8) != 0) corrupt(shardName, 0, "not a cohort shard");
  if (get<uint32_t>(header, 8) != kShardVersion) {
    corrupt(shardName, 8, fmt::format("shard format version {} (this build reads {})",
                                      get<uint32_t>(header, 8), kShardVersion));
  }
  const int64_t footerAt = fileBytes - kShardFooterBytes;
  const std::string footer = read(footerAt, kShardFooterBytes);
  if (std::memcmp(footer.data(), kIndexMagic, 8) != 0 ||
      std::memcmp(footer.data() + 40, kShardMagic, 8) != 0) {
    corrupt(shardName, footerAt, "no shard footer (the file is truncated or not a shard)");
  }
  const uint64_t count = get<uint64_t>(footer, 16);
  const uint64_t indexOffset = get<uint64_t>(footer, 24);
  const uint64_t indexSum = get<uint64_t>(footer, 32);
  if (count > static_cast<uint64_t>(footerAt - kShardHeaderBytes) / 8 ||
      indexOffset < static_cast<uint64_t>(kShardHeaderBytes) ||
      indexOffset + count * 8 != static_cast<uint64_t>(footerAt)) {
    corrupt(shardName, footerAt,
            fmt::format("index of {} records at {} does not end at the footer", count, indexOffset));
  }
  const std::string index = read(static_cast<int64_t>(indexOffset), static_cast<int64_t>(count * 8));
  if (checksum(index.data(), index.size()) != indexSum) {
    corrupt(shardName, static_cast<int64_t>(indexOffset), "index checksum mismatch");
  }
  ShardIndex result;
  result.recordsEnd = static_cast<int64_t>(indexOffset);
  std::vector<int64_t>& offsets = result.offsets;
  offsets.resize(count);
  uint64_t previous = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t o = get<uint64_t>(index, i * 8);
    if (o < static_cast<uint64_t>(kShardHeaderBytes) || o + kRecordHeaderBytes > indexOffset ||
        (i > 0 && o <= previous)) {
      corrupt(shardName, static_cast<int64_t>(indexOffset + i * 8),
              fmt::format("record {} has offset {} outside the records", i, o));
    }
    offsets[i] = static_cast<int64_t>(o);
    previous = o;
  }
  return result;
}

RecordHeader parseRecordHeader(const std::string& bytes, int64_t offset,
                               const std::string& shardName) {
  if (bytes.size() < static_cast<size_t>(kRecordHeaderBytes)) {
    corrupt(shardName, offset, "record header cut short");
  }
  if (std::memcmp(bytes.data(), kRecordMagic, 4) != 0) corrupt(shardName, offset, "no record here");
  RecordHeader h;
  h.keyBytes = get<uint32_t>(bytes, 4);
  const uint64_t payload = get<uint64_t>(bytes, 8);
  h.label = get<int64_t>(bytes, 16);
  h.checksum = get<uint64_t>(bytes, 24);
  if (h.keyBytes > kMaxKeyBytes || payload > static_cast<uint64_t>(kMaxPayloadBytes)) {
    corrupt(shardName, offset, fmt::format("record sizes out of range (key {} bytes, payload {} bytes)",
                                           h.keyBytes, payload));
  }
  h.payloadBytes = static_cast<int64_t>(payload);
  return h;
}

Record parseRecord(const std::string& bytes, int64_t offset, const std::string& shardName) {
  const RecordHeader h = parseRecordHeader(bytes, offset, shardName);
  if (bytes.size() < static_cast<size_t>(h.totalBytes())) {
    corrupt(shardName, offset, fmt::format("record of {} bytes cut short at {}", h.totalBytes(),
                                           bytes.size()));
  }
  const char* key = bytes.data() + kRecordHeaderBytes;
  const char* payload = key + h.keyBytes;
  if (recordChecksum(h.label, key, static_cast<size_t>(h.keyBytes), payload,
                     static_cast<size_t>(h.payloadBytes)) != h.checksum) {
    corrupt(shardName, offset, "record checksum mismatch");
  }
  Record r;
  r.key.assign(key, static_cast<size_t>(h.keyBytes));
  r.label = h.label;
  r.payload.assign(payload, static_cast<size_t>(h.payloadBytes));
  return r;
}

void scanShard(const ReadAt& read, int64_t fileBytes, const std::string& shardName,
               const std::function<void(const Record&, int64_t offset)>& visit) {
  const ShardIndex shardIndex = readShardIndex(read, fileBytes, shardName);
  const std::vector<int64_t>& index = shardIndex.offsets;
  const int64_t indexOffset = shardIndex.recordsEnd;
  int64_t at = kShardHeaderBytes;
  size_t n = 0;
  while (at < indexOffset) {
    if (at + kRecordHeaderBytes > indexOffset) corrupt(shardName, at, "record header runs into the index");
    const RecordHeader h = parseRecordHeader(read(at, kRecordHeaderBytes), at, shardName);
    if (at + h.totalBytes() > indexOffset) corrupt(shardName, at, "record runs into the index");
    if (n >= index.size() || index[n] != at) {
      corrupt(shardName, at, fmt::format("record {} is not where the index puts it", n));
    }
    visit(parseRecord(read(at, h.totalBytes()), at, shardName), at);
    at += h.totalBytes();
    ++n;
  }
  if (n != index.size()) {
    corrupt(shardName, at, fmt::format("{} records found, the index lists {}", n, index.size()));
  }
}

}  // namespace cohort::data
