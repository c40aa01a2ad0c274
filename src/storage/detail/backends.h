#pragma once

// The backends behind openStorage() and what storage.cc hands them: a parsed
// blob URL and the credentials for it.

#include <memory>
#include <string>

#include "cohort/storage/storage.h"

namespace cohort::storage::detail {

// Where a blob URL points. Requests go to
// <scheme>://<authority><basePath>/<container>/<name>.
struct BlobLocation {
  std::string scheme;     // http | https
  std::string authority;  // host[:port]
  std::string basePath;   // "" (account in the host name) or "/<account>" (path-style)
  std::string account;
  std::string container;
  std::string prefix;      // object names are <prefix>/<name>; no leading or trailing '/'
  std::string sasFromUrl;  // the URL's query string, if it had one
  std::string display;     // the URL as given, without its query string

  // "/<account>/<container>" (path-style) or "/<container>": the encoded path.
  std::string containerPath() const { return basePath + "/" + container; }
  std::string origin() const { return scheme + "://" + authority; }
};

// Parses az://, http:// and https:// URLs (see openStorage). Throws
// ConfigError naming the URL (redacted) and what is wrong.
BlobLocation parseBlobUrl(const std::string& url, const StorageOptions& options);

class TokenSource;

struct Credentials {
  std::string accountKey;  // decoded; Shared Key
  std::string sas;         // query string without '?'; used when there is no key
  std::string keyText;     // the key as configured (base64), to scrub from messages
  // OAuth bearer tokens (a fixed one or a managed identity's); https only.
  std::shared_ptr<TokenSource> bearer;
};

// The URL's SAS, else options.credentialsFile, else the managed identity
// (options.managedIdentity), else AZURE_STORAGE_KEY, AZURE_STORAGE_SAS_TOKEN
// or AZURE_STORAGE_BEARER_TOKEN. Throws ConfigError naming what to set.
Credentials loadCredentials(const BlobLocation& location, const StorageOptions& options);

std::unique_ptr<Storage> openLocalStorage(const std::string& root);
std::unique_ptr<Storage> openBlobStorage(const BlobLocation& location,
                                         const Credentials& credentials,
                                         const StorageOptions& options);
void createBlobContainer(const BlobLocation& location, const Credentials& credentials,
                         const StorageOptions& options);

}  // namespace cohort::storage::detail
