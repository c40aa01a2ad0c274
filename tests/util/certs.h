#pragma once

// A certificate authority for tests, made with the openssl command: its
// own CA certificate, and certificates it signs for servers and clients
// (both uses; P-256 keys, valid two days). Files live in the caller's
// directory; keys are mode 0600.

#include <string>
#include <vector>

namespace cohort::test {

struct IssuedCert {
  std::string certFile, keyFile;
};

class TestCa {
 public:
  // Creates `<dir>/<name>-ca.pem` and its key. Throws std::runtime_error
  // when openssl fails.
  TestCa(const std::string& dir, const std::string& name);

  const std::string& caFile() const { return caFile_; }
  // A certificate for common name `cn`, valid for the IP addresses `ips`
  // (subjectAltName), signed by this CA.
  IssuedCert issue(const std::string& cn, const std::vector<std::string>& ips = {}) const;

 private:
  std::string dir_, name_, caFile_, caKey_;
};

}  // namespace cohort::test
