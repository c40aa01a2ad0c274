#include "cohort/security/sealed.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <filesystem>

#include "cohort/core/error.h"
#include "cohort/core/fd.h"

namespace cohort::security {
namespace {

constexpr char kMagic[8] = {'C', 'O', 'H', 'O', 'R', 'T', 'S', 'E'};
constexpr uint32_t kVersion = 1;        // size known in advance, authenticated
constexpr uint32_t kStreamVersion = 2;  // size written last (StreamSealer)
constexpr size_t kNonce = 12, kTag = 16;

void putLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t getLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::string hex(const char* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += fmt::format("{:02x}", static_cast<unsigned char>(p[i]));
  return s;
}

// The per-chunk associated data: header, label, index, last-chunk flag.
std::string aadPrefix(const std::string& header, const std::string& label) {
  std::string a = header;
  putLe(a, label.size(), 4);
  a += label;
  return a;
}
void appendChunkAad(std::string& aad, uint64_t index, bool last) {
  putLe(aad, index, 8);
  aad.push_back(last ? 1 : 0);
}

uint64_t chunkCount(uint64_t plain, uint32_t chunk) {
  return plain == 0 ? 1 : (plain + chunk - 1) / chunk;
}

struct Ctx {
  Ctx() : ctx(EVP_CIPHER_CTX_new()) {
    if (ctx == nullptr) throw Error("cannot create an AES-GCM context");
  }
  ~Ctx() { EVP_CIPHER_CTX_free(ctx); }
  EVP_CIPHER_CTX* ctx;
};

void readAt(int fd, char* out, uint64_t size, uint64_t offset, const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::pread(fd, out, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw IoError(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
    if (n == 0) throw DataError(fmt::format("{}: truncated at byte {}", path, offset));
    out += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

// What a sealed file's header says, checked against the file's size.
struct Layout {
  uint32_t version = 0;
  uint32_t chunkBytes = 0;
  uint64_t plainBytes = 0;
  uint64_t chunks = 0;
  std::string keyId;  // hex
  std::string aadPrefix;

  uint64_t plainLength(uint64_t i) const {
    return std::min<uint64_t>(chunkBytes, plainBytes - i * chunkBytes);
  }
  uint64_t chunkOffset(uint64_t i) const {
    return kSealedHeaderBytes + i * (uint64_t{chunkBytes} + kNonce + kTag);
  }
};

// Version 1 authenticates the whole header; version 2 (streamed: the size
// is written last) the header with its plaintext size zeroed. The size is
// still bound: given the chunk size, only one plaintext size fits the
// file's size, which is checked.
std::string authenticatedHeader(std::string header, uint32_t version) {
  if (version == kStreamVersion) std::fill(header.begin() + 16, header.begin() + 24, '\0');
  return header;
}

Layout parseLayout(const std::string& header, uint64_t fileSize, const std::string& label,
                   const std::string& name) {
  if (fileSize < kSealedHeaderBytes) {
    throw DataError(fmt::format("{}: too short to be an encrypted file ({} bytes)", name, fileSize));
  }
  if (!isSealed(header.data(), header.size())) {
    throw DataError(fmt::format("{}: not an encrypted file", name));
  }
  Layout l;
  l.version = static_cast<uint32_t>(getLe(header.data() + 8, 4));
  if (l.version != kVersion && l.version != kStreamVersion) {
    throw DataError(fmt::format("{}: encryption format version {} is not one this cohort reads "
                                "({} or {})",
                                name, l.version, kVersion, kStreamVersion));
  }
  l.chunkBytes = static_cast<uint32_t>(getLe(header.data() + 12, 4));
  l.plainBytes = getLe(header.data() + 16, 8);
  if (l.chunkBytes == 0 || l.chunkBytes > (256u << 20)) {
    throw DataError(fmt::format("{}: damaged header (chunk size {})", name, l.chunkBytes));
  }
  if (l.plainBytes > fileSize) {
    throw DataError(fmt::format("{}: truncated: the header says {} bytes, the file has {}", name,
                                l.plainBytes, fileSize));
  }
  l.chunks = chunkCount(l.plainBytes, l.chunkBytes);
  const uint64_t expected = kSealedHeaderBytes + l.plainBytes + l.chunks * (kNonce + kTag);
  if (fileSize != expected) {
    throw DataError(fmt::format("{}: {}: the file has {} bytes, its header says {}", name,
                                fileSize < expected ? "truncated" : "extended", fileSize, expected));
  }
  l.keyId = hex(header.data() + 24, 16);
  l.aadPrefix = aadPrefix(authenticatedHeader(header, l.version), label);
  return l;
}

const Key& keyFor(const Layout& l, const Keyring* keys, const std::string& name) {
  if (keys == nullptr) {
    throw ConfigError(fmt::format(
        "{} is encrypted (key id {}): give its key (security.encryption.key_file or key_env; "
        "--key-file for cohort ckpt and cohort data commands)",
        name, l.keyId));
  }
  const Key* key = keys->find(l.keyId);
  if (key == nullptr) {
    throw DataError(fmt::format(
        "{} is encrypted with key id {}, which is neither the current key ({}) nor the previous "
        "one{}",
        name, l.keyId, keys->current.id, keys->previous ? " (" + keys->previous->id + ")" : ""));
  }
  return *key;
}

// Decrypts and authenticates chunk i (`sealed`: nonce, ciphertext, tag) into
// `out` (plainLength(i) bytes).
void openChunk(EVP_CIPHER_CTX* c, const Layout& l, const Key& key, uint64_t i,
               const std::string& sealed, char* out, const std::string& name,
               const std::string& label) {
  const uint64_t n = l.plainLength(i);
  std::string aad = l.aadPrefix;
  appendChunkAad(aad, i, i + 1 == l.chunks);
  int len = 0;
  const auto* in = reinterpret_cast<const unsigned char*>(sealed.data());
  bool ok = sealed.size() == kNonce + n + kTag &&
            EVP_DecryptInit_ex(c, EVP_aes_256_gcm(), nullptr, key.bytes.data(), in) == 1 &&
            EVP_DecryptUpdate(c, nullptr, &len, reinterpret_cast<const unsigned char*>(aad.data()),
                              static_cast<int>(aad.size())) == 1;
  uint64_t done = 0;
  while (ok && done < n) {
    const int step = static_cast<int>(std::min<uint64_t>(n - done, 1u << 30));
    ok = EVP_DecryptUpdate(c, reinterpret_cast<unsigned char*>(out + done), &len, in + kNonce + done,
                           step) == 1;
    done += static_cast<uint64_t>(step);
  }
  ok = ok && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, kTag,
                                 const_cast<unsigned char*>(in + kNonce + n)) == 1;
  ok = ok && EVP_DecryptFinal_ex(c, reinterpret_cast<unsigned char*>(out + done), &len) == 1;
  if (!ok) {
    throw DataError(fmt::format(
        "{}: chunk {} of {} fails authentication: the file was modified, damaged, or moved from "
        "another place (it was sealed as another file than {})",
        name, i, l.chunks, label));
  }
}

// Seals `n` bytes as chunk i into `out` (nonce, ciphertext, tag).
void sealChunk(EVP_CIPHER_CTX* c, const Key& key, const std::string& aadPrefixText, uint64_t i,
               bool last, const void* plain, uint64_t n, char* out) {
  auto* o = reinterpret_cast<unsigned char*>(out);
  // A fresh random nonce per chunk: 2^-32 collision odds only after ~2^32
  // chunks (16 PB at 4 MiB) under one key.
  if (RAND_bytes(o, kNonce) != 1) throw Error("no random bytes for an encryption nonce");
  std::string aad = aadPrefixText;
  appendChunkAad(aad, i, last);
  int len = 0;
  bool ok = EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), nullptr, key.bytes.data(), o) == 1 &&
            EVP_EncryptUpdate(c, nullptr, &len, reinterpret_cast<const unsigned char*>(aad.data()),
                              static_cast<int>(aad.size())) == 1;
  const auto* in = static_cast<const unsigned char*>(plain);
  uint64_t done = 0;
  while (ok && done < n) {
    const int step = static_cast<int>(std::min<uint64_t>(n - done, 1u << 30));
    ok = EVP_EncryptUpdate(c, o + kNonce + done, &len, in + done, step) == 1;
    done += static_cast<uint64_t>(step);
  }
  ok = ok && EVP_EncryptFinal_ex(c, o + kNonce + done, &len) == 1;
  ok = ok && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, kTag, o + kNonce + n) == 1;
  if (!ok) throw Error("AES-256-GCM encryption failed");
}

// The 64-byte header of a new file sealed with `key`.
std::string newHeader(const Key& key, uint32_t version, uint32_t chunkBytes, uint64_t plainBytes) {
  std::string h(kMagic, sizeof kMagic);
  putLe(h, version, 4);
  putLe(h, chunkBytes, 4);
  putLe(h, plainBytes, 8);
  for (size_t i = 0; i < 16; ++i) {
    h.push_back(static_cast<char>(std::stoi(key.id.substr(2 * i, 2), nullptr, 16)));
  }
  unsigned char fileId[16];
  if (RAND_bytes(fileId, sizeof fileId) != 1) throw Error("no random bytes for an encrypted file's id");
  h.append(reinterpret_cast<const char*>(fileId), sizeof fileId);
  h.append(8, '\0');
  return h;
}

// An open sealed file on disk: header checked, key found; chunks opened one by one.
class Opener {
 public:
  Opener(const std::string& path, const Keyring* keys)
      : path_(path), label_(sealedLabel(path)), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_.get() < 0) throw IoError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) throw IoError(fmt::format("cannot stat {}: {}", path, std::strerror(errno)));
    const uint64_t fileSize = static_cast<uint64_t>(st.st_size);
    std::string header(std::min<uint64_t>(fileSize, kSealedHeaderBytes), '\0');
    readAt(fd_.get(), header.data(), header.size(), 0, path);
    layout_ = parseLayout(header, fileSize, label_, path);
    key_ = &keyFor(layout_, keys, path);
  }

  uint64_t plainBytes() const { return layout_.plainBytes; }
  uint64_t chunks() const { return layout_.chunks; }
  uint64_t plainLength(uint64_t i) const { return layout_.plainLength(i); }

  void open(uint64_t i, char* out) {
    buffer_.resize(kNonce + layout_.plainLength(i) + kTag);
    readAt(fd_.get(), buffer_.data(), buffer_.size(), layout_.chunkOffset(i), path_);
    openChunk(ctx_.ctx, layout_, *key_, i, buffer_, out, path_, label_);
  }

 private:
  std::string path_, label_;
  UniqueFd fd_;
  Layout layout_;
  std::string buffer_;
  const Key* key_ = nullptr;
  Ctx ctx_;
};

}  // namespace

std::string sealedLabel(const std::string& path) {
  const std::filesystem::path p(path);
  const std::string parent = p.parent_path().filename().string();
  return parent.empty() ? p.filename().string() : parent + "/" + p.filename().string();
}

bool isSealed(const void* head, size_t size) {
  return size >= sizeof kMagic && std::memcmp(head, kMagic, sizeof kMagic) == 0;
}

bool isSealedFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  char head[sizeof kMagic];
  return fd.get() >= 0 && ::pread(fd.get(), head, sizeof head, 0) == static_cast<ssize_t>(sizeof head) &&
         isSealed(head, sizeof head);
}

struct Sealer::Cipher {
  Ctx ctx;
  const Key* key;
};

Sealer::Sealer(const Key& key, const std::string& label, uint64_t plainBytes, uint32_t chunkBytes)
    : plainBytes_(plainBytes),
      chunks_(chunkCount(plainBytes, chunkBytes)),
      chunkBytes_(chunkBytes),
      cipher_(new Cipher{Ctx(), &key}) {
  header_ = newHeader(key, kVersion, chunkBytes, plainBytes);
  aadPrefix_ = aadPrefix(header_, label);
}

Sealer::~Sealer() { delete cipher_; }

uint64_t Sealer::plainLength(uint64_t i) const {
  return std::min<uint64_t>(chunkBytes_, plainBytes_ - i * chunkBytes_);
}

uint64_t Sealer::sealedBytes() const { return kSealedHeaderBytes + plainBytes_ + chunks_ * (kNonce + kTag); }

uint64_t Sealer::sealedLength(uint64_t i) const { return kNonce + plainLength(i) + kTag; }

void Sealer::seal(uint64_t i, const void* plain, std::string& out) {
  out.resize(sealedLength(i));
  seal(i, plain, out.data());
}

void Sealer::seal(uint64_t i, const void* plain, char* out) {
  sealChunk(cipher_->ctx.ctx, *cipher_->key, aadPrefix_, i, i + 1 == chunks_, plain,
            plainLength(i), out);
}

struct StreamSealer::Cipher {
  Ctx ctx;
  Key key;
};

StreamSealer::StreamSealer(const Key& key, const std::string& label, uint32_t chunkBytes)
    : chunkBytes_(chunkBytes), cipher_(new Cipher{Ctx(), key}) {
  header_ = newHeader(key, kStreamVersion, chunkBytes, 0);
  aadPrefix_ = aadPrefix(header_, label);
}

StreamSealer::~StreamSealer() { delete cipher_; }

std::string StreamSealer::finalHeader(uint64_t plainBytes) const {
  std::string h = header_;
  for (int i = 0; i < 8; ++i) h[16 + i] = static_cast<char>(plainBytes >> (8 * i));
  return h;
}

void StreamSealer::seal(uint64_t i, const void* plain, size_t size, bool last, std::string& out) {
  if (size > chunkBytes_ || (!last && size != chunkBytes_)) {
    throw Error(fmt::format("sealing chunk {}: {} bytes where the chunk size is {}", i, size,
                            chunkBytes_));
  }
  out.resize(kNonce + size + kTag);
  sealChunk(cipher_->ctx.ctx, cipher_->key, aadPrefix_, i, last, plain, size, out.data());
}

struct SealedReader::State {
  Layout layout;
  Key key;
};

SealedReader::SealedReader(ReadRaw raw, uint64_t sealedBytes, const std::string& label,
                           const Keyring* keys, const std::string& name)
    : raw_(std::move(raw)), label_(label), name_(name) {
  const std::string header = raw_(0, std::min<uint64_t>(sealedBytes, kSealedHeaderBytes));
  auto state = std::make_shared<State>();
  state->layout = parseLayout(header, sealedBytes, label, name);
  state->key = keyFor(state->layout, keys, name);
  state_ = std::move(state);
}

uint64_t SealedReader::plainBytes() const { return state_->layout.plainBytes; }

std::string SealedReader::read(uint64_t offset, uint64_t length) const {
  const Layout& l = state_->layout;
  if (offset > l.plainBytes || length > l.plainBytes - offset) {
    throw DataError(fmt::format("{}: {} bytes at offset {} are past its end ({} bytes)", name_,
                                length, offset, l.plainBytes));
  }
  std::string out;
  if (length == 0) return out;
  out.reserve(length);
  const uint64_t first = offset / l.chunkBytes;
  const uint64_t last = (offset + length - 1) / l.chunkBytes;
  // The covering chunks in one raw read (one ranged GET for blob storage).
  const uint64_t rawBegin = l.chunkOffset(first);
  const uint64_t rawEnd = l.chunkOffset(last) + kNonce + l.plainLength(last) + kTag;
  const std::string sealed = raw_(rawBegin, rawEnd - rawBegin);
  if (sealed.size() != rawEnd - rawBegin) {
    throw DataError(fmt::format("{}: short read of chunks {}-{}", name_, first, last));
  }
  Ctx ctx;
  std::string chunk, plain;
  for (uint64_t i = first; i <= last; ++i) {
    const uint64_t n = l.plainLength(i);
    chunk.assign(sealed, l.chunkOffset(i) - rawBegin, kNonce + n + kTag);
    plain.resize(n);
    openChunk(ctx.ctx, l, state_->key, i, chunk, plain.data(), name_, label_);
    const uint64_t from = i == first ? offset - i * l.chunkBytes : 0;
    const uint64_t to = std::min<uint64_t>(n, offset + length - i * l.chunkBytes);
    out.append(plain, from, to - from);
  }
  return out;
}

std::string sealBytes(const Key& key, const std::string& label, const void* data, size_t size) {
  Sealer s(key, label, size);
  std::string out = s.header(), chunk;
  out.reserve(s.sealedBytes());
  const char* p = static_cast<const char*>(data);
  for (uint64_t i = 0; i < s.chunks(); ++i) {
    s.seal(i, p, chunk);
    out += chunk;
    p += s.plainLength(i);
  }
  return out;
}

std::string readSealedFile(const std::string& path, const Keyring* keys) {
  Opener o(path, keys);
  std::string plain(o.plainBytes(), '\0');
  uint64_t offset = 0;
  for (uint64_t i = 0; i < o.chunks(); ++i) {
    o.open(i, plain.data() + offset);
    offset += o.plainLength(i);
  }
  return plain;
}

void verifySealedFile(const std::string& path, const Keyring* keys) {
  Opener o(path, keys);
  std::string chunk;
  for (uint64_t i = 0; i < o.chunks(); ++i) {
    chunk.resize(o.plainLength(i));
    o.open(i, chunk.data());
  }
}

}  // namespace cohort::security
