#include "cohort/security/keys.h"

#include <fmt/format.h>
#include <openssl/evp.h>
#include <sys/stat.h>

#include <cctype>
#include <fstream>
#include <mutex>
#include <sstream>

#include "cohort/config/job.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"

namespace cohort::security {
namespace {

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string keyId(const std::array<unsigned char, 32>& key) {
  // Domain-separated, so the id is no hash a key is used with elsewhere.
  static constexpr char kPrefix[] = "cohort key id v1";
  std::string input(kPrefix, sizeof kPrefix);
  input.append(reinterpret_cast<const char*>(key.data()), key.size());
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(input.data(), input.size(), digest, &length, EVP_sha256(), nullptr) != 1) {
    throw Error("SHA-256 failed while naming an encryption key");
  }
  std::string id;
  for (int i = 0; i < 16; ++i) id += fmt::format("{:02x}", digest[i]);
  return id;
}

std::mutex keyringMutex;
std::optional<Keyring> keyring;

}  // namespace

Key parseKey(const std::string& text, const std::string& origin) {
  size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  Key k;
  // The message never quotes the text: it is (or is close to) a key.
  if (end - begin != 64) {
    throw ConfigError(fmt::format(
        "{}: expected an AES-256 key as 64 hex digits (`openssl rand -hex 32`), found {} characters",
        origin, end - begin));
  }
  for (size_t i = 0; i < 32; ++i) {
    const int hi = hexValue(text[begin + 2 * i]), lo = hexValue(text[begin + 2 * i + 1]);
    if (hi < 0 || lo < 0) {
      throw ConfigError(fmt::format("{}: expected 64 hex digits; character {} is not one", origin,
                                    2 * i + (hi < 0 ? 1 : 2)));
    }
    k.bytes[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  k.id = keyId(k.bytes);
  k.origin = origin;
  return k;
}

std::string readSecretFile(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw ConfigError(fmt::format("{} {}: cannot read it (does it exist?)", what, path));
  }
  if ((st.st_mode & 077) != 0) {
    throw ConfigError(fmt::format("{} {}: readable by other users (mode {:04o}); `chmod 600 {}`",
                                  what, path, st.st_mode & 07777, path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{} {}: cannot read it", what, path));
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  const size_t begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) throw ConfigError(fmt::format("{} {}: empty", what, path));
  s = s.substr(begin, s.find_last_not_of(" \t\r\n") - begin + 1);
  return s;
}

std::string storeToken(const std::string& tokenFile) {
  std::string token;
  std::string from;
  if (!tokenFile.empty()) {
    token = readSecretFile(tokenFile, "security.store_token_file");
    from = "security.store_token_file " + tokenFile;
  } else if (auto t = env::storeToken()) {
    token = *t;
    from = fmt::format("environment variable {}", env::kStoreTokenVar);
  }
  if (!token.empty() && token.size() < 16) {
    throw ConfigError(fmt::format("{}: a store token needs at least 16 characters "
                                  "(`openssl rand -hex 32` makes one)",
                                  from));
  }
  return token;
}

Key readKeyFile(const std::string& path) {
  return parseKey(readSecretFile(path, "key file"), "key file " + path);
}

const Key* Keyring::find(const std::string& id) const {
  if (current.id == id) return &current;
  if (previous && previous->id == id) return &*previous;
  return nullptr;
}

KeySources keySources(const EncryptionConfig& c) {
  return KeySources{c.keyFile, c.keyEnv, c.previousKeyFile};
}

std::optional<Keyring> loadKeyring(const KeySources& s) {
  if (!s.keyFile.empty() && !s.keyEnv.empty()) {
    throw ConfigError(
        "security.encryption: give key_file or key_env, not both");
  }
  if (s.keyFile.empty() && s.keyEnv.empty()) {
    if (!s.previousKeyFile.empty()) {
      throw ConfigError(
          "security.encryption.previous_key_file is set but no current key (key_file or key_env)");
    }
    return std::nullopt;
  }
  Keyring ring;
  if (!s.keyFile.empty()) {
    ring.current = readKeyFile(s.keyFile);
  } else {
    const auto value = env::namedVariable(s.keyEnv);
    if (!value) {
      throw ConfigError(fmt::format(
          "security.encryption.key_env: the environment variable {} is not set", s.keyEnv));
    }
    ring.current = parseKey(*value, "environment variable " + s.keyEnv);
  }
  if (!s.previousKeyFile.empty()) ring.previous = readKeyFile(s.previousKeyFile);
  return ring;
}

void installKeyring(std::optional<Keyring> k) {
  std::lock_guard<std::mutex> lock(keyringMutex);
  keyring = std::move(k);
}

const Keyring* installedKeyring() {
  std::lock_guard<std::mutex> lock(keyringMutex);
  return keyring ? &*keyring : nullptr;
}

}  // namespace cohort::security
