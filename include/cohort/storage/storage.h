#pragma once

// Where datasets and remote checkpoints live: a local directory or Azure Blob
// Storage, behind one interface. Names are '/'-separated paths relative to the
// root the URL names ("train/shard-00000.cohort").
//
// Secrets (account keys, SAS tokens) never appear in describe(), in log lines
// or in exception messages: URLs are printed without their query string.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cohort/core/error.h"

namespace cohort {
struct StorageConfig;  // cohort/config/job.h
}

namespace cohort::storage {

// A storage request failed. `status` is the HTTP status (404 also for an
// absent local file; 0 for other local and for network errors); `transient`
// is true when retrying may succeed (timeouts, connection resets, 5xx, 429)
// and false for 4xx such as 403 or 404, which fail at once. `attempts` is how
// many requests were made (1 + retries). The message names the operation, the
// URL without any secret, the HTTP status and Azure's error code:
//   "GET https://acct.blob.core.windows.net/c/train/shard-00001.cohort: 403 AuthenticationFailed"
class StorageError : public IoError {
 public:
  StorageError(const std::string& what, int status, bool transient, int attempts = 1)
      : IoError(what), status_(status), transient_(transient), attempts_(attempts) {}
  int status() const { return status_; }
  bool transient() const { return transient_; }
  bool notFound() const { return status_ == 404; }
  int attempts() const { return attempts_; }

 private:
  int status_;
  bool transient_;
  int attempts_;
};

struct StorageOptions {
  // A file holding credentials, one `key = value` per line: `account_key`
  // (Shared Key), `sas` (a SAS token) or `token` (an OAuth bearer token).
  // Empty: the environment variables AZURE_STORAGE_KEY,
  // AZURE_STORAGE_SAS_TOKEN or AZURE_STORAGE_BEARER_TOKEN.
  std::string credentialsFile;
  // Tokens from Azure's managed identity (IMDS) instead: the system-assigned
  // identity, or the user-assigned one with this client id, at this endpoint
  // (empty: IMDS, http://169.254.169.254/metadata/identity/oauth2/token).
  bool managedIdentity = false;
  std::string identityClientId;
  std::string identityEndpoint;
  // Overrides where an az://account/container URL goes, e.g. the emulator's
  // http://127.0.0.1:10000/devstoreaccount1. Empty: https://<account>.blob.core.windows.net.
  std::string endpoint;
  // PEM bundle of trusted certificate authorities; empty: the system's.
  std::string caFile;
  // The emulator only: allows plain http and skips certificate verification.
  bool allowInsecure = false;
  int maxRetries = 5;       // transient errors: attempts after the first
  double retryBaseS = 0.2;  // backoff: base * 2^attempt, capped at retryMaxS, jittered;
  double retryMaxS = 10;    // a server's Retry-After is honoured up to retryMaxS
  // Per request: connecting may take this long, and a request fails when no
  // byte moves in either direction for this long (a stalled server). Large
  // transfers that keep moving are not cut off.
  double timeoutS = 60;
  int64_t blockBytes = 8 << 20;  // upload block size (Put Block) for large objects
  int listPageSize = 5000;       // objects per List Blobs request (the service's maximum)
};

struct ObjectInfo {
  std::string name;  // relative to the root
  int64_t size = 0;
};

// Every call blocks until it is done, each request bounded by the timeout
// and retries of StorageOptions. Calls may be made from several threads at
// once. Errors: StorageError as described above.
class Storage {
 public:
  virtual ~Storage() = default;
  // The root for logs and messages, without secrets: the URL as given
  // ("az://acct/container/prefix") without its query string, or the path.
  virtual std::string describe() const = 0;
  // Size of object `name`; throws StorageError (notFound()) when it is absent.
  virtual int64_t size(const std::string& name) = 0;
  virtual bool exists(const std::string& name) = 0;
  // Reads `length` bytes at `offset` (a ranged GET). Throws StorageError
  // (status 416) when fewer bytes exist.
  virtual std::string readRange(const std::string& name, int64_t offset, int64_t length) = 0;
  // Reads the whole object into `localPath`, streaming; `progress` (if set) is
  // called with the bytes received so far. A transfer broken off is resumed
  // from where it stopped. Not atomic: callers write to a temporary name and
  // rename.
  virtual void readToFile(const std::string& name, const std::string& localPath,
                          const std::function<void(int64_t)>& progress = {}) = 0;
  // Writes object `name` from a local file (blocks + block list for large
  // files: the object appears complete or not at all).
  virtual void writeFromFile(const std::string& name, const std::string& localPath) = 0;
  virtual void writeBytes(const std::string& name, const std::string& data) = 0;
  // Objects whose name starts with `prefix`, sorted by name.
  virtual std::vector<ObjectInfo> list(const std::string& prefix) = 0;
  // Deletes `name`; absent is not an error.
  virtual void remove(const std::string& name) = 0;
};

// True for URLs openStorage() treats as blob storage (az://, http://, https://).
bool isRemoteUrl(const std::string& url);

// Opens the storage `url` names: a local path (or file://PATH), az://account/container[/prefix],
// or https://account.blob.core.windows.net/container[/prefix] (http:// and any
// host for the emulator, path-style: http://127.0.0.1:10000/devstoreaccount1/container[/prefix]).
// A SAS token may be the URL's query string. Throws ConfigError for a
// malformed URL, plain http without allowInsecure, or missing credentials.
// Makes no request: a wrong key or a missing container shows on first use.
std::unique_ptr<Storage> openStorage(const std::string& url, const StorageOptions& options = {});

// The URL with its query string (a SAS token) removed, for messages.
std::string redactUrl(const std::string& url);

// `url` with "/name" appended to its path and its query string (a SAS token)
// kept at the end: joinUrl("az://a/c/ckpt?sv=..&sig=..", "run") is
// "az://a/c/ckpt/run?sv=..&sig=..". A local path becomes path/name.
std::string joinUrl(const std::string& url, const std::string& name);

// Creates the container a blob URL names (any prefix is ignored). An existing
// container is not an error. Throws ConfigError for a URL that is not a blob
// URL or lacks credentials, StorageError when the service refuses.
void createContainer(const std::string& url, const StorageOptions& options = {});

// The options the job file's `storage` section sets (the retry and block
// settings it does not name keep their defaults).
StorageOptions storageOptions(const StorageConfig& config);

}  // namespace cohort::storage
