// `cohort serve`'s continuous batching and paged key/value cache, as
// clients see them (real server processes on a small trained gpt, util/deploy.h):
// requests join a generation under way and get the tokens they get alone;
// a client that leaves mid-stream frees its cache blocks at the next token;
// prompts fed in parts give the same text; a prompt past the context is a
// 400 or is cut from the left; the generation metrics appear, pass
// promtool, and count what ran.

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_paths.h"
#include "util/deploy.h"
#include "util/jobs.h"

namespace cohort::batching {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A `cohort serve` process on a free port (SIGKILLed by its Process guard
// when a test ends early).
class GptServer {
 public:
  GptServer(const test::TempDir& dir, const std::string& run, std::vector<std::string> args) {
    static std::atomic<int> count{0};
    portFile_ = dir.file("batching-port-" + std::to_string(count++));
    std::vector<std::string> argv{test::cohortBin(), "serve", run, "--port", "0", "--port-file", portFile_};
    argv.insert(argv.end(), args.begin(), args.end());
    process_ = std::make_unique<test::Process>(argv);
    port_ = test::waitForPortFile(portFile_);
    EXPECT_GT(port_, 0) << "no port file; stderr:\n" << process_->stderrSoFar();
  }
  int port() const { return port_; }
  test::Process& process() { return *process_; }

  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_read_timeout(120, 0);
    c->set_connection_timeout(10, 0);
    return c;
  }
  // {status, parsed body}; status 0 when the request failed.
  std::pair<int, json> generate(const json& request) const {
    auto r = client()->Post("/v1/generate", request.dump(), "application/json");
    if (!r) return {0, json{{"error", httplib::to_string(r.error())}}};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  std::string metricsText() const {
    auto r = client()->Get("/metrics");
    return r ? r->body : "";
  }
  // One sample of /metrics ("name{labels}" as printed), or -1.
  double metric(const std::string& sample) const {
    std::istringstream in(metricsText());
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(sample + " ", 0) == 0) return std::stod(line.substr(sample.size() + 1));
    }
    return -1;
  }
  // Streams `request` until `keepReading` says stop (asked after each
  // chunk with the lines so far), then closes the connection. The lines read.
  int streamUntil(json request, const std::function<bool(int)>& keepReading) const {
    request["stream"] = true;
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/generate";
    req.body = request.dump();
    req.set_header("Content-Type", "application/json");
    int lines = 0;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      lines += static_cast<int>(std::count(data, data + n, '\n'));
      return keepReading(lines);
    };
    httplib::Response res;
    httplib::Error error = httplib::Error::Success;
    c.send(req, res, error);
    return lines;
  }
  int stop() {
    process_->signal(SIGTERM);
    return process_->wait(std::chrono::seconds(90)).exitCode;
  }

 private:
  std::string portFile_;
  int port_ = 0;
  std::unique_ptr<test::Process> process_;
};

class ContinuousBatching : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    gpt_ = new std::string(test::trainDeployRun(*dir_, test::DeployModel::gpt));
  }
  static void TearDownTestSuite() {
    delete gpt_;
    delete dir_;
    gpt_ = nullptr;
    dir_ = nullptr;
  }
  static test::TempDir* dir_;
  static std::string* gpt_;
};
test::TempDir* ContinuousBatching::dir_ = nullptr;
std::string* ContinuousBatching::gpt_ = nullptr;

// Generations that never end by themselves here (the window shifts past
// block_size 16 again and again): only their client stops them.
const json kEndless{{"prompt", "the lord "}, {"max_tokens", 100000}, {"temperature", 0.9}, {"seed", 3}};

TEST_F(ContinuousBatching, AClientThatLeavesMidStreamFreesItsBlocks) {
  // Blocks of 4 positions: a context of 16 holds up to 4.
  GptServer server(*dir_, *gpt_, {"--kv-block-tokens", "4", "--max-new-tokens", "100000"});
  ASSERT_EQ(server.metric("cohort_serve_kv_cache_blocks_in_use"), 0);
  double heldWhileStreaming = -1, running = -1;
  const int lines = server.streamUntil(kEndless, [&](int n) {
    if (n < 3) return true;
    heldWhileStreaming = server.metric("cohort_serve_kv_cache_blocks_in_use");
    running = server.metric("cohort_serve_requests_running");
    return false;  // the client goes away
  });
  EXPECT_GE(lines, 3);
  // At least the 8 positions a context shift keeps (block_size / 2,
  // infer::Sequence): 2 blocks right after a shift, 3 or 4 in between
  // (9 prompt tokens and more). The metric is read while the generation
  // goes on, at any point of that cycle.
  EXPECT_GE(heldWhileStreaming, 2) << "the window's tokens in blocks of 4";
  EXPECT_LE(heldWhileStreaming, 4) << "never more than the context's 16 positions";
  EXPECT_EQ(running, 1);
  EXPECT_TRUE(test::waitUntil([&] {
    return server.metric("cohort_serve_kv_cache_blocks_in_use") == 0 &&
           server.metric("cohort_serve_requests_running") == 0 && server.metric("cohort_serve_in_flight") == 0;
  }, std::chrono::seconds(60))) << server.metricsText();
  // The server goes on, and reuses the blocks rather than adding some.
  const double total = server.metric("cohort_serve_kv_cache_blocks");
  EXPECT_EQ(server.generate({{"prompt", "a"}, {"max_tokens", 20}}).first, 200);
  EXPECT_EQ(server.metric("cohort_serve_kv_cache_blocks"), total);
  EXPECT_EQ(server.metric("cohort_serve_kv_cache_blocks_in_use"), 0);
  EXPECT_EQ(server.stop(), 0);
}

TEST_F(ContinuousBatching, RequestsJoinAGenerationUnderWayAndGetTheirTextAlone) {
  std::vector<json> requests = {
      {{"prompt", "the "}, {"max_tokens", 30}, {"temperature", 0}},
      {{"prompt", "and he said unto"}, {"max_tokens", 25}, {"temperature", 0.8}, {"top_k", 10}, {"seed", 4}},
      {{"prompt", "a"}, {"max_tokens", 12}, {"temperature", 1.0}, {"seed", 9}},
  };
  GptServer server(*dir_, *gpt_, {"--max-batch", "8", "--max-delay-ms", "0", "--max-new-tokens", "100000"});
  std::vector<json> alone;
  for (const json& r : requests) {
    const auto [status, body] = server.generate(r);
    ASSERT_EQ(status, 200) << body;
    alone.push_back(body);
  }
  const double batchesAlone = server.metric("cohort_serve_batch_size_count");
  EXPECT_EQ(server.metric(R"(cohort_serve_batch_size_bucket{le="1"})"), batchesAlone) << "one row at a time";

  // A generation under way; the requests join it, each in its own time.
  std::atomic<bool> joinedDone{false};
  std::vector<std::pair<int, json>> joined(requests.size());
  double runningSeen = 0;
  std::thread endless([&] { server.streamUntil(kEndless, [&](int) { return !joinedDone.load(); }); });
  if (!test::waitUntil([&] { return server.metric("cohort_serve_requests_running") == 1; }, std::chrono::seconds(60))) {
    joinedDone = true;
    endless.join();
    FAIL() << "the endless generation did not start:\n" << server.metricsText();
  }
  {
    std::atomic<size_t> answered{0};
    std::vector<std::thread> clients;
    for (size_t i = 0; i < requests.size(); ++i) {
      clients.emplace_back([&, i] {
        std::this_thread::sleep_for(std::chrono::milliseconds(30 * static_cast<int>(i)));
        joined[i] = server.generate(requests[i]);
        ++answered;
      });
    }
    while (answered.load() < requests.size()) {
      runningSeen = std::max(runningSeen, server.metric("cohort_serve_requests_running"));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    for (auto& t : clients) t.join();
  }
  joinedDone = true;
  endless.join();
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_EQ(joined[i].first, 200) << joined[i].second;
    EXPECT_EQ(joined[i].second["tokens"], alone[i]["tokens"]) << requests[i];
    EXPECT_EQ(joined[i].second["text"], alone[i]["text"]) << requests[i];
  }
  EXPECT_GE(runningSeen, 2) << "requests ran beside the endless generation";
  // Forwards of more than one row ran: the requests' steps beside the
  // endless one's.
  EXPECT_LT(server.metric(R"(cohort_serve_batch_size_bucket{le="1"})"), server.metric("cohort_serve_batch_size_count"));
  EXPECT_TRUE(test::waitUntil([&] { return server.metric("cohort_serve_kv_cache_blocks_in_use") == 0; },
                              std::chrono::seconds(60)));
  EXPECT_EQ(server.stop(), 0);
}

TEST_F(ContinuousBatching, PromptsFedInPartsGiveTheSameTokens) {
  const std::vector<json> requests = {
      {{"prompt", "and he said unto"}, {"max_tokens", 20}, {"temperature", 0}},
      {{"prompt", "in the beginning"}, {"max_tokens", 20}, {"temperature", 0.7}, {"seed", 5}},
  };
  std::vector<json> whole;
  {
    GptServer server(*dir_, *gpt_, {"--max-delay-ms", "0"});
    for (const json& r : requests) whole.push_back(server.generate(r).second);
    EXPECT_EQ(server.stop(), 0);
  }
  // Three tokens a step beyond one per generation: a prompt of 16 takes
  // several steps, beside the other's, before its first token.
  GptServer parts(*dir_, *gpt_, {"--max-step-tokens", "3", "--max-batch", "2", "--max-delay-ms", "600000"});
  std::vector<std::pair<int, json>> got(requests.size());
  {
    std::vector<std::thread> clients;
    for (size_t i = 0; i < requests.size(); ++i) clients.emplace_back([&, i] { got[i] = parts.generate(requests[i]); });
    for (auto& t : clients) t.join();
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_EQ(got[i].first, 200) << got[i].second;
    EXPECT_EQ(got[i].second["tokens"], whole[i]["tokens"]) << requests[i];
  }
  // 40 tokens in all, and more forwards than tokens of the longer one: the
  // prompts went in parts.
  EXPECT_EQ(parts.metric("cohort_serve_generated_tokens_total"), 40);
  EXPECT_GT(parts.metric("cohort_serve_batch_size_count"), 20);
  EXPECT_EQ(parts.stop(), 0);
}

TEST_F(ContinuousBatching, ALongPromptIsRefusedOrCutFromTheLeft) {
  const std::string prompt = "and it came to pass in those days, that";  // 39 bytes, block_size 16
  {
    GptServer server(*dir_, *gpt_, {});
    const auto [status, body] = server.generate({{"prompt", prompt}, {"max_tokens", 4}});
    EXPECT_EQ(status, 400) << body;
    const std::string error = body.value("error", "");
    EXPECT_NE(error.find("39 tokens"), std::string::npos) << error;
    EXPECT_NE(error.find("at most 16"), std::string::npos) << error;
    EXPECT_NE(error.find("--truncate-prompt left"), std::string::npos) << error;
    EXPECT_EQ(server.stop(), 0);
  }
  GptServer server(*dir_, *gpt_, {"--truncate-prompt", "left"});
  const json cut = {{"prompt", prompt}, {"max_tokens", 10}, {"temperature", 0}};
  const auto [status, body] = server.generate(cut);
  ASSERT_EQ(status, 200) << body;
  EXPECT_EQ(body["prompt_tokens"], 15) << "block_size - 1 tokens kept";
  const auto [lastStatus, last] = server.generate({{"prompt", prompt.substr(prompt.size() - 15)}, {"max_tokens", 10},
                                                   {"temperature", 0}});
  ASSERT_EQ(lastStatus, 200) << last;
  EXPECT_EQ(body["tokens"], last["tokens"]) << "the prompt's last 15 bytes";
  EXPECT_EQ(server.stop(), 0);
  const test::ProcessResult bad =
      test::cohort({"serve", *gpt_, "--port", "0", "--truncate-prompt", "right"}, {}, std::chrono::seconds(60));
  EXPECT_EQ(bad.exitCode, 2) << bad.describe();
}

TEST_F(ContinuousBatching, GenerationMetricsParseAndCount) {
  ASSERT_TRUE(fs::exists(COHORT_PROMTOOL)) << COHORT_PROMTOOL << " is missing (scripts/install-deps.sh)";
  GptServer server(*dir_, *gpt_, {"--max-delay-ms", "0"});
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(server.generate({{"prompt", "the "}, {"max_tokens", 5 + i}, {"seed", i}}).first, 200);
  }
  const std::string text = server.metricsText();
  const std::string file = dir_->file("batching-metrics.txt");
  test::writeText(file, text);
  const test::ProcessResult check =
      test::run({"/bin/sh", "-c", "exec \"$0\" check metrics < \"$1\"", COHORT_PROMTOOL, file});
  EXPECT_EQ(check.exitCode, 0) << check.describe() << "\n" << text;
  EXPECT_EQ(server.metric("cohort_serve_generated_tokens_total"), 5 + 6 + 7);
  EXPECT_EQ(server.metric("cohort_serve_prompt_tokens_total"), 3 * 4);
  EXPECT_EQ(server.metric("cohort_serve_time_to_first_token_seconds_count"), 3);
  EXPECT_EQ(server.metric("cohort_serve_time_between_tokens_seconds_count"), 4 + 5 + 6);
  EXPECT_GT(server.metric("cohort_serve_time_to_first_token_seconds_sum"), 0);
  EXPECT_EQ(server.metric("cohort_serve_requests_waiting"), 0);
  EXPECT_EQ(server.metric("cohort_serve_requests_running"), 0);
  EXPECT_EQ(server.metric("cohort_serve_kv_cache_blocks_in_use"), 0);
  EXPECT_GE(server.metric("cohort_serve_kv_cache_blocks"), 1);
  EXPECT_GT(server.metric("cohort_serve_kv_cache_block_bytes"), 0);
  EXPECT_EQ(server.stop(), 0);
}

}  // namespace
}  // namespace cohort::batching
