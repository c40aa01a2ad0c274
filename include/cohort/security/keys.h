#pragma once

// Encryption keys for data at rest (security.encryption in the job file).
// A key is 32 random bytes (AES-256), given as 64 hex digits in a file only
// its user may read, or in an environment variable; never in the job file.
// Make one with `openssl rand -hex 32 > cohort.key && chmod 600 cohort.key`.
//
// A key is known by its id: 32 hex digits of SHA-256 over a fixed prefix and
// the key, written into every file it seals so that a reader picks the right
// key of its keyring (the current key and the previous one, for rotation)
// and says which key a file needs. The id reveals nothing about the key.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cohort {
struct EncryptionConfig;  // cohort/config/job.h
}

namespace cohort::security {

struct Key {
  std::array<unsigned char, 32> bytes{};
  std::string id;      // 32 hex digits
  std::string origin;  // where it came from, for messages: "key file /etc/k" (never the key)
};

// Parses 64 hex digits (surrounding white space ignored). Throws ConfigError
// naming `origin` (never quoting the text) when it is anything else.
Key parseKey(const std::string& text, const std::string& origin);

// Reads a file holding a secret (a key, a token): its contents without
// surrounding white space. Throws ConfigError naming `what` and the path when
// it is missing, empty, or readable by other users than its owner (mode & 077).
std::string readSecretFile(const std::string& path, const std::string& what);

// The rendezvous store's token: the contents of `tokenFile` (mode 0600) if
// given, else COHORT_STORE_TOKEN, else empty. Throws ConfigError when the
// token is shorter than 16 characters.
std::string storeToken(const std::string& tokenFile);

// Reads a key file. Throws ConfigError naming the path when it is missing,
// readable by other users than its owner (mode & 077), or malformed.
Key readKeyFile(const std::string& path);

// The keys a process seals with and opens with: `current` seals; `previous`
// (a rotated-out key) only opens files sealed before the rotation.
struct Keyring {
  Key current;
  std::optional<Key> previous;
  // The key with this id, or null.
  const Key* find(const std::string& id) const;
};

// Where the job's keys come from (the job file's security.encryption).
struct KeySources {
  std::string keyFile;          // the current key
  std::string keyEnv;           // or: the environment variable holding it
  std::string previousKeyFile;  // optional: the key before the last rotation
};

// The sources the job file's security.encryption names.
KeySources keySources(const EncryptionConfig& config);

// The keyring the sources name; nullopt when they name no key (encryption
// off). Throws ConfigError naming the file or variable that is wrong, and
// when both a file and a variable are given.
std::optional<Keyring> loadKeyring(const KeySources& sources);

// The process's keyring, which readers of sealed files (checkpoints, the
// final model) use. Installed once by a rank or a command before it reads
// anything; null when none was installed.
void installKeyring(std::optional<Keyring> keyring);
const Keyring* installedKeyring();

}  // namespace cohort::security
