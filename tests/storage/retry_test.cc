// The blob backend against scripted HTTP servers (cpp-httplib): retries and
// their backoff, Retry-After, timeouts of stalled servers, errors that are
// not retried, and downloads resumed where they broke off.

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "cohort/storage/storage.h"
#include "storage_helpers.h"
#include "util/fake_http.h"

namespace cohort::storage {
namespace {

// ---------------------------------------------------------------------------
// Fake servers: retries, backoff, timeouts

StorageOptions fakeOptions() {
  StorageOptions o;
  o.allowInsecure = true;
  o.maxRetries = 4;
  o.retryBaseS = 0.01;
  o.retryMaxS = 0.05;
  o.timeoutS = 10;
  return o;
}

// Serves `data` honouring x-ms-range "bytes=a-b" and "bytes=a-".
void serveRange(const httplib::Request& req, httplib::Response& res, const std::string& data) {
  const std::string range = req.get_header_value("x-ms-range");
  size_t from = 0, to = data.size() - 1;
  if (!range.empty()) {
    const size_t dash = range.find('-');
    from = std::stoul(range.substr(6, dash - 6));
    if (dash + 1 < range.size()) to = std::stoul(range.substr(dash + 1));
  }
  res.status = range.empty() ? 200 : 206;
  res.set_content(data.substr(from, to - from + 1), "application/octet-stream");
}

TEST(StorageRetries, TransientErrorsAreRetriedThenSucceed) {
  test::FakeServer fake;
  LogCapture logs;
  const std::string data = "0123456789";
  std::atomic<int> requests{0};
  fake.server().Get(".*", [&](const httplib::Request& req, httplib::Response& res) {
    if (++requests <= 2) {
      res.status = 503;
      res.set_header("x-ms-error-code", "ServerBusy");
      return;
    }
    serveRange(req, res, data);
  });
  auto s = openStorage(fake.url("cont/p"), fakeOptions());
  EXPECT_EQ(s->readRange("obj", 2, 5), "23456");
  EXPECT_EQ(requests.load(), 3);
  const std::string log = logs.text();
  EXPECT_EQ(countOf(log, "503 ServerBusy; retry"), 2) << log;
  EXPECT_NE(log.find("GET http://127.0.0.1:"), std::string::npos) << log;
  EXPECT_NE(log.find("/devstoreaccount1/cont/p/obj"), std::string::npos) << log;
  EXPECT_EQ(log.find("SIGNATURE"), std::string::npos) << log;
  EXPECT_EQ(log.find("sig="), std::string::npos) << log;
}

TEST(StorageRetries, RetryAfterIsHonoured) {
  test::FakeServer fake;
  LogCapture logs;
  std::atomic<int> requests{0};
  fake.server().Get(".*", [&](const httplib::Request& req, httplib::Response& res) {
    if (++requests == 1) {
      res.status = 429;
      res.set_header("Retry-After", "1");
      return;
    }
    serveRange(req, res, "abc");
  });
  StorageOptions o = fakeOptions();
  o.retryMaxS = 5;
  auto s = openStorage(fake.url("cont"), o);
  EXPECT_EQ(s->readRange("obj", 0, 3), "abc");
  EXPECT_EQ(requests.load(), 2);
  const std::string log = logs.text();
  EXPECT_NE(log.find("429; retry 1/4 in 1.00 s (Retry-After)"), std::string::npos) << log;
}

TEST(StorageRetries, PersistentServerErrorsFailAfterMaxRetries) {
  test::FakeServer fake;
  std::atomic<int> requests{0};
  fake.server().Put(".*", [&](const httplib::Request&, httplib::Response& res) {
    ++requests;
    res.status = 500;
    res.set_content(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>InternalError</Code>"
        "<Message>boom</Message></Error>",
        "application/xml");
  });
  auto s = openStorage(fake.url("cont"), fakeOptions());
  StorageError e = expectStorageError([&] { s->writeBytes("obj", "data"); });
  EXPECT_EQ(requests.load(), 5);  // 1 + maxRetries
  EXPECT_EQ(e.attempts(), 5);
  EXPECT_EQ(e.status(), 500);
  EXPECT_TRUE(e.transient());
  EXPECT_NE(std::string(e.what()).find("500 InternalError (after 5 attempts)"), std::string::npos)
      << e.what();
  EXPECT_EQ(std::string(e.what()).find("SIGNATURE"), std::string::npos) << e.what();
}

TEST(StorageRetries, ClientErrorsAreNotRetried) {
  test::FakeServer fake;
  std::atomic<int> requests{0};
  fake.server().Get(".*", [&](const httplib::Request& req, httplib::Response& res) {
    ++requests;
    res.status = req.path.find("forbidden") != std::string::npos ? 403 : 404;
    res.set_header("x-ms-error-code",
                   res.status == 403 ? "AuthorizationPermissionMismatch" : "BlobNotFound");
  });
  auto s = openStorage(fake.url("cont"), fakeOptions());
  StorageError e = expectStorageError([&] { s->readRange("forbidden", 0, 1); });
  EXPECT_EQ(e.status(), 403);
  EXPECT_EQ(requests.load(), 1);
  EXPECT_NE(std::string(e.what()).find("403 AuthorizationPermissionMismatch"), std::string::npos);
  e = expectStorageError([&] { s->readRange("absent", 0, 1); });
  EXPECT_TRUE(e.notFound());
  EXPECT_EQ(requests.load(), 2);
}

TEST(StorageRetries, StalledRequestsTimeOut) {
  test::FakeServer fake;
  std::atomic<int> requests{0};
  fake.server().Get(".*", [&](const httplib::Request&, httplib::Response& res) {
    ++requests;
    fake.stall();
    res.status = 500;
  });
  StorageOptions o = fakeOptions();
  o.timeoutS = 1;
  o.maxRetries = 1;
  auto s = openStorage(fake.url("cont"), o);
  StorageError e = expectStorageError([&] { s->readRange("obj", 0, 1); });
  EXPECT_TRUE(e.transient());
  EXPECT_EQ(e.attempts(), 2);
  EXPECT_EQ(requests.load(), 2);
  EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
}

TEST(StorageRetries, BrokenDownloadsResumeWhereTheyStopped) {
  test::FakeServer fake;
  const std::string data = randomBytes(300000, 6);
  std::vector<std::string> ranges;
  std::mutex mutex;
  fake.server().Get(".*", [&](const httplib::Request& req, httplib::Response& res) {
    bool first;
    {
      std::lock_guard<std::mutex> g(mutex);
      ranges.push_back(req.get_header_value("x-ms-range"));
      first = ranges.size() == 1;
    }
    if (!first) return serveRange(req, res, data);
    // Announce the whole object, send 100000 bytes, then drop the connection.
    res.set_content_provider(data.size(), "application/octet-stream",
                             [&data](size_t offset, size_t, httplib::DataSink& sink) {
                               if (offset >= 100000) return false;
                               sink.write(data.data() + offset, 100000 - offset);
                               return true;
                             });
  });
  auto s = openStorage(fake.url("cont"), fakeOptions());
  TempDir dir;
  s->readToFile("obj", dir.file("out"));
  EXPECT_EQ(test::readText(dir.file("out")), data);
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[0], "");
  EXPECT_EQ(ranges[1], "bytes=100000-");
}

TEST(StorageUploads, LargeObjectsAreCommittedAsABlockList) {
  test::FakeServer fake;
  std::mutex mutex;
  std::vector<std::string> requests;  // query comp=...&blockid=...
  std::map<std::string, std::string> blocks;
  std::string blockList;
  fake.server().Put(".*", [&](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> g(mutex);
    const std::string comp = req.get_param_value("comp");
    requests.push_back(comp.empty() ? "blob" : comp);
    if (comp == "block") blocks[req.get_param_value("blockid")] = req.body;
    if (comp == "blocklist") blockList = req.body;
    res.status = 201;
  });
  StorageOptions o = fakeOptions();
  o.blockBytes = 1000;
  auto s = openStorage(fake.url("cont"), o);
  const std::string data = randomBytes(3500, 7);
  s->writeBytes("obj", data);
  s->writeBytes("small", std::string(1000, 's'));
  EXPECT_EQ(requests,
            (std::vector<std::string>{"block", "block", "block", "block", "blocklist", "blob"}));
  ASSERT_EQ(blocks.size(), 4u);
  // The block list names every block, in order, with ids of one length.
  std::string joined;
  size_t pos = 0;
  for (int i = 0; i < 4; ++i) {
    const size_t a = blockList.find("<Latest>", pos) + 8;
    const size_t b = blockList.find("</Latest>", a);
    ASSERT_NE(b, std::string::npos) << blockList;
    const std::string id = blockList.substr(a, b - a);
    EXPECT_EQ(id.size(), blocks.begin()->first.size());
    ASSERT_TRUE(blocks.count(id)) << id;
    joined += blocks[id];
    pos = b;
  }
  EXPECT_EQ(joined, data);
}

}  // namespace
}  // namespace cohort::storage
