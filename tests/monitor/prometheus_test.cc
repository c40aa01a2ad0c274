// The Prometheus exposition and the /metrics endpoint, checked by
// Prometheus itself: `promtool check metrics`, and a real Prometheus server
// on loopback scraping the endpoint (Debian's prometheus package, unpacked
// by scripts/install-deps.sh; see COHORT_PROMTOOL / COHORT_PROMETHEUS).

#include "cohort/monitor/prometheus.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <thread>

#include "cohort/core/error.h"
#include "cohort/core/net.h"
#include "test_paths.h"
#include "util/process.h"

namespace cohort {
namespace {

using monitor::MetricsServer;
using monitor::PrometheusText;
using Clock = std::chrono::steady_clock;

constexpr size_t kSeries = 9;  // the series exposition() holds
const std::string kTrickyLabel = "C:\\runs\\\"quoted\"\nsecond line";

// What a training process would expose; `scrapes` counts the calls.
std::string exposition(int64_t scrapes) {
  return PrometheusText()
      .gauge("cohort_train_loss", "Mean training loss since the previous record", 0.4637)
      .counter("cohort_train_images_total", "Training images processed, all ranks", 480256)
      .gauge("cohort_rank_step", "Optimizer steps done", 50, {{"rank", "0"}})
      .gauge("cohort_rank_step", "Optimizer steps done", 49, {{"rank", "1"}})
      .gauge("cohort_test_path_info", "A label value that needs escaping", 1,
             {{"path", kTrickyLabel}})
      .gauge("cohort_test_nan", "Not a number", std::numeric_limits<double>::quiet_NaN())
      .gauge("cohort_test_inf", "Infinite", std::numeric_limits<double>::infinity(),
             {{"sign", "plus"}})
      .gauge("cohort_test_inf", "Infinite", -std::numeric_limits<double>::infinity(),
             {{"sign", "minus"}})
      .counter("cohort_test_scrapes_total", "Scrapes answered", static_cast<double>(scrapes))
      .str();
}

// A missing binary fails the test (never a silent skip).
::testing::AssertionResult installed(const std::string& path) {
  if (access(path.c_str(), X_OK) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << path << " is missing: run scripts/install-deps.sh (it unpacks Debian's prometheus "
         << "package, promtool and server, into that directory)";
}

// `promtool check metrics < text`: parses and lints an exposition.
test::ProcessResult promtoolCheck(const std::string& text) {
  test::TempDir dir;
  test::writeText(dir.file("metrics.txt"), text);
  return test::run({"/bin/sh", "-c", "exec \"$0\" check metrics < \"$1\"", COHORT_PROMTOOL,
                    dir.file("metrics.txt")},
                   {}, std::chrono::minutes(1));
}

httplib::Result get(int port, const std::string& path) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(5);
  c.set_read_timeout(5);
  return c.Get(path.c_str());
}

TEST(PrometheusText, FormatsFamiliesOnceWithTheirSamplesTogether) {
  PrometheusText t;
  t.gauge("a_value", "First", 1.5, {{"rank", "0"}});
  t.counter("b_events_total", "Second", 3);
  t.gauge("a_value", "First", -2, {{"rank", "1"}});  // joins its family above
  t.gauge("c:ratio", "Help with \\ and\nnewline", 0.1);
  EXPECT_EQ(t.str(),
            "# HELP a_value First\n"
            "# TYPE a_value gauge\n"
            "a_value{rank=\"0\"} 1.5\n"
            "a_value{rank=\"1\"} -2\n"
            "# HELP b_events_total Second\n"
            "# TYPE b_events_total counter\n"
            "b_events_total 3\n"
            "# HELP c:ratio Help with \\\\ and\\nnewline\n"
            "# TYPE c:ratio gauge\n"
            "c:ratio 0.1\n");
  EXPECT_EQ(PrometheusText().str(), "");
}

TEST(PrometheusText, EscapesLabelValuesAndSpellsSpecialValues) {
  PrometheusText t;
  t.gauge("x", "h", std::numeric_limits<double>::quiet_NaN(), {{"path", kTrickyLabel}, {"b", ""}});
  t.gauge("y", "h", std::numeric_limits<double>::infinity());
  t.gauge("z", "h", -std::numeric_limits<double>::infinity());
  t.gauge("w", "h", 1e300);
  t.gauge("v", "h", 123456789012.0);
  EXPECT_EQ(t.str(),
            "# HELP x h\n# TYPE x gauge\n"
            "x{path=\"C:\\\\runs\\\\\\\"quoted\\\"\\nsecond line\",b=\"\"} NaN\n"
            "# HELP y h\n# TYPE y gauge\ny +Inf\n"
            "# HELP z h\n# TYPE z gauge\nz -Inf\n"
            "# HELP w h\n# TYPE w gauge\nw 1e+300\n"
            "# HELP v h\n# TYPE v gauge\nv 123456789012\n");
}

TEST(PrometheusText, RefusesBadNames) {
  for (const std::string bad : {"", "1st", "has space", "dash-ed", "dot.ted", "ünicode", "a{b}"}) {
    EXPECT_FALSE(monitor::isValidMetricName(bad)) << bad;
    try {
      PrometheusText().gauge(bad, "h", 1);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + bad + "'"), std::string::npos) << e.what();
    }
  }
  for (const std::string good : {"a", "_a", ":a", "cohort_train_loss", "job:rate5m", "A9_:"}) {
    EXPECT_TRUE(monitor::isValidMetricName(good)) << good;
  }
  for (const std::string badLabel : {"", "9x", "__reserved", "with-dash", "a:b"}) {
    EXPECT_THROW(PrometheusText().gauge("m", "h", 1, {{badLabel, "v"}}), ConfigError) << badLabel;
  }
  EXPECT_THROW(PrometheusText().gauge("m", "h", 1, {{"a", "1"}, {"a", "2"}}), ConfigError);
  EXPECT_THROW(PrometheusText().counter("m_total", "h", -1), ConfigError);
  // One family, one type and one help.
  EXPECT_THROW(PrometheusText().gauge("m", "h", 1).counter("m", "h", 1), ConfigError);
  EXPECT_THROW(PrometheusText().gauge("m", "h", 1).gauge("m", "other", 1), ConfigError);
}

TEST(PrometheusText, PromtoolAcceptsItAndRejectsBrokenText) {
  ASSERT_TRUE(installed(COHORT_PROMTOOL));
  auto ok = promtoolCheck(exposition(7));
  EXPECT_EQ(ok.exitCode, 0) << ok.describe();
  // The checker is real: a malformed line and a lint problem both fail it.
  auto malformed = promtoolCheck("# TYPE m gauge\nm{a=\"unterminated} 1\n");
  EXPECT_NE(malformed.exitCode, 0) << malformed.describe();
  auto lint = promtoolCheck("# HELP m_count h\n# TYPE m_count counter\nm_count 1\n");
  EXPECT_NE(lint.exitCode, 0) << lint.describe();
}

TEST(PrometheusEndpoint, ServesMetricsAnd404Elsewhere) {
  std::atomic<int> scrapes{0};
  MetricsServer s({"127.0.0.1", 0}, [&] { return exposition(++scrapes); });
  EXPECT_EQ(s.port(), 0);
  s.start();
  ASSERT_GT(s.port(), 0);
  EXPECT_EQ(s.address(), "127.0.0.1:" + std::to_string(s.port()));

  auto r = get(s.port(), "/metrics");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0), 0u)
      << r->get_header_value("Content-Type");
  EXPECT_EQ(r->body, exposition(1));
  EXPECT_EQ(get(s.port(), "/metrics")->body, exposition(2)) << "rendered per scrape";

  for (const char* path : {"/", "/metric", "/metrics/x", "/favicon.ico"}) {
    auto nf = get(s.port(), path);
    ASSERT_TRUE(nf) << path;
    EXPECT_EQ(nf->status, 404) << path;
  }
  if (access(COHORT_PROMTOOL, X_OK) == 0) {
    auto check = promtoolCheck(get(s.port(), "/metrics")->body);
    EXPECT_EQ(check.exitCode, 0) << check.describe();
  }

  const auto t0 = Clock::now();
  s.stop();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3));
  EXPECT_FALSE(get(s.port(), "/metrics")) << "still serving after stop()";
  s.stop();  // idempotent
}

TEST(PrometheusEndpoint, ARenderErrorIs500AndServingGoesOn) {
  std::atomic<bool> fail{true};
  MetricsServer s({}, [&]() -> std::string {
    if (fail) throw Error("the trainer is gone");
    return "# HELP up h\n# TYPE up gauge\nup 1\n";
  });
  s.start();
  auto r = get(s.port(), "/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500);
  EXPECT_NE(r->body.find("the trainer is gone"), std::string::npos) << r->body;
  fail = false;
  EXPECT_EQ(get(s.port(), "/metrics")->status, 200);
}

TEST(PrometheusEndpoint, APortInUseIsAnErrorNamingIt) {
  MetricsServer first({"127.0.0.1", 0}, [] { return std::string(); });
  first.start();
  MetricsServer second({"127.0.0.1", first.port()}, [] { return std::string(); });
  try {
    second.start();
    FAIL() << "a second server bound port " << first.port();
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(first.port())),
              std::string::npos)
        << e.what();
  }
  // An address that is not this machine's (TEST-NET-1), with the token
  // any address beyond loopback needs.
  monitor::MetricsServerConfig foreignConfig("192.0.2.1", 0);
  foreignConfig.token = "t";
  MetricsServer foreign(foreignConfig, [] { return std::string(); });
  EXPECT_THROW(foreign.start(), CommError);
  EXPECT_THROW(MetricsServer({"127.0.0.1", 70000}, [] { return std::string(); }).start(),
               ConfigError);
  EXPECT_EQ(get(first.port(), "/metrics")->status, 200) << "the first server is untouched";
}

TEST(PrometheusEndpoint, StopDoesNotWaitForIdleKeepAliveClients) {
  MetricsServer s({}, [] { return exposition(1); });
  s.start();
  httplib::Client c("127.0.0.1", s.port());
  c.set_keep_alive(true);
  ASSERT_EQ(c.Get("/metrics")->status, 200);
  // A client connected and silent (no request at all).
  const int idle = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(s.port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(idle, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const auto t0 = Clock::now();
  s.stop();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3));
  close(idle);
}

// A real Prometheus server scrapes the endpoint every second; its query API
// must return our samples, label escaping undone.
TEST(PrometheusEndpoint, PrometheusScrapesIt) {
  ASSERT_TRUE(installed(COHORT_PROMETHEUS));
  std::atomic<int> scrapes{0};
  MetricsServer s({"127.0.0.1", 0}, [&] { return exposition(++scrapes); });
  s.start();

  test::TempDir dir;
  test::writeText(dir.file("prometheus.yml"),
                  "global:\n"
                  "  scrape_interval: 1s\n"
                  "  scrape_timeout: 1s\n"
                  "  evaluation_interval: 1s\n"
                  "scrape_configs:\n"
                  "  - job_name: cohort\n"
                  "    static_configs:\n"
                  "      - targets: ['" + s.address() + "']\n");
  const int webPort = test::freePort();
  test::Process prometheus({COHORT_PROMETHEUS, "--config.file=" + dir.file("prometheus.yml"),
                            "--storage.tsdb.path=" + dir.file("data"),
                            "--web.listen-address=127.0.0.1:" + std::to_string(webPort),
                            "--log.level=warn"});

  // Polls the query API until every series of ours is there.
  std::map<std::string, nlohmann::json> series;  // name + labels -> [time, "value"]
  const auto deadline = Clock::now() + std::chrono::seconds(90);
  while (series.size() < kSeries && Clock::now() < deadline) {
    prometheus.stderrSoFar();  // keeps its log pipe from filling
    httplib::Client c("127.0.0.1", webPort);
    c.set_connection_timeout(2);
    c.set_read_timeout(5);
    auto r = c.Get("/api/v1/query?query=%7B__name__%3D~%22cohort_.%2A%22%7D");
    if (r && r->status == 200) {
      const auto j = nlohmann::json::parse(r->body, nullptr, false);
      series.clear();
      if (j.is_object() && j["status"] == "success") {
        for (const auto& e : j["data"]["result"]) {
          const auto& m = e["metric"];
          std::string key = m["__name__"].get<std::string>();
          for (const char* label : {"rank", "path", "sign"}) {
            if (m.contains(label)) key += std::string(" ") + label + "=" + m[label].get<std::string>();
          }
          series[key] = e["value"];
        }
      }
    }
    if (series.size() < kSeries) std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  ASSERT_EQ(series.size(), kSeries) << "Prometheus did not return our series in time; stderr:\n"
                                << prometheus.stderrSoFar();
  EXPECT_EQ(series["cohort_train_loss"][1], "0.4637");
  EXPECT_EQ(series["cohort_train_images_total"][1], "480256");
  EXPECT_EQ(series["cohort_rank_step rank=0"][1], "50");
  EXPECT_EQ(series["cohort_rank_step rank=1"][1], "49");
  EXPECT_EQ(series["cohort_test_path_info path=" + kTrickyLabel][1], "1")
      << "the label value did not survive escaping";
  EXPECT_EQ(series["cohort_test_nan"][1], "NaN");
  EXPECT_EQ(series["cohort_test_inf sign=plus"][1], "+Inf");
  EXPECT_EQ(series["cohort_test_inf sign=minus"][1], "-Inf");
  EXPECT_GE(std::stod(series["cohort_test_scrapes_total"][1].get<std::string>()), 1.0);
  EXPECT_GE(scrapes.load(), 1);

  prometheus.signal(SIGTERM);
  auto r = prometheus.wait(std::chrono::seconds(120));
  EXPECT_FALSE(r.timedOut) << r.describe();
}

}  // namespace
}  // namespace cohort

namespace cohort {
namespace {

TEST(PrometheusEndpoint, ATokenIsRequiredBeyondLoopbackAndChecked) {
  // Listening on every address without a token is refused before binding.
  MetricsServer open({"0.0.0.0", 0}, [] { return exposition(1); });
  try {
    open.start();
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("metrics_token_file"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(isLoopbackAddress("127.0.0.1"));
  EXPECT_TRUE(isLoopbackAddress("::1"));
  EXPECT_FALSE(isLoopbackAddress("10.0.0.1"));

  monitor::MetricsServerConfig c;
  c.host = "0.0.0.0";
  c.token = "s3cret-token";
  MetricsServer s(c, [] { return exposition(1); });
  s.start();
  httplib::Client client("127.0.0.1", s.port());
  auto none = client.Get("/metrics");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(none->get_header_value("WWW-Authenticate"), "Bearer");
  EXPECT_EQ(none->body.find("s3cret"), std::string::npos);
  auto wrong = client.Get("/metrics", {{"Authorization", "Bearer s3cret-tokem"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  auto other = client.Get("/other", {{"Authorization", "Bearer nope"}});
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 401) << "every path needs the token";
  auto right = client.Get("/metrics", {{"Authorization", "Bearer s3cret-token"}});
  ASSERT_TRUE(right);
  EXPECT_EQ(right->status, 200);
  EXPECT_EQ(right->body, exposition(1));
}

TEST(PrometheusEndpoint, ServesHttpsWithTheGivenCertificate) {
  test::TempDir dir;
  const std::string cert = dir.file("cert.pem"), key = dir.file("key.pem");
  const auto made = test::run({"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                               "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1",
                               "-addext", "subjectAltName=IP:127.0.0.1"},
                              {}, std::chrono::seconds(60));
  ASSERT_EQ(made.exitCode, 0) << made.describe();
  monitor::MetricsServerConfig c;
  c.tlsCert = cert;
  c.tlsKey = key;
  MetricsServer s(c, [] { return exposition(2); });
  s.start();

  httplib::SSLClient trusted("127.0.0.1", s.port());
  trusted.set_ca_cert_path(cert.c_str());
  trusted.enable_server_certificate_verification(true);
  auto r = trusted.Get("/metrics");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, exposition(2));

  // A client that does not trust the certificate, and plain http, get nothing.
  httplib::SSLClient untrusted("127.0.0.1", s.port());
  untrusted.enable_server_certificate_verification(true);
  untrusted.set_ca_cert_path("/dev/null");
  EXPECT_FALSE(untrusted.Get("/metrics"));
  httplib::Client plain("127.0.0.1", s.port());
  plain.set_read_timeout(2, 0);
  auto p = plain.Get("/metrics");
  EXPECT_TRUE(!p || p->status != 200);

  // A certificate without its key is a configuration error.
  monitor::MetricsServerConfig half;
  half.tlsCert = cert;
  EXPECT_THROW(MetricsServer(half, [] { return std::string(); }).start(), ConfigError);
  monitor::MetricsServerConfig wrongKey;
  wrongKey.tlsCert = cert;
  wrongKey.tlsKey = cert;
  EXPECT_THROW(MetricsServer(wrongKey, [] { return std::string(); }).start(), ConfigError);
}

}  // namespace
}  // namespace cohort
