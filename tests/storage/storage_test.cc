// The storage component: the local backend, URL and credential handling, and
// the blob backend against Azurite (started by the tests, Shared Key and SAS,
// plain and TLS). Retries, timeouts and resumed downloads against scripted
// servers: retry_test.cc.

#include "cohort/storage/storage.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <stdlib.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "cohort/config/job.h"
#include "cohort/core/log.h"
#include "storage/detail/shared_key.h"
#include "storage/detail/xml.h"
#include "storage_helpers.h"
#include "util/azurite.h"
#include "util/process.h"

namespace cohort::storage {
namespace {

using test::Azurite;
using test::TempDir;

// Credentials come from files the tests write, never from the environment
// of whoever runs them.
class CleanEnv : public ::testing::Test {
 protected:
  void SetUp() override { clear(); }
  void TearDown() override { clear(); }
  static void clear() {
    unsetenv("AZURE_STORAGE_KEY");
    unsetenv("AZURE_STORAGE_SAS_TOKEN");
  }
};

// ---------------------------------------------------------------------------
// Local directories

TEST(LocalStorage, RoundTrips) {
  TempDir dir;
  auto s = openStorage(dir.path());
  EXPECT_EQ(s->describe(), dir.path());
  const std::string data = randomBytes(100000, 1);
  s->writeBytes("a/b.bin", data);
  s->writeBytes("a/c.bin", "xyz");
  s->writeBytes("top.txt", "");
  EXPECT_EQ(s->size("a/b.bin"), 100000);
  EXPECT_TRUE(s->exists("a/b.bin"));
  EXPECT_FALSE(s->exists("a/none"));
  EXPECT_EQ(s->readRange("a/b.bin", 0, 10), data.substr(0, 10));
  EXPECT_EQ(s->readRange("a/b.bin", 99990, 10), data.substr(99990));
  EXPECT_EQ(s->readRange("a/b.bin", 100000, 0), "");
  EXPECT_EQ(expectStorageError([&] { s->readRange("a/b.bin", 99995, 10); }).status(), 416);
  EXPECT_TRUE(expectStorageError([&] { s->size("a/none"); }).notFound());

  const std::string src = dir.file("src.bin");
  test::writeText(src, data);
  s->writeFromFile("d/e/f.bin", src);
  std::vector<int64_t> seen;
  s->readToFile("d/e/f.bin", dir.file("out.bin"), [&](int64_t n) { seen.push_back(n); });
  EXPECT_EQ(test::readText(dir.file("out.bin")), data);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), 100000);

  std::vector<std::string> names;
  for (const auto& o : s->list("a/")) names.push_back(o.name + ":" + std::to_string(o.size));
  EXPECT_EQ(names, (std::vector<std::string>{"a/b.bin:100000", "a/c.bin:3"}));
  names.clear();
  for (const auto& o : s->list("")) names.push_back(o.name);
  EXPECT_EQ(names, (std::vector<std::string>{"a/b.bin", "a/c.bin", "d/e/f.bin", "out.bin",
                                             "src.bin", "top.txt"}));
  EXPECT_TRUE(s->list("zzz").empty());

  s->remove("a/b.bin");
  s->remove("a/b.bin");  // absent: not an error
  EXPECT_FALSE(s->exists("a/b.bin"));
  // No temporary files are left behind.
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().rfind(".tmp.", 0), std::string::npos) << e.path();
  }
}

TEST(LocalStorage, FileUrlsAndNamesOutsideTheRoot) {
  TempDir dir;
  auto s = openStorage("file://" + dir.path());
  s->writeBytes("x", "1");
  EXPECT_TRUE(std::filesystem::exists(dir.file("x")));
  expectStorageError([&] { s->writeBytes("../escape", "1"); });
  expectStorageError([&] { s->readRange("/etc/passwd", 0, 1); });
}

// ---------------------------------------------------------------------------
// URLs, options and credentials (no server)

TEST(StorageUrls, RemoteAndRedacted) {
  EXPECT_TRUE(isRemoteUrl("az://acct/c"));
  EXPECT_TRUE(isRemoteUrl("https://acct.blob.core.windows.net/c"));
  EXPECT_TRUE(isRemoteUrl("HTTP://127.0.0.1:10000/devstoreaccount1/c"));
  EXPECT_FALSE(isRemoteUrl("/data/shards"));
  EXPECT_FALSE(isRemoteUrl("file:///data"));
  EXPECT_EQ(redactUrl("https://acct.blob.core.windows.net/c/p?sv=1&sig=SECRET"),
            "https://acct.blob.core.windows.net/c/p");
  // A path joined onto a URL goes before its SAS token.
  EXPECT_EQ(joinUrl("https://acct.blob.core.windows.net/c/p?sv=1&sig=S", "run-1"),
            "https://acct.blob.core.windows.net/c/p/run-1?sv=1&sig=S");
  EXPECT_EQ(joinUrl("az://acct/c", "run-1"), "az://acct/c/run-1");
  EXPECT_EQ(joinUrl("/mnt/ckpt", "run-1"), "/mnt/ckpt/run-1");
  EXPECT_EQ(redactUrl("http://user:pw@127.0.0.1:1/a/c"), "http://127.0.0.1:1/a/c");
  EXPECT_EQ(redactUrl("/plain/path"), "/plain/path");
}

TEST_F(CleanEnv, MalformedUrlsAndPlainHttpAreConfigErrors) {
  StorageOptions o;
  setenv("AZURE_STORAGE_KEY", Azurite::kKey, 1);
  EXPECT_NE(configErrorMessage([&] {
              openStorage("http://127.0.0.1:1/acct/container", o);
            }).find("storage.allow_insecure"),
            std::string::npos);
  EXPECT_NE(configErrorMessage([&] { openStorage("s3://bucket/x", o); }).find("unknown scheme"),
            std::string::npos);
  configErrorMessage([&] { openStorage("az://acct", o); });
  configErrorMessage([&] { openStorage("az://acct/Bad_Container", o); });
  configErrorMessage([&] { openStorage("https://127.0.0.1:1/acct-only", o); });
  o.endpoint = "http://127.0.0.1:1/devstoreaccount1";
  o.allowInsecure = true;
  EXPECT_NE(configErrorMessage([&] { openStorage("az://other/container", o); }).find("other"),
            std::string::npos);
  auto s = openStorage("az://devstoreaccount1/container/prefix", o);
  EXPECT_EQ(s->describe(), "az://devstoreaccount1/container/prefix");
}

TEST_F(CleanEnv, MissingCredentialsNameWhatToSet) {
  const std::string msg = configErrorMessage([] { openStorage("az://acct/container/train"); });
  EXPECT_NE(msg.find("AZURE_STORAGE_KEY"), std::string::npos) << msg;
  EXPECT_NE(msg.find("AZURE_STORAGE_SAS_TOKEN"), std::string::npos) << msg;
  EXPECT_NE(msg.find("storage.credentials_file"), std::string::npos) << msg;
}

TEST_F(CleanEnv, CredentialsFileErrorsNeverEchoSecrets) {
  TempDir dir;
  StorageOptions o;
  o.credentialsFile = dir.file("creds");
  test::writeText(o.credentialsFile, "# comment\naccount_key: TOPSECRETVALUE\n");
  std::string msg = configErrorMessage([&] { openStorage("az://acct/container", o); });
  EXPECT_NE(msg.find(o.credentialsFile + ":2"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("TOPSECRETVALUE"), std::string::npos) << msg;

  test::writeText(o.credentialsFile, "account_key = TOP*SECRET*VALUE\n");
  msg = configErrorMessage([&] { openStorage("az://acct/container", o); });
  EXPECT_NE(msg.find("base64"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("TOP*SECRET"), std::string::npos) << msg;

  test::writeText(o.credentialsFile, "password = TOPSECRETVALUE\n");
  msg = configErrorMessage([&] { openStorage("az://acct/container", o); });
  EXPECT_EQ(msg.find("TOPSECRETVALUE"), std::string::npos) << msg;

  o.credentialsFile = dir.file("absent");
  msg = configErrorMessage([&] { openStorage("az://acct/container", o); });
  EXPECT_NE(msg.find(o.credentialsFile), std::string::npos) << msg;
}

TEST(StorageOptionsFromJob, CopiesTheStorageSection) {
  StorageConfig c;
  c.credentialsFile = "/etc/cohort/creds";
  c.endpoint = "http://127.0.0.1:10000/devstoreaccount1";
  c.caFile = "/etc/ca.pem";
  c.allowInsecure = true;
  c.maxRetries = 7;
  c.timeoutS = 12;
  const StorageOptions o = storageOptions(c);
  EXPECT_EQ(o.credentialsFile, c.credentialsFile);
  EXPECT_EQ(o.endpoint, c.endpoint);
  EXPECT_EQ(o.caFile, c.caFile);
  EXPECT_TRUE(o.allowInsecure);
  EXPECT_EQ(o.maxRetries, 7);
  EXPECT_EQ(o.timeoutS, 12);
}

TEST(StorageDetail, Base64AndPercentEncoding) {
  namespace sd = detail;
  for (const std::string s : {"", "f", "fo", "foo", "foob", "fooba", "foobar"}) {
    EXPECT_EQ(sd::base64Decode(sd::base64Encode(s)), s);
  }
  EXPECT_EQ(sd::base64Encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(sd::base64Encode("fo"), "Zm8=");
  EXPECT_EQ(sd::base64Decode(Azurite::kKey).size(), 64u);
  EXPECT_THROW(sd::base64Decode("Zm9v*mFy"), std::invalid_argument);
  EXPECT_EQ(sd::percentEncode("a b/c+d=", true), "a%20b/c%2Bd%3D");
  EXPECT_EQ(sd::percentDecode("a%20b%2Fc"), "a b/c");
}

TEST(StorageDetail, SharedKeyStringToSign) {
  // Standard headers in their fixed order, x-ms-* sorted, the resource with
  // its query parameters sorted by name and decoded.
  const std::string s = detail::sharedKeyStringToSign(
      "acct", "PUT", "/c/blob%20name", {{"comp", "block"}, {"blockid", "AA=="}},
      {{"x-ms-version", "2021-08-06"},
       {"x-ms-date", "Sun, 22 Nov 2026 00:00:00 GMT"},
       {"Content-Type", "application/xml"}},
      11);
  EXPECT_EQ(s,
            "PUT\n\n\n11\n\napplication/xml\n\n\n\n\n\n\n"
            "x-ms-date:Sun, 22 Nov 2026 00:00:00 GMT\nx-ms-version:2021-08-06\n"
            "/acct/c/blob%20name\nblockid:AA==\ncomp:block");
}

TEST(StorageDetail, ListPagesAndErrorBodies) {
  const auto page = detail::parseListPage(
      "<?xml version=\"1.0\" encoding=\"utf-8\"?><EnumerationResults ContainerName=\"c\">"
      "<Prefix>p/</Prefix><Blobs>"
      "<Blob><Name>p/a&amp;b</Name><Properties><Content-Length>12</Content-Length>"
      "<BlobType>BlockBlob</BlobType></Properties></Blob>"
      "<Blob><Name Encoded=\"true\">p/%01x</Name><Properties><Content-Length>0</Content-Length>"
      "</Properties></Blob>"
      "</Blobs><NextMarker>2!token</NextMarker></EnumerationResults>");
  ASSERT_EQ(page.blobs.size(), 2u);
  EXPECT_EQ(page.blobs[0].name, "p/a&b");
  EXPECT_EQ(page.blobs[0].size, 12);
  EXPECT_EQ(page.blobs[1].name, std::string("p/\x01x"));
  EXPECT_EQ(page.nextMarker, "2!token");
  EXPECT_TRUE(
      detail::parseListPage("<EnumerationResults><Blobs /><NextMarker /></EnumerationResults>")
          .blobs.empty());
  EXPECT_THROW(detail::parseListPage("<html>proxy error</html>"), std::runtime_error);
  EXPECT_EQ(
      detail::errorCodeFromBody(
          "<?xml version=\"1.0\"?><Error><Code>AuthenticationFailed</Code><Message>x</Message>"
          "</Error>"),
      "AuthenticationFailed");
  EXPECT_EQ(detail::errorCodeFromBody(""), "");
}

// ---------------------------------------------------------------------------
// Azurite over plain http

class AzuriteTest : public CleanEnv {
 protected:
  static void SetUpTestSuite() { shared_.start(); }
  static void TearDownTestSuite() { shared_.stop(); }
  void SetUp() override {
    CleanEnv::SetUp();
    azurite_ = shared_.get();
    ASSERT_NE(azurite_, nullptr) << shared_.error();
  }

  // Shared Key through a credentials file.
  StorageOptions keyOptions() {
    StorageOptions o;
    o.credentialsFile = dir_.file("creds");
    test::writeText(o.credentialsFile,
                    std::string("# the emulator's key\naccount_key = ") + Azurite::kKey + "\n");
    o.allowInsecure = true;
    o.retryBaseS = 0.01;
    o.timeoutS = 20;
    return o;
  }
  // A fresh container for each test.
  std::string container() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("t-") + info->name();
    for (auto& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? std::tolower(c) : '-';
    name = name.substr(0, 60);
    createContainer(azurite_->url(name), keyOptions());
    return name;
  }

  static test::SharedAzurite shared_;
  Azurite* azurite_ = nullptr;
  TempDir dir_;
};

test::SharedAzurite AzuriteTest::shared_;

TEST_F(AzuriteTest, SmallObjectsAndRangedReads) {
  const std::string c = container();
  createContainer(azurite_->url(c), keyOptions());  // again: already exists, fine
  auto s = openStorage(azurite_->url(c + "/data/set1"), keyOptions());
  EXPECT_EQ(s->describe(), azurite_->url(c + "/data/set1"));
  const std::string data = randomBytes(10000, 2);
  s->writeBytes("shard-00000.bin", data);
  s->writeBytes("empty.bin", "");
  EXPECT_EQ(s->size("shard-00000.bin"), 10000);
  EXPECT_EQ(s->size("empty.bin"), 0);
  EXPECT_TRUE(s->exists("shard-00000.bin"));
  EXPECT_FALSE(s->exists("shard-00001.bin"));
  EXPECT_EQ(s->readRange("shard-00000.bin", 0, 1), data.substr(0, 1));
  EXPECT_EQ(s->readRange("shard-00000.bin", 1234, 4321), data.substr(1234, 4321));
  EXPECT_EQ(s->readRange("shard-00000.bin", 9990, 10), data.substr(9990));  // the tail
  EXPECT_EQ(s->readRange("shard-00000.bin", 0, 10000), data);
  EXPECT_EQ(s->readRange("shard-00000.bin", 10000, 0), "");
  StorageError e = expectStorageError([&] { s->readRange("shard-00000.bin", 9995, 10); });
  EXPECT_EQ(e.status(), 416);
  EXPECT_FALSE(e.transient());
  e = expectStorageError([&] { s->readRange("shard-00000.bin", 20000, 10); });
  EXPECT_EQ(e.status(), 416);
  EXPECT_EQ(e.attempts(), 1);

  // Names are relative to the URL's prefix.
  auto whole = openStorage(azurite_->url(c), keyOptions());
  EXPECT_EQ(whole->readRange("data/set1/shard-00000.bin", 5, 5), data.substr(5, 5));

  // Overwrite, then remove (twice: absent is fine).
  s->writeBytes("shard-00000.bin", "new");
  EXPECT_EQ(s->readRange("shard-00000.bin", 0, 3), "new");
  s->remove("shard-00000.bin");
  s->remove("shard-00000.bin");
  EXPECT_FALSE(s->exists("shard-00000.bin"));
}

TEST_F(AzuriteTest, LargeObjectsGoInBlocksAndStreamToFiles) {
  const std::string c = container();
  StorageOptions o = keyOptions();
  o.blockBytes = 64 << 10;
  auto s = openStorage(azurite_->url(c), o);
  const std::string data = randomBytes((64 << 10) * 5 + 123, 3);  // 6 blocks
  const std::string src = dir_.file("src.bin");
  test::writeText(src, data);
  s->writeFromFile("big/file.bin", src);
  EXPECT_EQ(s->size("big/file.bin"), static_cast<int64_t>(data.size()));

  std::vector<int64_t> seen;
  s->readToFile("big/file.bin", dir_.file("out.bin"), [&](int64_t n) { seen.push_back(n); });
  EXPECT_EQ(test::readText(dir_.file("out.bin")), data);
  ASSERT_FALSE(seen.empty());
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_EQ(seen.back(), static_cast<int64_t>(data.size()));
  EXPECT_EQ(s->readRange("big/file.bin", (64 << 10) - 7, 14), data.substr((64 << 10) - 7, 14));

  // writeBytes takes the block path too.
  const std::string bytes = randomBytes((64 << 10) * 2 + 1, 4);
  s->writeBytes("big/bytes.bin", bytes);
  EXPECT_EQ(s->readRange("big/bytes.bin", 0, static_cast<int64_t>(bytes.size())), bytes);
}

TEST_F(AzuriteTest, ListsByPrefixAcrossPages) {
  const std::string c = container();
  StorageOptions o = keyOptions();
  o.listPageSize = 2;  // 5 train objects: 3 pages
  auto root = openStorage(azurite_->url(c), o);
  for (int i = 0; i < 5; ++i)
    root->writeBytes("ds/train/shard-" + std::to_string(i), std::string(i, 'x'));
  root->writeBytes("ds/eval/shard-0", "e");
  root->writeBytes("ds/train with space/a b.bin", "s");
  root->writeBytes("other", "o");

  auto ds = openStorage(azurite_->url(c + "/ds"), o);
  std::vector<std::string> names;
  for (const auto& obj : ds->list("train/"))
    names.push_back(obj.name + ":" + std::to_string(obj.size));
  EXPECT_EQ(names,
            (std::vector<std::string>{"train/shard-0:0", "train/shard-1:1", "train/shard-2:2",
                                      "train/shard-3:3", "train/shard-4:4"}));
  names.clear();
  for (const auto& obj : ds->list("")) names.push_back(obj.name);
  EXPECT_EQ(names, (std::vector<std::string>{"eval/shard-0", "train with space/a b.bin",
                                             "train/shard-0", "train/shard-1", "train/shard-2",
                                             "train/shard-3", "train/shard-4"}));
  EXPECT_EQ(ds->readRange("train with space/a b.bin", 0, 1), "s");
  EXPECT_TRUE(ds->list("nothing/").empty());
  EXPECT_EQ(root->list("").size(), 8u);
}

TEST_F(AzuriteTest, AzUrlsGoToTheEndpoint) {
  const std::string c = container();
  StorageOptions o = keyOptions();
  o.endpoint = azurite_->endpoint();
  auto s = openStorage(std::string("az://") + Azurite::kAccount + "/" + c + "/p", o);
  EXPECT_EQ(s->describe(), std::string("az://") + Azurite::kAccount + "/" + c + "/p");
  s->writeBytes("x", "via az://");
  auto direct = openStorage(azurite_->url(c), keyOptions());
  EXPECT_EQ(direct->readRange("p/x", 0, 9), "via az://");
}

TEST_F(AzuriteTest, KeyFromTheEnvironment) {
  const std::string c = container();
  setenv("AZURE_STORAGE_KEY", Azurite::kKey, 1);
  StorageOptions o;
  o.allowInsecure = true;
  auto s = openStorage(azurite_->url(c), o);
  s->writeBytes("k", "env key");
  EXPECT_EQ(s->readRange("k", 0, 7), "env key");
}

TEST_F(AzuriteTest, SasTokensInTheUrlAndTheEnvironment) {
  const std::string c = container();
  const std::string sas = test::accountSas(Azurite::kAccount, Azurite::kKey);
  StorageOptions o;
  o.allowInsecure = true;
  o.blockBytes = 64 << 10;
  o.listPageSize = 1;
  auto s = openStorage(azurite_->url(c + "/sas") + "?" + sas, o);
  EXPECT_EQ(s->describe().find("sig="), std::string::npos) << s->describe();
  const std::string data = randomBytes(200000, 5);
  s->writeBytes("blocks.bin", data);
  s->writeBytes("small.bin", "small");
  EXPECT_EQ(s->readRange("blocks.bin", 100, 1000), data.substr(100, 1000));
  EXPECT_EQ(s->size("small.bin"), 5);
  EXPECT_EQ(s->list("").size(), 2u);
  s->remove("small.bin");
  EXPECT_FALSE(s->exists("small.bin"));

  setenv("AZURE_STORAGE_SAS_TOKEN", ("?" + sas).c_str(), 1);
  auto fromEnv = openStorage(azurite_->url(c + "/sas"), o);
  EXPECT_EQ(fromEnv->readRange("blocks.bin", 0, 10), data.substr(0, 10));
  createContainer(azurite_->url("t-created-with-sas"), o);
}

TEST_F(AzuriteTest, WrongCredentialsFailAtOnceWithoutTheSecret) {
  const std::string c = container();
  LogCapture logs;
  StorageOptions o = keyOptions();
  const std::string wrongKey = "V3JvbmdLZXlXcm9uZ0tleVdyb25nS2V5V3JvbmdLZXk=";
  test::writeText(o.credentialsFile, "account_key = " + wrongKey + "\n");
  o.maxRetries = 3;
  auto s = openStorage(azurite_->url(c), o);
  StorageError e = expectStorageError([&] { s->writeBytes("x", "data"); });
  EXPECT_EQ(e.status(), 403);
  EXPECT_FALSE(e.transient());
  EXPECT_EQ(e.attempts(), 1);
  const std::string msg = e.what();
  EXPECT_NE(msg.find("PUT " + azurite_->url(c) + "/x: 403"), std::string::npos) << msg;
  EXPECT_EQ(msg.find(wrongKey), std::string::npos) << msg;
  EXPECT_EQ(msg.find(Azurite::kKey), std::string::npos) << msg;

  // A SAS with a forged signature.
  std::string sas = test::accountSas(Azurite::kAccount, wrongKey);
  const std::string sig = sas.substr(sas.find("sig=") + 4);
  StorageOptions plain;
  plain.allowInsecure = true;
  plain.maxRetries = 3;
  auto bad = openStorage(azurite_->url(c) + "?" + sas, plain);
  EXPECT_EQ(bad->describe().find(sig), std::string::npos);
  e = expectStorageError([&] { bad->readRange("x", 0, 1); });
  EXPECT_EQ(e.status(), 403);
  EXPECT_EQ(e.attempts(), 1);
  EXPECT_EQ(std::string(e.what()).find(sig), std::string::npos) << e.what();
  EXPECT_EQ(std::string(e.what()).find("sig="), std::string::npos) << e.what();
  // Nothing was retried, and the log holds no secret either.
  const std::string log = logs.text();
  EXPECT_EQ(log.find("retry"), std::string::npos) << log;
  EXPECT_EQ(log.find(sig), std::string::npos) << log;
}

TEST_F(AzuriteTest, MissingObjectsFailAtOnceNamingTheUrl) {
  const std::string c = container();
  StorageOptions o = keyOptions();
  o.maxRetries = 3;
  auto s = openStorage(azurite_->url(c + "/pre"), o);
  StorageError e = expectStorageError([&] { s->readRange("missing.bin", 0, 10); });
  EXPECT_TRUE(e.notFound());
  EXPECT_EQ(e.attempts(), 1);
  EXPECT_EQ(std::string(e.what()),
            "GET " + azurite_->url(c + "/pre/missing.bin") + ": 404 BlobNotFound");
  e = expectStorageError([&] { s->size("missing.bin"); });
  EXPECT_TRUE(e.notFound());
  EXPECT_NE(std::string(e.what()).find("HEAD " + azurite_->url(c + "/pre/missing.bin")),
            std::string::npos);
  e = expectStorageError([&] { s->readToFile("missing.bin", dir_.file("out")); });
  EXPECT_TRUE(e.notFound());
  auto noContainer = openStorage(azurite_->url("no-such-container"), o);
  e = expectStorageError([&] { noContainer->list(""); });
  EXPECT_EQ(e.status(), 404);
  EXPECT_NE(std::string(e.what()).find("ContainerNotFound"), std::string::npos) << e.what();
}

// ---------------------------------------------------------------------------
// Azurite over TLS with a self-signed certificate

class AzuriteTlsTest : public CleanEnv {
 protected:
  static void SetUpTestSuite() { shared_.start(); }
  static void TearDownTestSuite() { shared_.stop(); }
  static StorageOptions options() {
    StorageOptions o;
    o.maxRetries = 3;
    o.retryBaseS = 0.01;
    return o;
  }
  void SetUp() override {
    CleanEnv::SetUp();
    azurite_ = shared_.get();
    ASSERT_NE(azurite_, nullptr) << shared_.error();
    setenv("AZURE_STORAGE_KEY", Azurite::kKey, 1);
  }
  static test::SharedAzurite shared_;
  Azurite* azurite_ = nullptr;
};

test::SharedAzurite AzuriteTlsTest::shared_{/*https=*/true};

TEST_F(AzuriteTlsTest, UntrustedCertificateFailsAtOnce) {
  StorageError e = expectStorageError([&] { createContainer(azurite_->url("tls"), options()); });
  EXPECT_EQ(e.attempts(), 1);
  EXPECT_FALSE(e.transient());
  EXPECT_NE(std::string(e.what()).find("certificate"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find(azurite_->url("tls")), std::string::npos) << e.what();
}

TEST_F(AzuriteTlsTest, TrustedThroughCaFile) {
  StorageOptions o = options();
  o.caFile = azurite_->caFile();
  createContainer(azurite_->url("tls-ca"), o);
  auto s = openStorage(azurite_->url("tls-ca/p"), o);
  s->writeBytes("x", "over TLS");
  EXPECT_EQ(s->readRange("x", 5, 3), "TLS");
}

TEST_F(AzuriteTlsTest, AllowInsecureSkipsVerification) {
  StorageOptions o = options();
  o.allowInsecure = true;
  createContainer(azurite_->url("tls-insecure"), o);
  auto s = openStorage(azurite_->url("tls-insecure"), o);
  s->writeBytes("x", "unverified");
  EXPECT_EQ(s->size("x"), 10);
}

}  // namespace
}  // namespace cohort::storage
