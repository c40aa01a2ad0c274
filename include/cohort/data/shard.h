#pragma once

// The sharded record format (docs/shard-format.md): a dataset is a directory
// (or blob prefix) holding `dataset.json` and shard files. A shard is
//
//   header  "COHORTSH" u32 version u32 header_bytes
//   records record_header key payload, one after another
//   index   u64 offset of each record, in order
//   footer  "COHORTIX" u32 version u32 reserved u64 count u64 index_offset
//           u64 index_checksum "COHORTSH"
//
// with little-endian integers. A record header is
//   "CREC" u32 key_bytes u64 payload_bytes i64 label u64 checksum
// where the checksum is XXH3-64 over the label, key and payload. Records can
// be read in order from the start (streaming) or through the index (random
// access); the footer sits at a fixed distance from the end.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace cohort::security {
struct Key;
class StreamSealer;
}  // namespace cohort::security

namespace cohort::data {

constexpr uint32_t kShardVersion = 1;
constexpr int64_t kShardHeaderBytes = 16;
constexpr int64_t kRecordHeaderBytes = 32;
constexpr int64_t kShardFooterBytes = 48;
constexpr int64_t kMaxKeyBytes = 4096;
constexpr int64_t kMaxPayloadBytes = int64_t{1} << 30;

struct Record {
  std::string key;
  int64_t label = 0;
  std::string payload;
};

// Writes one shard to a local file. Not thread-safe; one writer per shard.
// With a key, the file is sealed as it is written (security/sealed.h, in
// kRandomAccessChunkBytes chunks, authenticated as `label`, the shard's
// name): no plaintext reaches the disk.
class ShardWriter {
 public:
  // Throws IoError naming `path`.
  explicit ShardWriter(const std::string& path, const security::Key* key = nullptr,
                       const std::string& label = "");
  ~ShardWriter();  // an unfinished shard is removed
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  void add(const std::string& key, int64_t label, const void* payload, size_t size);
  // Writes index and footer, fsyncs and closes. Returns the file's size
  // (sealed, with a key).
  int64_t finish();
  int64_t records() const { return static_cast<int64_t>(offsets_.size()); }
  int64_t bytes() const { return offset_; }

 private:
  void write(const void* data, size_t size);
  void flush(bool last = false);  // the buffer to the file (sealed: whole chunks but the last)
  void writeOut(const char* data, size_t size);

  std::string path_;
  std::unique_ptr<security::StreamSealer> sealer_;
  uint64_t chunk_ = 0;       // next chunk to seal
  int64_t fileBytes_ = 0;    // written to the file so far
  int fd_ = -1;
  int64_t offset_ = 0;
  std::vector<uint64_t> offsets_;
  std::string buffer_;
};

// Reads `length` bytes at `offset` of one shard; throws on short reads.
using ReadAt = std::function<std::string(int64_t offset, int64_t length)>;

// Where each record of a shard is: record r spans [begin(r), end(r)).
struct ShardIndex {
  std::vector<int64_t> offsets;  // of each record's header
  int64_t recordsEnd = 0;        // where the last record ends: the index's offset
  size_t size() const { return offsets.size(); }
  int64_t begin(size_t r) const { return offsets[r]; }
  int64_t end(size_t r) const { return r + 1 < offsets.size() ? offsets[r + 1] : recordsEnd; }
};

// A shard's index, from its footer. `fileBytes` is the shard's size. Throws
// DataError naming `shardName` and the offset of what is wrong (bad magic,
// version, index checksum, offsets out of range).
ShardIndex readShardIndex(const ReadAt& read, int64_t fileBytes, const std::string& shardName);

// Parses the record header at the start of `bytes` (kRecordHeaderBytes or
// more); returns the record's total size (header + key + payload). Throws
// DataError naming the shard and `offset`.
struct RecordHeader {
  int64_t keyBytes = 0;
  int64_t payloadBytes = 0;
  int64_t label = 0;
  uint64_t checksum = 0;
  int64_t totalBytes() const { return kRecordHeaderBytes + keyBytes + payloadBytes; }
};
RecordHeader parseRecordHeader(const std::string& bytes, int64_t offset,
                               const std::string& shardName);

// Parses a whole record (header + key + payload, as parseRecordHeader sized
// it) and verifies its checksum. Throws DataError naming the shard and offset.
Record parseRecord(const std::string& bytes, int64_t offset, const std::string& shardName);

// Reads every record of a shard in order from the start, verifying each, and
// calls `visit` with the record and its offset. Checks the index and footer
// against what it read. Throws DataError naming the shard and offset.
void scanShard(const ReadAt& read, int64_t fileBytes, const std::string& shardName,
               const std::function<void(const Record&, int64_t offset)>& visit);

}  // namespace cohort::data
