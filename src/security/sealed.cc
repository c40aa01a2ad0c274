#include "cohort/security/sealed.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "cohort/core/error.h"

namespace cohort::security {
namespace {

constexpr char kMagic[8] = {'C', 'O', 'H', 'O', 'R', 'T', 'S', 'E'};
constexpr uint32_t kVersion = 1;
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

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
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

// An open sealed file: header checked, key found; chunks opened one by one.
class Opener {
 public:
  Opener(const std::string& path, const Keyring* keys) : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_.get() < 0) throw IoError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) throw IoError(fmt::format("cannot stat {}: {}", path, std::strerror(errno)));
    const uint64_t fileSize = static_cast<uint64_t>(st.st_size);
    if (fileSize < kSealedHeaderBytes) {
      throw DataError(fmt::format("{}: too short to be an encrypted file ({} bytes)", path, fileSize));
    }
    header_.resize(kSealedHeaderBytes);
    readAt(fd_.get(), header_.data(), kSealedHeaderBytes, 0, path);
    if (!isSealed(header_.data(), header_.size())) throw DataError(fmt::format("{}: not an encrypted file", path));
    const uint64_t version = getLe(header_.data() + 8, 4);
    if (version != kVersion) {
      throw DataError(fmt::format("{}: encryption format version {} is not one this cohort reads ({})",
                                  path, version, kVersion));
    }
    chunkBytes_ = static_cast<uint32_t>(getLe(header_.data() + 12, 4));
    plainBytes_ = getLe(header_.data() + 16, 8);
    if (chunkBytes_ == 0 || chunkBytes_ > (256u << 20)) {
      throw DataError(fmt::format("{}: damaged header (chunk size {})", path, chunkBytes_));
    }
    if (plainBytes_ > fileSize) {
      throw DataError(fmt::format("{}: truncated: the header says {} bytes, the file has {}", path,
                                  plainBytes_, fileSize));
    }
    chunks_ = chunkCount(plainBytes_, chunkBytes_);
    const uint64_t expected = kSealedHeaderBytes + plainBytes_ + chunks_ * (kNonce + kTag);
    if (fileSize != expected) {
      throw DataError(fmt::format("{}: {}: the file has {} bytes, its header says {}", path,
                                  fileSize < expected ? "truncated" : "extended", fileSize, expected));
    }
    const std::string id = hex(header_.data() + 24, 16);
    if (keys == nullptr) {
      throw ConfigError(fmt::format(
          "{} is encrypted (key id {}): give its key (security.encryption.key_file or key_env; "
          "--key-file for cohort ckpt and cohort data commands)",
          path, id));
    }
    key_ = keys->find(id);
    if (key_ == nullptr) {
      throw DataError(fmt::format(
          "{} is encrypted with key id {}, which is neither the current key ({}) nor the previous "
          "one{}",
          path, id, keys->current.id, keys->previous ? " (" + keys->previous->id + ")" : ""));
    }
    aadPrefix_ = aadPrefix(header_, sealedLabel(path));
  }

  uint64_t plainBytes() const { return plainBytes_; }
  uint64_t chunks() const { return chunks_; }
  uint64_t plainLength(uint64_t i) const {
    return std::min<uint64_t>(chunkBytes_, plainBytes_ - i * chunkBytes_);
  }

  // Decrypts and authenticates chunk i into `out` (plainLength(i) bytes).
  void open(uint64_t i, char* out) {
    const uint64_t n = plainLength(i);
    const uint64_t offset = kSealedHeaderBytes + i * (uint64_t{chunkBytes_} + kNonce + kTag);
    buffer_.resize(kNonce + n + kTag);
    readAt(fd_.get(), buffer_.data(), buffer_.size(), offset, path_);
    std::string aad = aadPrefix_;
    appendChunkAad(aad, i, i + 1 == chunks_);
    EVP_CIPHER_CTX* c = ctx_.ctx;
    int len = 0;
    const auto* in = reinterpret_cast<const unsigned char*>(buffer_.data());
    bool ok = EVP_DecryptInit_ex(c, EVP_aes_256_gcm(), nullptr, key_->bytes.data(), in) == 1 &&
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
          path_, i, chunks_, sealedLabel(path_)));
    }
  }

 private:
  std::string path_;
  Fd fd_;
  std::string header_, aadPrefix_, buffer_;
  uint32_t chunkBytes_ = 0;
  uint64_t plainBytes_ = 0, chunks_ = 0;
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
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
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
  header_.assign(kMagic, sizeof kMagic);
  putLe(header_, kVersion, 4);
  putLe(header_, chunkBytes, 4);
  putLe(header_, plainBytes, 8);
  for (size_t i = 0; i < 16; ++i) {
    header_.push_back(static_cast<char>(std::stoi(key.id.substr(2 * i, 2), nullptr, 16)));
  }
  unsigned char fileId[16];
  if (RAND_bytes(fileId, sizeof fileId) != 1) throw Error("no random bytes for an encrypted file's id");
  header_.append(reinterpret_cast<const char*>(fileId), sizeof fileId);
  header_.append(8, '\0');
  aadPrefix_ = aadPrefix(header_, label);
}

Sealer::~Sealer() { delete cipher_; }

uint64_t Sealer::plainLength(uint64_t i) const {
  return std::min<uint64_t>(chunkBytes_, plainBytes_ - i * chunkBytes_);
}

uint64_t Sealer::sealedBytes() const { return kSealedHeaderBytes + plainBytes_ + chunks_ * (kNonce + kTag); }

void Sealer::seal(uint64_t i, const void* plain, std::string& out) {
  const uint64_t n = plainLength(i);
  out.resize(kNonce + n + kTag);
  auto* o = reinterpret_cast<unsigned char*>(out.data());
  // A fresh random nonce per chunk: 2^-32 collision odds only after ~2^32
  // chunks (16 PB at 4 MiB) under one key.
  if (RAND_bytes(o, kNonce) != 1) throw Error("no random bytes for an encryption nonce");
  std::string aad = aadPrefix_;
  appendChunkAad(aad, i, i + 1 == chunks_);
  EVP_CIPHER_CTX* c = cipher_->ctx.ctx;
  int len = 0;
  bool ok = EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), nullptr, cipher_->key->bytes.data(), o) == 1 &&
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
