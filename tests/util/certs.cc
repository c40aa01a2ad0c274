#include "util/certs.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <stdexcept>

#include "util/process.h"

namespace cohort::test {
namespace {

constexpr const char* kOpenssl = "/usr/bin/openssl";

void openssl(const std::vector<std::string>& args) {
  std::vector<std::string> argv{kOpenssl};
  argv.insert(argv.end(), args.begin(), args.end());
  const ProcessResult r = run(argv, {}, std::chrono::seconds(60));
  if (r.exitCode != 0) throw std::runtime_error("openssl " + args.at(0) + " failed: " + r.describe());
}

const std::vector<std::string> kNewKey = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                                          "-nodes"};

}  // namespace

TestCa::TestCa(const std::string& dir, const std::string& name)
    : dir_(dir), name_(name), caFile_(dir + "/" + name + "-ca.pem"), caKey_(dir + "/" + name + "-ca.key") {
  std::vector<std::string> args = {"req", "-x509"};
  args.insert(args.end(), kNewKey.begin(), kNewKey.end());
  args.insert(args.end(), {"-keyout", caKey_, "-out", caFile_, "-days", "2", "-subj", "/CN=" + name + " CA",
                           "-addext", "basicConstraints=critical,CA:TRUE", "-addext",
                           "keyUsage=critical,keyCertSign,cRLSign"});
  openssl(args);
  ::chmod(caKey_.c_str(), 0600);
}

IssuedCert TestCa::issue(const std::string& cn, const std::vector<std::string>& ips) const {
  const std::string base = fmt::format("{}/{}-{}", dir_, name_, cn);
  IssuedCert out{base + ".pem", base + ".key"};
  std::vector<std::string> args = {"req"};
  args.insert(args.end(), kNewKey.begin(), kNewKey.end());
  args.insert(args.end(), {"-keyout", out.keyFile, "-out", base + ".csr", "-subj", "/CN=" + cn});
  openssl(args);
  ::chmod(out.keyFile.c_str(), 0600);
  std::string ext = "extendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n";
  if (!ips.empty()) {
    std::vector<std::string> sans;
    for (const auto& ip : ips) sans.push_back("IP:" + ip);
    ext += fmt::format("subjectAltName={}\n", fmt::join(sans, ","));
  }
  writeText(base + ".ext", ext);
  openssl({"x509", "-req", "-in", base + ".csr", "-CA", caFile_, "-CAkey", caKey_, "-CAcreateserial",
           "-out", out.certFile, "-days", "2", "-extfile", base + ".ext"});
  return out;
}

}  // namespace cohort::test
