// OAuth bearer tokens for blob storage: a fixed token, and tokens from a
// managed-identity endpoint (a scripted IMDS on loopback), used against
// Azurite in its OAuth mode, which checks every token's audience, issuer and
// lifetime.

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>

#include "cohort/core/error.h"
#include "cohort/storage/storage.h"
#include "storage/detail/identity.h"
#include "storage/detail/shared_key.h"
#include "util/azurite.h"
#include "util/fake_http.h"
#include "util/process.h"
#include "util/errors.h"

namespace cohort {
namespace {

using storage::StorageError;
using storage::StorageOptions;
using SysClock = std::chrono::system_clock;

int64_t nowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(SysClock::now().time_since_epoch())
      .count();
}

std::string base64url(const std::string& s) {
  std::string b = storage::detail::base64Encode(s);
  for (char& c : b) c = c == '+' ? '-' : c == '/' ? '_' : c;
  while (!b.empty() && b.back() == '=') b.pop_back();
  return b;
}

// An unsigned JWT of the shape Azure AD issues for storage.
std::string jwt(const std::string& audience, int64_t expires) {
  const nlohmann::json header = {{"alg", "RS256"}, {"typ", "JWT"}};
  const nlohmann::json claims = {
      {"aud", audience},
      {"iss", "https://sts.windows.net/72f988bf-86f1-41af-91ab-2d7cd011db47/"},
      {"nbf", nowSeconds() - 300},
      {"iat", nowSeconds() - 300},
      {"exp", expires},
      {"oid", "a3b4c5d6-0000-4000-8000-cohorttest01"}};
  return base64url(header.dump()) + "." + base64url(claims.dump()) + ".c2lnbmF0dXJl";
}

// A managed-identity endpoint: answers with a fresh token per call, lasting
// `lifetime` seconds, for `audience`; after `failures` 503s first.
struct FakeIdentity {
  test::FakeServer http;
  std::atomic<int> calls{0};
  std::atomic<int> failures{0};
  int64_t lifetime = 3600;
  std::string audience = "https://storage.azure.com";
  std::string lastQuery;
  std::string lastToken;

  FakeIdentity() {
    http.server().Get("/metadata/identity/oauth2/token",
                      [this](const httplib::Request& req, httplib::Response& res) {
                        ++calls;
                        if (req.get_header_value("Metadata") != "true") {
                          res.status = 400;
                          res.set_content(R"({"error":"bad_request","error_description":"Required metadata header not specified"})",
                                          "application/json");
                          return;
                        }
                        if (failures > 0) {
                          --failures;
                          res.status = 503;
                          return;
                        }
                        lastQuery = req.get_param_value("resource") + " " +
                                    req.get_param_value("api-version") + " " +
                                    req.get_param_value("client_id");
                        const int64_t expires = nowSeconds() + lifetime;
                        lastToken = jwt(audience, expires);
                        const nlohmann::json body = {{"access_token", lastToken},
                                                     {"expires_on", std::to_string(expires)},
                                                     {"resource", "https://storage.azure.com/"},
                                                     {"token_type", "Bearer"}};
                        res.set_content(body.dump(), "application/json");
                      });
  }
  std::string endpoint() const {
    return "http://127.0.0.1:" + std::to_string(http.port()) + "/metadata/identity/oauth2/token";
  }
};

class BearerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { shared_.start(); }
  static void TearDownTestSuite() { shared_.stop(); }
  void SetUp() override {
    for (const char* v : {"AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_BEARER_TOKEN"})
      unsetenv(v);
    azurite_ = shared_.get();
    ASSERT_NE(azurite_, nullptr) << shared_.error();
  }
  void TearDown() override { unsetenv("AZURE_STORAGE_BEARER_TOKEN"); }
  StorageOptions identityOptions(const FakeIdentity& id) const {
    StorageOptions o;
    o.caFile = azurite_->caFile();
    o.managedIdentity = true;
    o.identityEndpoint = id.endpoint();
    o.identityClientId = "0f1e2d3c-client";
    o.maxRetries = 3;
    o.retryBaseS = 0.01;
    return o;
  }
  static test::SharedAzurite shared_;
  test::Azurite* azurite_ = nullptr;
};

test::SharedAzurite BearerTest::shared_{/*https=*/true, /*oauth=*/true};

TEST_F(BearerTest, ManagedIdentityTokensReadAndWriteBlobs) {
  FakeIdentity id;
  const StorageOptions o = identityOptions(id);
  storage::createContainer(azurite_->url("identity"), o);
  auto s = storage::openStorage(azurite_->url("identity/run"), o);
  s->writeBytes("a", "written with a managed identity");
  EXPECT_EQ(s->readRange("a", 13, 9), "a managed");
  EXPECT_EQ(s->list("").size(), 1u);
  EXPECT_EQ(id.lastQuery, "https://storage.azure.com/ 2018-02-01 0f1e2d3c-client");
  // One token for the whole session: it lasts an hour.
  EXPECT_EQ(id.calls, 2) << "one per client: createContainer's and openStorage's";
}

TEST_F(BearerTest, ATokenAboutToExpireIsFetchedAgain) {
  FakeIdentity id;
  id.lifetime = 120;  // inside the five minutes before expiry: every request refreshes
  const StorageOptions o = identityOptions(id);
  storage::createContainer(azurite_->url("short-lived"), o);
  auto s = storage::openStorage(azurite_->url("short-lived"), o);
  const int before = id.calls;
  s->writeBytes("a", "1");
  s->writeBytes("b", "2");
  EXPECT_EQ(s->size("b"), 1);
  EXPECT_EQ(id.calls - before, 3);
}

TEST_F(BearerTest, TheStorageServiceChecksTheTokens) {
  // Control: Azurite refuses a token for another audience, so the tests
  // above show tokens that were checked.
  FakeIdentity id;
  id.audience = "https://vault.azure.net";
  const std::string e = test::errorOf([&] { storage::createContainer(azurite_->url("wrong-aud"), identityOptions(id)); });
  EXPECT_NE(e.find("403"), std::string::npos) << e;
  ASSERT_FALSE(id.lastToken.empty());
  EXPECT_EQ(e.find(id.lastToken), std::string::npos) << "the token is in the message";
}

TEST_F(BearerTest, TransientIdentityFailuresAreRetriedOthersNamed) {
  FakeIdentity id;
  id.failures = 2;
  storage::createContainer(azurite_->url("retried"), identityOptions(id));
  EXPECT_EQ(id.calls, 3);

  FakeIdentity missing;  // a client that forgets the Metadata header gets a 400
  StorageOptions o = identityOptions(missing);
  o.identityEndpoint = "http://127.0.0.1:" + std::to_string(missing.http.port()) + "/nothing-here";
  const std::string e = test::errorOf([&] { storage::createContainer(azurite_->url("none"), o); });
  EXPECT_NE(e.find("managed identity endpoint http://127.0.0.1:"), std::string::npos) << e;
  EXPECT_NE(e.find("404"), std::string::npos) << e;
  EXPECT_NE(e.find("after 4 attempts"), std::string::npos) << e;  // IMDS's 404 is retried
}

TEST_F(BearerTest, AFixedTokenFromTheEnvironmentOrAFile) {
  setenv("AZURE_STORAGE_BEARER_TOKEN", jwt("https://storage.azure.com", nowSeconds() + 3600).c_str(), 1);
  StorageOptions o;
  o.caFile = azurite_->caFile();
  storage::createContainer(azurite_->url("fixed"), o);
  storage::openStorage(azurite_->url("fixed"), o)->writeBytes("x", "env");
  unsetenv("AZURE_STORAGE_BEARER_TOKEN");

  test::TempDir dir;
  const std::string file = dir.file("credentials");
  test::writeText(file, "token = " + jwt("https://storage.azure.com", nowSeconds() + 3600) + "\n");
  o.credentialsFile = file;
  EXPECT_EQ(storage::openStorage(azurite_->url("fixed"), o)->readRange("x", 0, 3), "env");
}

TEST(Bearer, TokensTravelOverHttpsOnly) {
  setenv("AZURE_STORAGE_BEARER_TOKEN", "eyJ.fake.token", 1);
  StorageOptions o;
  o.allowInsecure = true;
  const std::string e =
      test::errorOf([&] { storage::openStorage("http://127.0.0.1:1/devstoreaccount1/ctr/p", o); });
  unsetenv("AZURE_STORAGE_BEARER_TOKEN");
  EXPECT_NE(e.find("https only"), std::string::npos) << e;
}

TEST(Bearer, TokenAnswersAreParsedOrNamed) {
  namespace sd = storage::detail;
  const auto now = SysClock::now();
  auto t = sd::parseTokenResponse(R"({"access_token":"abc","expires_on":"1700000000"})", "E", now);
  EXPECT_EQ(t.token, "abc");
  EXPECT_EQ(SysClock::to_time_t(t.expires), 1700000000);
  t = sd::parseTokenResponse(R"({"access_token":"abc","expires_in":600})", "E", now);
  EXPECT_EQ(std::chrono::duration_cast<std::chrono::seconds>(t.expires - now).count(), 600);
  for (const char* bad : {"not json", R"({"expires_in":1})", R"({"access_token":"a"})",
                          R"({"access_token":"a","expires_on":"soon"})", R"([1,2])"}) {
    const std::string e = test::errorOf([&] { sd::parseTokenResponse(bad, "http://imds/token", now); });
    EXPECT_NE(e.find("managed identity endpoint http://imds/token"), std::string::npos)
        << bad << ": " << e;
  }
}

}  // namespace
}  // namespace cohort
