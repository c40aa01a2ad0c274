#pragma once

// Sealed files: any file encrypted at rest with AES-256-GCM in chunks, so
// that a large file streams through a fixed buffer and each chunk is
// authenticated on its own. docs/encryption-format.md is the contract:
//
//   header (64 bytes): "COHORTSE", u32 version, u32 chunk bytes,
//                      u64 plaintext bytes, key id (16), file id (16), 0 (8)
//   chunk i:           nonce (12, fresh random) | ciphertext | tag (16)
//
// Each chunk's additional authenticated data is the header, the file's label
// (its parent directory's name and its own: "step-120/model.bin"), the
// chunk's index and whether it is the last: a chunk moved within a file or
// to another file, a file moved to another checkpoint, a changed header and
// a truncated or extended file all fail to open.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "cohort/security/keys.h"

namespace cohort::security {

inline constexpr size_t kSealedHeaderBytes = 64;
inline constexpr uint32_t kDefaultChunkBytes = 4u << 20;
// Files read at random offsets (packed shards): a record read decrypts
// little more than itself.
inline constexpr uint32_t kRandomAccessChunkBytes = 64u << 10;

// What a file at `path` is authenticated as: "<parent dir name>/<file name>".
std::string sealedLabel(const std::string& path);

// True when `head` (at least 8 bytes of a file's start) is a sealed file's.
bool isSealed(const void* head, size_t size);
// True when the file at `path` starts like a sealed file (false if unreadable).
bool isSealedFile(const std::string& path);

// Seals `plainBytes` bytes chunk by chunk, for a writer that streams them.
class Sealer {
 public:
  Sealer(const Key& key, const std::string& label, uint64_t plainBytes,
         uint32_t chunkBytes = kDefaultChunkBytes);
  ~Sealer();
  Sealer(const Sealer&) = delete;
  Sealer& operator=(const Sealer&) = delete;

  const std::string& header() const { return header_; }  // the file's first bytes
  uint64_t chunks() const { return chunks_; }
  uint64_t plainLength(uint64_t chunk) const;  // plaintext bytes of chunk i
  uint64_t sealedBytes() const;                // the whole file's size
  uint64_t sealedLength(uint64_t chunk) const;  // bytes of chunk i on disk
  // Seals chunk `i` (plainLength(i) bytes at `plain`) into `out`, replacing
  // its contents, or into the sealedLength(i) bytes at `out`. Throws Error
  // if the cipher fails.
  void seal(uint64_t i, const void* plain, std::string& out);
  void seal(uint64_t i, const void* plain, char* out);

 private:
  struct Cipher;
  std::string header_, aadPrefix_;
  uint64_t plainBytes_, chunks_;
  uint32_t chunkBytes_;
  Cipher* cipher_;
};

// Seals a file streamed chunk by chunk whose size is not known in advance
// (format version 2): write header() first, then every chunk in order, the
// last one flagged (it may be short, or empty when the file is), then
// finalHeader(total plaintext bytes) over the first 64 bytes. The size field
// is left out of the authenticated data; the file's size binds it.
class StreamSealer {
 public:
  StreamSealer(const Key& key, const std::string& label, uint32_t chunkBytes);
  ~StreamSealer();
  StreamSealer(const StreamSealer&) = delete;
  StreamSealer& operator=(const StreamSealer&) = delete;

  const std::string& header() const { return header_; }
  std::string finalHeader(uint64_t plainBytes) const;
  uint32_t chunkBytes() const { return chunkBytes_; }
  // Seals chunk `i`: exactly chunkBytes() bytes unless it is the last.
  void seal(uint64_t i, const void* plain, size_t size, bool last, std::string& out);

 private:
  struct Cipher;
  std::string header_, aadPrefix_;
  uint32_t chunkBytes_;
  Cipher* cipher_;
};

// Random access to a sealed file's plaintext through a reader of its raw
// bytes (a local file, a cache, ranged GETs): read() fetches the chunks that
// cover the range in one raw read and authenticates each. `label` is what the
// file was sealed as; `name` names it in messages. Thread-safe. Throws as
// readSealedFile, and DataError for a range past the end.
class SealedReader {
 public:
  using ReadRaw = std::function<std::string(uint64_t offset, uint64_t length)>;
  SealedReader(ReadRaw raw, uint64_t sealedBytes, const std::string& label, const Keyring* keys,
               const std::string& name);
  uint64_t plainBytes() const;
  std::string read(uint64_t offset, uint64_t length) const;

 private:
  struct State;
  ReadRaw raw_;
  std::string label_, name_;
  std::shared_ptr<const State> state_;
};

// The whole of `data` sealed, as a string (for small files such as the final
// model): header and every chunk.
std::string sealBytes(const Key& key, const std::string& label, const void* data, size_t size);

// Reads the sealed file at `path` and returns its plaintext. Throws DataError
// naming the path (and the chunk) when it is not sealed, truncated or
// extended, tampered with, sealed for another place (label), or sealed with
// a key `keys` lacks (naming the key id); ConfigError when `keys` is null.
std::string readSealedFile(const std::string& path, const Keyring* keys);

// Authenticates every chunk of the sealed file at `path` without keeping the
// plaintext (one chunk in memory). Throws as readSealedFile.
void verifySealedFile(const std::string& path, const Keyring* keys);

}  // namespace cohort::security
