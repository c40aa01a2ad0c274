// cohort serve's OpenAI API as OpenAI's own Node.js SDK sees it
// (tests/openai/client.mjs): completions, chat, streaming, n = 2, stop
// strings, logprobs, the model list and the SDK's errors, each checked
// against /v1/generate's answer for the same prompt and settings; then
// the bad inputs over plain HTTP, each a 4xx in OpenAI's error shape
// after which the server goes on; and a ChatML template read from the
// run's tokenizer_config.json; the concurrency limit's 429 in that shape too.

#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_paths.h"
#include "util/corpus.h"
#include "util/jobs.h"
#include "util/process.h"

namespace cohort::openai_test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kToken = "sk-cohort-test-key";
constexpr const char* kPrompt = "the lord ";

// A `cohort serve` process on a free port with a bearer token (the API
// key) and --model-name tiny; SIGKILLed by the Process guard if a test
// ends early.
class Server {
 public:
  Server(const test::TempDir& dir, const std::string& run, std::vector<std::string> extra = {}) {
    static int count = 0;
    const std::string portFile = dir.file("port-" + std::to_string(count++));
    std::vector<std::string> argv{test::cohortBin(), "serve", run, "--port", "0", "--port-file", portFile,
                                  "--model-name", "tiny"};
    if (std::find(extra.begin(), extra.end(), "--max-delay-ms") == extra.end()) extra.insert(extra.end(), {"--max-delay-ms", "1"});
    argv.insert(argv.end(), extra.begin(), extra.end());
    process_ = std::make_unique<test::Process>(argv, std::map<std::string, std::string>{{"COHORT_SERVE_TOKEN", kToken}});
    const bool up = test::waitUntil([&] { return fs::exists(portFile); }, std::chrono::seconds(120));
    EXPECT_TRUE(up) << "no port file; stderr:\n" << process_->stderrSoFar();
    if (up) port_ = std::stoi(test::readText(portFile));
  }
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }

  httplib::Result post(const std::string& path, const std::string& body, bool auth = true) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    if (auth) c.set_bearer_token_auth(kToken);
    return c.Post(path.c_str(), body, "application/json");
  }
  httplib::Result get(const std::string& path, bool auth = true) const {
    httplib::Client c("127.0.0.1", port_);
    if (auth) c.set_bearer_token_auth(kToken);
    return c.Get(path.c_str());
  }
  // /v1/generate's answer.
  json generate(const json& request) const {
    const auto r = post("/v1/generate", request.dump());
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
    return r ? json::parse(r->body) : json();
  }
  double metric(const std::string& sample) const {
    const auto m = get("/metrics");
    std::istringstream in(m ? m->body : "");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(sample + " ", 0) == 0) return std::stod(line.substr(sample.size() + 1));
    }
    return -1;
  }
  int stop() {
    process_->signal(SIGTERM);
    return process_->wait(std::chrono::seconds(90)).exitCode;
  }

 private:
  std::unique_ptr<test::Process> process_;
  int port_ = 0;
};

// A GPT with block_size 64 (room for a chat's template) on byte tokens,
// trained a few steps once for the suite.
class OpenAITest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    const std::string base = dir_->file("gpt64");
    fs::create_directories(base);
    test::writeText(base + "/corpus.txt", test::corpus(8'000));
    const test::ProcessResult t = test::cohort({"data", "tokenize", base + "/corpus.txt", base + "/tok", "--no-progress"});
    ASSERT_EQ(t.exitCode, 0) << t.describe();
    test::writeText(base + "/job.yaml", R"(name: gpt64
model: {arch: gpt, n_layer: 1, n_head: 2, n_embd: 32, block_size: 64}
data:
  train: {kind: tokens, path: )" + base + R"(/tok/train}
training: {epochs: 1, max_steps: 6, batch_size: 8, optimizer: {name: adamw, lr: 0.003}}
distribution: {procs_per_node: 1, threads_per_rank: 1, timeout_s: 60}
output: {progress: off}
checkpoint: {enabled: false}
)");
    run_ = new std::string(base + "/run");
    const test::ProcessResult r = test::cohort({"run", base + "/job.yaml", "--run-dir", *run_});
    ASSERT_EQ(r.exitCode, 0) << r.describe();
  }
  static void TearDownTestSuite() {
    delete run_;
    delete dir_;
    run_ = nullptr;
    dir_ = nullptr;
  }
  static test::TempDir* dir_;
  static std::string* run_;
};
test::TempDir* OpenAITest::dir_ = nullptr;
std::string* OpenAITest::run_ = nullptr;

json greedyOf(const std::string& prompt, int maxTokens) {
  return {{"prompt", prompt}, {"max_tokens", maxTokens}, {"temperature", 0}};
}

std::string defaultChatPrompt(const std::string& user) {
  return "<|system|>\nBe brief.\n<|user|>\n" + user + "\n<|assistant|>\n";
}

TEST_F(OpenAITest, TheOfficialClientGetsWhatGenerateGives) {
  const std::string sdk = test::sourceDir() + "/tests/openai/node_modules/openai/package.json";
  ASSERT_TRUE(fs::exists(sdk)) << sdk << " is missing: `npm ci` in tests/openai (scripts/test.sh does it)";
  Server server(*dir_, *run_);
  const test::ProcessResult client =
      test::run({"/usr/bin/node", test::sourceDir() + "/tests/openai/client.mjs", server.url(), kToken, "tiny", kPrompt},
                {}, std::chrono::minutes(5));
  ASSERT_EQ(client.exitCode, 0) << client.describe();
  const json out = json::parse(client.out);
  // The stream the client left after 3 events (of max_tokens 1000) has
  // ended: nothing stays in flight, and the model ran far fewer than 1000
  // inputs for all the client's requests together (about 250).
  EXPECT_EQ(out["abandonedAfter"], 3);
  EXPECT_TRUE(test::waitUntil([&] { return server.metric("cohort_serve_in_flight") == 0; }, std::chrono::seconds(30)));
  const double inputs = server.metric("cohort_serve_batch_size_sum");
  EXPECT_GT(inputs, 100);
  EXPECT_LT(inputs, 600);

  // Completions: the text of /v1/generate, greedy; streamed, the same.
  const json expected = server.generate(greedyOf(kPrompt, 20));
  const std::string text = expected["text"];
  EXPECT_EQ(out["completion"]["object"], "text_completion");
  EXPECT_EQ(out["completion"]["model"], "tiny");
  EXPECT_EQ(out["completion"]["text"], text);
  EXPECT_EQ(out["completion"]["finish"], "length");
  const json usage{{"prompt_tokens", expected["prompt_tokens"]}, {"completion_tokens", 20},
                   {"total_tokens", expected["prompt_tokens"].get<int>() + 20}};
  EXPECT_EQ(out["completion"]["usage"], usage);
  EXPECT_EQ(out["completionStream"]["texts"], json::array({text}));
  EXPECT_EQ(out["completionStream"]["finish"], json::array({"length"}));
  EXPECT_EQ(out["completionStream"]["usage"], usage);
  EXPECT_GT(out["completionStream"]["chunks"].get<int>(), 2);

  // A stop string cuts the text before it, streamed or not.
  const std::string stop = out["stop"];
  const std::string upTo = text.substr(0, text.find(stop));
  EXPECT_EQ(out["stopped"]["text"], upTo);
  EXPECT_EQ(out["stopped"]["finish"], "stop");
  EXPECT_EQ(out["stoppedStream"]["texts"], json::array({upTo}));
  EXPECT_EQ(out["stoppedStream"]["finish"], json::array({"stop"}));

  // n = 2: choice i samples with seed + i, as /v1/generate with that seed.
  const json sampled{{"prompt", kPrompt}, {"max_tokens", 12}, {"temperature", 1}, {"seed", 5}};
  json sampled6 = sampled;
  sampled6["seed"] = 6;
  const json n2 = json::array({server.generate(sampled)["text"], server.generate(sampled6)["text"]});
  EXPECT_EQ(out["n2"]["texts"], n2);
  EXPECT_EQ(out["n2"]["indexes"], json::array({0, 1}));
  EXPECT_EQ(out["n2"]["usage"]["completion_tokens"], 24);
  EXPECT_EQ(out["n2Seed6"], n2[1]);
  EXPECT_EQ(out["n2Stream"]["texts"], n2);

  // logprobs: one entry per token, the tokens spell the text, and greedy
  // picks the most likely of the top 2.
  const json& lp = out["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 4u) << lp;
  std::string spelled;
  for (size_t k = 0; k < 4; ++k) {
    spelled += lp["tokens"][k].get<std::string>();
    const double chosen = lp["token_logprobs"][k];
    EXPECT_LE(chosen, 0);
    ASSERT_EQ(lp["top_logprobs"][k].size(), 2u) << lp;
    double best = -1e9;
    for (const auto& [token, value] : lp["top_logprobs"][k].items()) best = std::max(best, value.get<double>());
    EXPECT_NEAR(chosen, best, 1e-9);
  }
  EXPECT_EQ(spelled, out["logprobsText"]);
  EXPECT_EQ(lp["text_offset"][0], std::string(kPrompt).size());

  // Chat: the messages through the default template, ended at the next
  // turn's marker.
  const json chatExpected{{"prompt", defaultChatPrompt(kPrompt)}, {"max_tokens", 20}, {"temperature", 0},
                          {"stop", "\n<|"}};
  const json reply = server.generate(chatExpected);
  EXPECT_EQ(out["chat"]["object"], "chat.completion");
  EXPECT_EQ(out["chat"]["message"]["role"], "assistant");
  EXPECT_EQ(out["chat"]["message"]["content"], reply["text"]);
  EXPECT_EQ(out["chat"]["finish"], reply["finish_reason"]);
  EXPECT_EQ(out["chat"]["usage"]["prompt_tokens"], reply["prompt_tokens"]);
  const json& content = out["chat"]["logprobs"]["content"];
  EXPECT_EQ(content.size(), reply["tokens"].size());  // one byte a token
  if (!content.empty()) {
    EXPECT_EQ(content[0]["top_logprobs"].size(), 2u);
  }
  EXPECT_EQ(out["chatStream"]["texts"], json::array({reply["text"], reply["text"]}));
  EXPECT_EQ(out["chatStream"]["role"], "assistant");

  EXPECT_EQ(out["models"], json::array({"tiny"}));
  EXPECT_EQ(out["retrieved"], "tiny");

  // The SDK's errors, from OpenAI's error object and status.
  for (const char* which : {"unknownModel", "unknownChatModel"}) {
    EXPECT_EQ(out[which]["name"], "NotFoundError") << out[which];
    EXPECT_EQ(out[which]["notFound"], true);
    EXPECT_EQ(out[which]["status"], 404);
    EXPECT_EQ(out[which]["code"], "model_not_found");
    EXPECT_EQ(out[which]["param"], "model");
  }
  EXPECT_EQ(out["badKey"]["status"], 401) << out["badKey"];
  EXPECT_EQ(out["badKey"]["authentication"], true);
  EXPECT_EQ(out["badKey"]["code"], "invalid_api_key");
  for (const auto& [which, param] : std::vector<std::pair<const char*, const char*>>{
           {"noContent", "messages.[0].content"}, {"tooMany", "n"}, {"negative", "max_tokens"}, {"tooLong", "prompt"}}) {
    EXPECT_EQ(out[which]["status"], 400) << which << ": " << out[which];
    EXPECT_EQ(out[which]["badRequest"], true) << which;
    EXPECT_EQ(out[which]["type"], "invalid_request_error") << which;
    EXPECT_EQ(out[which]["param"], param) << which;
  }
  EXPECT_EQ(out["tooLong"]["code"], "context_length_exceeded");

  // 8 answered, and the stream left (counted at its first bytes).
  EXPECT_EQ(server.metric(R"(cohort_serve_requests_total{endpoint="/v1/completions",code="200"})"), 9);
  EXPECT_EQ(server.stop(), 0);
}

void expectOpenAIError(const httplib::Result& r, int status, const std::string& what) {
  ASSERT_TRUE(r) << what << ": no answer";
  EXPECT_EQ(r->status, status) << what << ": " << r->body;
  const json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error") && j["error"].is_object()) << what << ": " << r->body;
  for (const char* key : {"message", "type", "param", "code"}) {
    EXPECT_TRUE(j["error"].contains(key)) << what << ": no " << key << " in " << r->body;
  }
}

TEST_F(OpenAITest, BadInputIsA4xxInOpenAIsShapeAndTheServerGoesOn) {
  Server server(*dir_, *run_, {"--max-body-bytes", "65536", "--max-new-tokens", "64"});
  const json ok{{"model", "tiny"}, {"prompt", kPrompt}, {"max_tokens", 2}};
  auto with = [&](const char* key, const json& value) {
    json j = ok;
    j[key] = value;
    return j.dump();
  };
  const std::vector<std::pair<std::string, int>> bad{
      {"{not json", 400},
      {with("max_tokens", "2"), 400},
      {with("temperature", json::array()), 400},
      {with("n", 17), 400},
      {with("max_tokens", -5), 400},
      {with("max_tokens", 65), 400},
      {with("max_tokens", 1e12), 400},
      {with("model", "gpt-4o"), 404},
      {with("prompt", std::string(65, 'x')), 400},
      {json{{"model", "tiny"}, {"messages", {{{"role", "user"}}}}}.dump(), 400},
  };
  for (const auto& [body, status] : bad) {
    const bool chat = body.find("messages") != std::string::npos;
    expectOpenAIError(server.post(chat ? "/v1/chat/completions" : "/v1/completions", body), status, body);
  }
  // A body over --max-body-bytes: 413, in OpenAI's shape.
  expectOpenAIError(server.post("/v1/completions", with("prompt", std::string(100'000, 'x'))), 413, "a large body");
  // The API key is the bearer token.
  expectOpenAIError(server.post("/v1/completions", ok.dump(), false), 401, "no key");
  expectOpenAIError(server.get("/v1/models", false), 401, "no key");
  expectOpenAIError(server.get("/v1/models/other"), 404, "another model");

  // A raw stream: server-sent events ending with [DONE].
  json streamed = ok;
  streamed["stream"] = true;
  const auto s = server.post("/v1/completions", streamed.dump());
  ASSERT_TRUE(s && s->status == 200) << (s ? s->body : "no answer");
  EXPECT_EQ(s->get_header_value("Content-Type"), "text/event-stream");
  EXPECT_EQ(s->body.rfind("data: {", 0), 0u) << s->body;
  EXPECT_EQ(s->body.substr(s->body.size() - 14), "data: [DONE]\n\n");

  // The server goes on: a good request after all of them.
  const auto good = server.post("/v1/completions", ok.dump());
  ASSERT_TRUE(good && good->status == 200) << (good ? good->body : "no answer");
  EXPECT_EQ(json::parse(good->body)["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(server.stop(), 0);
}

TEST_F(OpenAITest, ConcurrencyLimitIs429InOpenAIsShape) {
  // One request at a time, and its forward waits 1.5 s for a batch to fill.
  Server server(*dir_, *run_, {"--max-concurrency", "1", "--max-delay-ms", "1500"});
  const std::string one = json{{"model", "tiny"}, {"prompt", kPrompt}, {"max_tokens", 1}}.dump();
  int firstStatus = 0;
  std::thread waiting([&] {
    const auto r = server.post("/v1/completions", one);
    firstStatus = r ? r->status : -1;
  });
  const bool busy =
      test::waitUntil([&] { return server.metric("cohort_serve_in_flight") == 1; }, std::chrono::seconds(30));
  const auto refused = server.post("/v1/completions", one);
  waiting.join();
  ASSERT_TRUE(busy);
  expectOpenAIError(refused, 429, "a second request");
  EXPECT_EQ(json::parse(refused->body)["error"]["code"], "rate_limit_exceeded");
  EXPECT_EQ(firstStatus, 200);
  EXPECT_EQ(server.stop(), 0);
}

TEST_F(OpenAITest, AChatMLTemplateBesideTheModelIsUsed) {
  const std::string config = *run_ + "/tokenizer_config.json";
  test::writeText(config, json{{"chat_template", "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + "
                                                 "m['content'] + '<|im_end|>\\n'}}{% endfor %}"}}
                              .dump());
  Server server(*dir_, *run_);
  fs::remove(config);
  const json request{{"model", "tiny"},
                     {"messages", {{{"role", "user"}, {"content", "moses "}}}},
                     {"max_tokens", 8},
                     {"temperature", 0}};
  const auto r = server.post("/v1/chat/completions", request.dump());
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
  const json expected = server.generate({{"prompt", "<|im_start|>user\nmoses <|im_end|>\n<|im_start|>assistant\n"},
                                         {"max_tokens", 8},
                                         {"temperature", 0},
                                         {"stop", "<|im_end|>"}});
  EXPECT_EQ(json::parse(r->body)["choices"][0]["message"]["content"], expected["text"]);
  EXPECT_EQ(json::parse(r->body)["usage"]["prompt_tokens"], expected["prompt_tokens"]);
  EXPECT_EQ(server.stop(), 0);
}

}  // namespace
}  // namespace cohort::openai_test
