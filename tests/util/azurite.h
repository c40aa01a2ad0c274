#pragma once

// Azurite, the Azure Storage emulator, for tests of blob storage: started
// from tests/azurite/node_modules (installed by `npm ci` in scripts/test.sh)
// on a free loopback port with its data in a temp dir, and stopped (SIGTERM,
// then SIGKILL) and reaped on destruction.

#include <chrono>
#include <memory>
#include <string>

#include "util/process.h"

namespace cohort::test {

class Azurite {
 public:
  // Azurite's well-known development account.
  static constexpr const char* kAccount = "devstoreaccount1";
  static constexpr const char* kKey =
      "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

  // Starts Azurite and waits until it accepts connections (at most ~30 s).
  // With `https`, it serves a self-signed certificate for 127.0.0.1 made
  // with the openssl command (caFile()). Throws std::runtime_error with
  // Azurite's output when it does not come up. With `oauth` (https only),
  // it also accepts OAuth bearer tokens, checking their audience, issuer and
  // lifetime (not their signature: `--oauth basic`).
  explicit Azurite(bool https = false, bool oauth = false);
  ~Azurite();
  Azurite(const Azurite&) = delete;
  Azurite& operator=(const Azurite&) = delete;

  int port() const { return port_; }
  // "http://127.0.0.1:<port>/devstoreaccount1" (https with a certificate).
  std::string endpoint() const;
  // endpoint() + "/" + path, e.g. url("container/prefix").
  std::string url(const std::string& path) const { return endpoint() + "/" + path; }
  // The PEM certificate Azurite serves (https only).
  const std::string& caFile() const { return certFile_; }

 private:
  TempDir dir_;
  bool https_;
  int port_ = 0;
  std::string certFile_;
  std::unique_ptr<Process> process_;
  std::chrono::steady_clock::time_point started_;
};

// One Azurite shared by the tests of a suite (starting one takes seconds):
// start() in SetUpTestSuite(), stop() in TearDownTestSuite(). get() is null
// when it did not start; error() says why, for the tests to fail with.
class SharedAzurite {
 public:
  explicit SharedAzurite(bool https = false, bool oauth = false) : https_(https), oauth_(oauth) {}
  void start();
  void stop() { azurite_.reset(); }
  Azurite* get() const { return azurite_.get(); }
  const std::string& error() const { return error_; }

 private:
  bool https_;
  bool oauth_;
  std::unique_ptr<Azurite> azurite_;
  std::string error_;
};

// An account SAS (query string, without '?') for the blob service granting
// every permission on service, containers and objects until 2099, signed with
// the base64 account `key`.
std::string accountSas(const std::string& account, const std::string& key);

}  // namespace cohort::test
