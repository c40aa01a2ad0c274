// `cohort serve` as clients see it: real server processes on small trained
// runs (util/deploy.h), driven over HTTP by cpp-httplib clients. Batched
// answers equal single ones (generations too), encoded images equal their
// decoded pixels, generation is reproducible, bad input is a 400 that leaves
// the server working, bodies are read whatever their Content-Type, the
// limits (413, 415, 429, 503), the bearer token, the drain on SIGTERM and its
// limit, start-up failures that exit 2, and /metrics.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cohort/data/image.h"
#include "test_paths.h"
#include "util/deploy.h"
#include "util/jobs.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Polls `done` every 10 ms for at most `limit`; true once it holds.
template <class F>
bool pollUntil(F done, std::chrono::milliseconds limit = std::chrono::seconds(60)) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

struct Reply {
  int status = 0;  // 0: no answer (connection failed)
  std::string body;
  json parsed() const { return json::parse(body, nullptr, false); }
};

// A streamed generation's lines: each token's id and text, then the summary.
struct Stream {
  std::vector<int64_t> tokens;
  std::string text;
  json last;
};
Stream streamOf(const std::string& body) {
  Stream s;
  std::istringstream lines(body);
  for (std::string line; std::getline(lines, line);) {
    const json j = json::parse(line);
    if (j.contains("done")) {
      s.last = j;
    } else {
      s.tokens.push_back(j["token"].get<int64_t>());
      s.text += j["text"].get<std::string>();
    }
  }
  return s;
}

// A `cohort serve` process on a free port; SIGKILLed by the Process guard if
// a test ends early.
class Server {
 public:
  Server(const test::TempDir& dir, const std::string& model, std::vector<std::string> args,
         std::map<std::string, std::string> env = {}) {
    static std::atomic<int> count{0};
    portFile_ = dir.file("port-" + std::to_string(count++));
    std::vector<std::string> argv{test::cohortBin(), "serve", model, "--port", "0", "--port-file", portFile_};
    argv.insert(argv.end(), args.begin(), args.end());
    process_ = std::make_unique<test::Process>(argv, env);
    const bool up = pollUntil([&] { return fs::exists(portFile_); }, std::chrono::seconds(120));
    EXPECT_TRUE(up) << "no port file; stderr:\n" << process_->stderrSoFar();
    if (up) port_ = std::stoi(test::readText(portFile_));
  }

  int port() const { return port_; }
  test::Process& process() { return *process_; }

  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_read_timeout(120, 0);
    c->set_write_timeout(30, 0);
    c->set_connection_timeout(10, 0);
    if (!token_.empty()) c->set_bearer_token_auth(token_.c_str());
    return c;
  }
  void setToken(std::string token) { token_ = std::move(token); }

  Reply post(const std::string& path, const std::string& body,
             const std::string& type = "application/json") const {
    auto r = client()->Post(path.c_str(), body, type.c_str());
    return r ? Reply{r->status, r->body} : Reply{0, httplib::to_string(r.error())};
  }
  Reply get(const std::string& path) const {
    auto r = client()->Get(path.c_str());
    return r ? Reply{r->status, r->body} : Reply{0, httplib::to_string(r.error())};
  }

  // The value of one sample of /metrics ("name{labels}" as printed), or -1.
  double metric(const std::string& sample) const {
    const Reply m = get("/metrics");
    std::istringstream in(m.body);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(sample + " ", 0) == 0) return std::stod(line.substr(sample.size() + 1));
    }
    return -1;
  }

  // SIGTERM, then the exit.
  test::ProcessResult stop() {
    process_->signal(SIGTERM);
    return process_->wait(std::chrono::seconds(90));
  }

 private:
  std::string portFile_;
  int port_ = 0;
  std::string token_;
  std::unique_ptr<test::Process> process_;
};

// Pixels 0..255 of shape [C, H, W], different per seed.
at::Tensor pixels(int64_t c, int64_t h, int64_t w, int seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
  return torch::randint(0, 256, {c, h, w}, g, torch::kFloat);
}

json nested(const at::Tensor& image) {
  json out = json::array();
  for (int64_t c = 0; c < image.size(0); ++c) {
    json rows = json::array();
    for (int64_t y = 0; y < image.size(1); ++y) {
      const at::Tensor row = image[c][y].contiguous();
      rows.push_back(std::vector<float>(row.data_ptr<float>(), row.data_ptr<float>() + row.numel()));
    }
    out.push_back(rows);
  }
  return out;
}


// Joins the threads of `threads` however the scope ends: an ASSERT_* that
// returns with a joinable std::thread would std::terminate the program.
// When some are still running then, `early` runs first (SIGKILL the server
// they wait for, so that they end now).
class JoinAll {
 public:
  explicit JoinAll(std::vector<std::thread>& threads, std::function<void()> early = {})
      : threads_(threads), early_(std::move(early)) {}
  ~JoinAll() {
    const bool running = std::any_of(threads_.begin(), threads_.end(), [](auto& t) { return t.joinable(); });
    if (running && early_) early_();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  JoinAll(const JoinAll&) = delete;
  JoinAll& operator=(const JoinAll&) = delete;

 private:
  std::vector<std::thread>& threads_;
  std::function<void()> early_;
};

// zlib's crc32 (PNG chunk checksums), without linking zlib.
uint32_t crc32Of(const char* data, size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= static_cast<unsigned char>(data[i]);
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// What the server answers raw `bytes` on a fresh connection (the status
// line and what follows) until it closes it, for requests a client library
// will not send.
std::string rawExchange(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  const timeval timeout{30, 0};  // a server that neither answers nor closes: "" after 30 s
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string answer;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size())) {
    // No shutdown(SHUT_WR): httplib does not answer a peer that has closed.
    // Read until the server closes (it does after a 400).
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) answer.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return answer;
}

void expectSamePrediction(const json& a, const json& b, const std::string& what) {
  ASSERT_EQ(a["top_k"].size(), b["top_k"].size()) << what;
  for (size_t k = 0; k < a["top_k"].size(); ++k) {
    EXPECT_EQ(a["top_k"][k]["label"], b["top_k"][k]["label"]) << what << "\n" << a << "\n" << b;
    EXPECT_EQ(a["top_k"][k]["name"], b["top_k"][k]["name"]) << what;
    EXPECT_NEAR(a["top_k"][k]["probability"].get<double>(), b["top_k"][k]["probability"].get<double>(), 1e-4)
        << what;
  }
  if (a.contains("logits") && b.contains("logits")) {
    ASSERT_EQ(a["logits"].size(), b["logits"].size()) << what;
    for (size_t i = 0; i < a["logits"].size(); ++i) {
      EXPECT_NEAR(a["logits"][i].get<double>(), b["logits"][i].get<double>(), 1e-4) << what;
    }
  }
}

class ServeTest : public test::DeployRunsTest {};

TEST_F(ServeTest, ConcurrentClientsEachGetTheirOwnAnswerFromBatches) {
  constexpr int kInputs = 16, kThreads = 32, kPerThread = 4;
  std::vector<at::Tensor> inputs;
  for (int i = 0; i < kInputs; ++i) inputs.push_back(pixels(1, 28, 28, i));
  auto body = [&](int i) { return json{{"inputs", nested(inputs[i])}, {"logits", true}}.dump(); };

  // The single-request answers: no batching.
  std::vector<json> single(kInputs);
  {
    Server one(*dir_, *cnn_, {"--max-batch", "1"});
    for (int i = 0; i < kInputs; ++i) {
      const Reply r = one.post("/v1/predict", body(i));
      ASSERT_EQ(r.status, 200) << r.body;
      single[i] = r.parsed()["predictions"][0];
      ASSERT_EQ(single[i]["top_k"].size(), 4u);  // --top-k 5, but 4 classes
    }
    EXPECT_EQ(one.metric("cohort_serve_batch_size_count"), kInputs);
    EXPECT_EQ(one.stop().exitCode, 0);
  }

  Server batched(*dir_, *cnn_, {"--max-batch", "8", "--max-delay-ms", "200", "--threads", "32"});
  std::vector<std::thread> threads;
  std::vector<std::string> failures(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kPerThread; ++r) {
        const int i = (t * kPerThread + r) % kInputs;
        const Reply reply = batched.post("/v1/predict", body(i));
        if (reply.status != 200) {
          failures[t] = "status " + std::to_string(reply.status) + ": " + reply.body;
          return;
        }
        const json p = reply.parsed()["predictions"][0];
        if (p["top_k"][0]["label"] != single[i]["top_k"][0]["label"]) {
          failures[t] = "input " + std::to_string(i) + ": " + p.dump() + " vs " + single[i].dump();
          return;
        }
        for (size_t k = 0; k < p["logits"].size(); ++k) {
          if (std::abs(p["logits"][k].get<double>() - single[i]["logits"][k].get<double>()) > 1e-4) {
            failures[t] = "input " + std::to_string(i) + " logits: " + p.dump() + " vs " + single[i].dump();
            return;
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) EXPECT_EQ(f, "");

  // Several inputs in one request: each its own answer, in order.
  json many = json::array();
  for (int i : {3, 0, 7}) many.push_back(nested(inputs[i]));
  const Reply r = batched.post("/v1/predict", json{{"inputs", many}, {"logits", true}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.parsed()["predictions"].size(), 3u);
  int k = 0;
  for (int i : {3, 0, 7}) expectSamePrediction(r.parsed()["predictions"][k++], single[i], "input " + std::to_string(i));

  // Every input ran once; batches of more than one happened.
  const double forwards = batched.metric("cohort_serve_batch_size_count");
  EXPECT_EQ(batched.metric("cohort_serve_batch_size_sum"), kThreads * kPerThread + 3);
  EXPECT_GT(forwards, 0);
  EXPECT_LT(forwards, kThreads * kPerThread) << "no batch held more than one input";
  EXPECT_EQ(batched.metric(R"(cohort_serve_requests_total{endpoint="/v1/predict",code="200"})"),
            kThreads * kPerThread + 1);
  EXPECT_EQ(batched.stop().exitCode, 0);
}

TEST_F(ServeTest, EncodedImagesAnswerAsTheirDecodedPixels) {
  const std::string images = test::makeImageFolder(dir_->file("upload"), 1);
  Server server(*dir_, *shards_, {"--max-delay-ms", "0", "--top-k", "3"});
  const json info = server.get("/v1/model").parsed();
  ASSERT_EQ(info["classes"], json({"blue", "green", "red"})) << info;
  int checked = 0;
  for (const auto& entry : fs::recursive_directory_iterator(images)) {
    if (!entry.is_regular_file()) continue;
    const std::string path = entry.path().string();
    const bool jpeg = entry.path().extension() == ".jpg";
    const std::string bytes = test::readText(path);
    // What the decoder gives, sent as JSON pixels.
    data::ImageTransform t;
    t.outHeight = t.outWidth = 32;
    t.channels = 3;
    t.resizeShorter = info["resize"].get<int64_t>();
    at::Tensor decoded = torch::empty({3, 32, 32});
    data::decodeImage(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), t, 0,
                      decoded.data_ptr<float>());
    const Reply asPixels = server.post("/v1/predict", json{{"inputs", nested(decoded * 255)}}.dump());
    ASSERT_EQ(asPixels.status, 200) << asPixels.body;
    const Reply typed = server.post("/v1/predict", bytes, jpeg ? "image/jpeg" : "image/png");
    ASSERT_EQ(typed.status, 200) << path << ": " << typed.body;
    const Reply sniffed = server.post("/v1/predict?top_k=2", bytes, "application/octet-stream");
    ASSERT_EQ(sniffed.status, 200) << path << ": " << sniffed.body;
    expectSamePrediction(typed.parsed()["predictions"][0], asPixels.parsed()["predictions"][0], path);
    const json two = sniffed.parsed()["predictions"][0]["top_k"];
    ASSERT_EQ(two.size(), 2u);
    EXPECT_EQ(two[0], typed.parsed()["predictions"][0]["top_k"][0]);
    ++checked;
  }
  EXPECT_EQ(checked, 6);  // a JPEG and a PNG per class
  EXPECT_EQ(server.stop().exitCode, 0);
}

TEST_F(ServeTest, GenerationIsReproducibleAndStreamsTheSameTokens) {
  Server server(*dir_, *gpt_, {"--max-delay-ms", "1"});
  const json request{{"prompt", "the "}, {"max_tokens", 24}, {"temperature", 0.9}, {"top_k", 20}, {"seed", 7}};
  const Reply a = server.post("/v1/generate", request.dump());
  ASSERT_EQ(a.status, 200) << a.body;
  const json first = a.parsed();
  EXPECT_EQ(first["tokens"].size(), 24u);
  EXPECT_EQ(first["prompt_tokens"], 4);
  EXPECT_EQ(server.post("/v1/generate", request.dump()).parsed(), first);
  json other = request;
  other["seed"] = 8;
  EXPECT_NE(server.post("/v1/generate", other.dump()).parsed()["tokens"], first["tokens"]);

  // Streamed: one line per token, then the same summary.
  json streamed = request;
  streamed["stream"] = true;
  const Reply s = server.post("/v1/generate", streamed.dump());
  ASSERT_EQ(s.status, 200) << s.body;
  const Stream whole = streamOf(s.body);
  EXPECT_EQ(json(whole.tokens), first["tokens"]);
  EXPECT_EQ(whole.text, first["text"].get<std::string>());
  EXPECT_EQ(whole.last["tokens"], first["tokens"]);

  // A client that leaves mid-stream: the server stops that generation and
  // goes on.
  {
    json longer = streamed;
    longer["max_tokens"] = 1000;
    httplib::Client c("127.0.0.1", server.port());
    int lines = 0;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/generate";
    req.body = longer.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      lines += static_cast<int>(std::count(data, data + n, '\n'));
      return lines < 3;
    };
    httplib::Response res;
    httplib::Error error = httplib::Error::Success;
    EXPECT_FALSE(c.send(req, res, error));  // canceled by the receiver
    EXPECT_GE(lines, 3);
    EXPECT_TRUE(pollUntil([&] { return server.metric("cohort_serve_in_flight") == 0; }));
  }

  // A stop string ends the text before it, streamed or not; what streams
  // is what the summary says, nothing of the stop string.
  const std::string full = first["text"].get<std::string>();
  ASSERT_GT(full.size(), 12u);
  const std::string stop = full.substr(10, 2);
  const std::string upTo = full.substr(0, full.find(stop));
  json stopping = request;
  stopping["stop"] = json::array({"no such text", stop});
  const json cut = server.post("/v1/generate", stopping.dump()).parsed();
  EXPECT_EQ(cut["text"], upTo) << cut;
  EXPECT_EQ(cut["finish_reason"], "stop");
  EXPECT_LT(cut["tokens"].size(), first["tokens"].size());
  stopping["stream"] = true;
  const Stream cutStream = streamOf(server.post("/v1/generate", stopping.dump()).body);
  EXPECT_EQ(cutStream.text, upTo);
  EXPECT_EQ(cutStream.last["finish_reason"], "stop");
  EXPECT_EQ(cutStream.last["text"], upTo);
  EXPECT_EQ(json(cutStream.tokens), cut["tokens"]);
  // Text held back because it may begin a stop string is sent when the
  // generation ends by its length instead.
  json ending = streamed;
  ending["stop"] = full.substr(full.size() - 1) + "\x01 never";
  const Stream ended = streamOf(server.post("/v1/generate", ending.dump()).body);
  EXPECT_EQ(ended.text, full);
  EXPECT_EQ(ended.last["finish_reason"], "length");
  EXPECT_EQ(json(ended.tokens), first["tokens"]);
  // top_p keeps the most likely tokens: another sample of the same seed.
  json nucleus = request;
  nucleus["top_p"] = 0.3;
  const Reply n = server.post("/v1/generate", nucleus.dump());
  ASSERT_EQ(n.status, 200) << n.body;
  EXPECT_NE(n.parsed()["tokens"], first["tokens"]);

  // Greedy decoding ignores the seed.
  const json greedy{{"prompt", "a"}, {"max_tokens", 8}, {"temperature", 0}, {"seed", 1}};
  json greedy2 = greedy;
  greedy2["seed"] = 2;
  EXPECT_EQ(server.post("/v1/generate", greedy.dump()).parsed()["tokens"],
            server.post("/v1/generate", greedy2.dump()).parsed()["tokens"]);

  // Over-long prompt (block_size is 16), wrong types, an image endpoint.
  for (const json& bad : {json{{"prompt", std::string(17, 'x')}}, json{{"prompt", 5}},
                          json{{"prompt", "a"}, {"max_tokens", -1}}, json{{"prompt", "a"}, {"seed", "x"}},
                          json{{"prompt", "a"}, {"temperature", "hot"}}, json{{"prompt", "a"}, {"max_tokens", 1e9}},
                          json{{"prompt", "a"}, {"top_p", 0}}, json{{"prompt", "a"}, {"top_p", 1.5}},
                          json{{"prompt", "a"}, {"stop", 5}}, json{{"prompt", "a"}, {"stop", json::array({"", "x"})}}}) {
    const Reply r = server.post("/v1/generate", bad.dump());
    EXPECT_EQ(r.status, 400) << bad << ": " << r.body;
    EXPECT_TRUE(r.parsed().contains("error")) << r.body;
  }
  EXPECT_NE(server.post("/v1/generate", json{{"prompt", std::string(17, 'x')}}.dump()).body.find("block_size"),
            std::string::npos);
  EXPECT_EQ(server.post("/v1/predict", R"({"inputs": [[[1]]]})").status, 400);
  EXPECT_EQ(server.stop().exitCode, 0);
}

TEST_F(ServeTest, MalformedBodiesAre400AndTheServerGoesOn) {
  const std::string images = test::makeImageFolder(dir_->file("bad"), 1);
  const std::string jpeg = test::readText(images + "/red/red-0.jpg");
  const std::string png = test::readText(images + "/red/red-0.png");
  Server server(*dir_, *shards_, {"--max-delay-ms", "0"});
  const json good = nested(pixels(3, 32, 32, 1));
  json wrongSize = good;
  wrongSize[1].erase(wrongSize[1].begin());
  json stringPixel = good;
  stringPixel[0][0][0] = "7";
  json huge = good;
  huge[2][3][4] = 1e300;
  json negative = good;
  negative[0][0][1] = -1;
  json nullPixel = good;
  nullPixel[1][1][1] = nullptr;
  struct Case {
    std::string name, body, type;
  };
  const std::vector<Case> cases = {
      {"empty", "", "application/json"},
      {"not json", "{\"inputs\": [", "application/json"},
      {"garbage bytes", std::string("\x00\x01\x02garbage", 10), "application/octet-stream"},
      {"array body", "[1, 2]", "application/json"},
      {"no inputs", R"({"input": 1})", "application/json"},
      {"unknown key", json{{"inputs", good}, {"topk", 1}}.dump(), "application/json"},
      {"wrong shape", json{{"inputs", wrongSize}}.dump(), "application/json"},
      {"wrong depth", json{{"inputs", good[0]}}.dump(), "application/json"},
      {"2 channels", json{{"inputs", json{good[0], good[1]}}}.dump(), "application/json"},
      {"string pixel", json{{"inputs", stringPixel}}.dump(), "application/json"},
      {"null pixel", json{{"inputs", nullPixel}}.dump(), "application/json"},
      {"huge number", json{{"inputs", huge}}.dump(), "application/json"},
      {"overflowing number", R"({"inputs": [[[1e999]]]})", "application/json"},
      {"negative pixel", json{{"inputs", negative}}.dump(), "application/json"},
      {"empty list", R"({"inputs": []})", "application/json"},
      {"flat with bad shape", R"({"inputs": [1, 2, 3], "shape": [3, 1, 1]})", "application/json"},
      {"flat of wrong length", json{{"inputs", std::vector<int>(5, 1)}, {"shape", {3, 32, 32}}}.dump(),
       "application/json"},
      {"top_k 0", json{{"inputs", good}, {"top_k", 0}}.dump(), "application/json"},
      {"top_k string", json{{"inputs", good}, {"top_k", "3"}}.dump(), "application/json"},
      {"truncated jpeg", jpeg.substr(0, jpeg.size() / 2), "image/jpeg"},
      {"truncated png", png.substr(0, png.size() / 2), "image/png"},
      {"jpeg header only", jpeg.substr(0, 3), "application/octet-stream"},
      {"garbage as jpeg", "not an image at all", "image/jpeg"},
      {"deep nesting", std::string(200000, '['), "application/json"},
      {"deep nesting closed", std::string(100000, '[') + std::string(100000, ']'), "application/json"},
      {"deep inputs", "{\"inputs\": " + std::string(50000, '[') + std::string(50000, ']') + "}",
       "application/json"},
  };
  for (const Case& c : cases) {
    const Reply r = server.post("/v1/predict", c.body, c.type);
    EXPECT_EQ(r.status, 400) << c.name << ": " << r.body;
    EXPECT_TRUE(r.parsed().is_object() && r.parsed().contains("error")) << c.name << ": " << r.body;
  }
  EXPECT_EQ(server.post("/v1/predict?top_k=x", json{{"inputs", good}}.dump()).status, 400);
  EXPECT_EQ(server.post("/v1/predict?logits=maybe", json{{"inputs", good}}.dump()).status, 400);
  EXPECT_EQ(server.post("/v1/generate", R"({"prompt": "a"})").status, 400);  // an image model
  const Reply missing = server.get("/nowhere");
  EXPECT_EQ(missing.status, 404);
  EXPECT_TRUE(missing.parsed().contains("error")) << missing.body;

  EXPECT_EQ(server.post("/v1/predict", json{{"inputs", good}, {"shape", nullptr}}.dump()).status, 400);

  // Still answering, correctly: the flat form equals the nested one.
  const Reply fine = server.post("/v1/predict", json{{"inputs", good}}.dump());
  ASSERT_EQ(fine.status, 200) << fine.body;
  const at::Tensor flatPixels = pixels(3, 32, 32, 1).flatten();
  const std::vector<float> flatValues(flatPixels.data_ptr<float>(), flatPixels.data_ptr<float>() + flatPixels.numel());
  const Reply flat = server.post("/v1/predict", json{{"inputs", flatValues}, {"shape", {1, 3, 32, 32}}}.dump());
  ASSERT_EQ(flat.status, 200) << flat.body;
  expectSamePrediction(flat.parsed()["predictions"][0], fine.parsed()["predictions"][0], "flat");
  EXPECT_EQ(server.get("/healthz").status, 200);
  EXPECT_GE(server.metric(R"(cohort_serve_requests_total{endpoint="/v1/predict",code="400"})"),
            static_cast<double>(cases.size()));
  EXPECT_EQ(server.stop().exitCode, 0);
}

// Requests held in flight by a batching delay far beyond the test (a batch
// of 64 never fills, 600 s never pass, and --wait-alone keeps even a lone
// request waiting) show the limits; SIGTERM then
// drains: new work gets 503, the held batch runs at once and its requests
// get their 200, and the process exits 0.
TEST_F(ServeTest, LimitsAndTheDrainOnSigterm) {
  Server server(*dir_, *cnn_,
                {"--max-batch", "64", "--max-delay-ms", "600000", "--wait-alone", "--max-concurrency", "4",
                 "--max-queue", "4", "--max-body-bytes", "200000", "--threads", "8"});
  auto body = [](int seed) { return json{{"inputs", nested(pixels(1, 28, 28, seed))}}.dump(); };
  const Reply big = server.post("/v1/predict", std::string(300000, ' '));
  EXPECT_EQ(big.status, 413) << big.body;
  EXPECT_TRUE(big.parsed().contains("error")) << big.body;
  // The same without a Content-Length (chunked), and as a form (httplib's
  // own limit for those is 8 KiB): the server's bound, its message.
  {
    auto c = server.client();
    auto chunked = c->Post(
        "/v1/predict",
        [](size_t offset, httplib::DataSink& sink) {
          if (offset >= 300000) {
            sink.done();
            return true;
          }
          const std::string spaces(10000, ' ');
          return sink.write(spaces.data(), spaces.size());
        },
        "application/json");
    ASSERT_TRUE(chunked) << httplib::to_string(chunked.error());
    EXPECT_EQ(chunked->status, 413) << chunked->body;
    EXPECT_NE(chunked->body.find("--max-body-bytes"), std::string::npos) << chunked->body;
  }
  const Reply bigForm = server.post("/v1/predict", std::string(300000, ' '), "application/x-www-form-urlencoded");
  EXPECT_EQ(bigForm.status, 413) << bigForm.body;

  std::vector<std::thread> held;
  // Before any ASSERT that could leave them running; SIGKILLs the server if
  // one does.
  const JoinAll joinHeld(held, [&] { server.process().signal(SIGKILL); });
  std::vector<Reply> heldReplies(4);
  auto hold = [&](int i) { held.emplace_back([&, i] { heldReplies[i] = server.post("/v1/predict", body(i)); }); };
  for (int i = 0; i < 3; ++i) hold(i);
  ASSERT_TRUE(pollUntil([&] { return server.metric("cohort_serve_queue_depth") == 3; }));
  // Two more inputs do not fit in a queue of 4.
  json two = json::array({nested(pixels(1, 28, 28, 5)), nested(pixels(1, 28, 28, 6))});
  const Reply full = server.post("/v1/predict", json{{"inputs", two}}.dump());
  EXPECT_EQ(full.status, 503) << full.body;
  hold(3);
  ASSERT_TRUE(pollUntil([&] { return server.metric("cohort_serve_in_flight") == 4; }));
  const Reply tooMany = server.post("/v1/predict", body(9));
  EXPECT_EQ(tooMany.status, 429) << tooMany.body;
  EXPECT_EQ(server.get("/readyz").status, 200);

  // The drain lasts as long as the held batch takes to run: the probes go
  // out from before the signal, back to back, so that a busy machine does
  // not let the server finish and exit before the first of them.
  Reply readyDraining, draining, healthDraining;
  std::atomic<bool> signalled{false};
  std::thread probe([&] {
    while (!signalled.load()) std::this_thread::yield();
    do {
      readyDraining = server.get("/readyz");
    } while (readyDraining.status == 200);
    draining = server.post("/v1/predict", body(10));
    healthDraining = server.get("/healthz");
  });
  server.process().signal(SIGTERM);
  signalled = true;
  probe.join();
  EXPECT_EQ(readyDraining.status, 503) << readyDraining.body;
  EXPECT_EQ(draining.status, 503) << draining.body;
  EXPECT_EQ(healthDraining.status, 200);
  for (auto& t : held) t.join();
  for (const Reply& r : heldReplies) {
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.parsed()["predictions"].size(), 1u);
  }
  const test::ProcessResult exit = server.process().wait(std::chrono::seconds(90));
  EXPECT_EQ(exit.exitCode, 0) << exit.describe();
}

// A request with no other in flight runs at once: no request could join its
// batch, so waiting --max-delay-ms (600 s here, beyond the client's 120 s
// read timeout) would only delay it. The server says so in
// cohort_serve_batches_at_once_total.
TEST_F(ServeTest, ALoneRequestDoesNotWaitForABatchThatCannotFill) {
  Server server(*dir_, *cnn_, {"--max-batch", "64", "--max-delay-ms", "600000"});
  for (int i = 0; i < 3; ++i) {
    const Reply r = server.post("/v1/predict", json{{"inputs", nested(pixels(1, 28, 28, i))}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
  }
  // Two inputs of one request: one request, one forward of both, at once.
  json two = json::array({nested(pixels(1, 28, 28, 5)), nested(pixels(1, 28, 28, 6))});
  const Reply r = server.post("/v1/predict", json{{"inputs", two}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.parsed()["predictions"].size(), 2u);
  EXPECT_EQ(server.metric("cohort_serve_batches_at_once_total"), 4);
  EXPECT_EQ(server.metric("cohort_serve_batch_size_count"), 4);
  EXPECT_EQ(server.metric("cohort_serve_batch_size_sum"), 5);
  EXPECT_EQ(server.stop().exitCode, 0);
}

// Past --drain-seconds (0 here: no time at all) what still waits for the
// model is answered 503, a stream ends with an {"error"} line, and the
// process exits 0 without waiting for batches that would not run for 600 s.
TEST_F(ServeTest, TheDrainLimitAnswers503ToWhatStillWaits) {
  Server server(*dir_, *gpt_, {"--max-batch", "64", "--max-delay-ms", "600000", "--drain-seconds", "0"});
  const json request{{"prompt", "the "}, {"max_tokens", 4}, {"seed", 1}};
  json streamed = request;
  streamed["stream"] = true;
  Reply plain, stream;
  std::vector<std::thread> clients;
  {
    const JoinAll joinClients(clients, [&] { server.process().signal(SIGKILL); });
    clients.emplace_back([&] { plain = server.post("/v1/generate", request.dump()); });
    clients.emplace_back([&] { stream = server.post("/v1/generate", streamed.dump()); });
    ASSERT_TRUE(pollUntil([&] { return server.metric("cohort_serve_queue_depth") == 2; }));
    server.process().signal(SIGTERM);
    for (auto& t : clients) t.join();
  }
  EXPECT_EQ(plain.status, 503) << plain.body;
  EXPECT_NE(plain.parsed().value("error", "").find("drain"), std::string::npos) << plain.body;
  EXPECT_EQ(stream.status, 200) << stream.body;  // the headers went out before the first token
  std::istringstream lines(stream.body);
  std::string line, last;
  while (std::getline(lines, line)) last = line;
  EXPECT_NE(json::parse(last, nullptr, false).value("error", "").find("drain"), std::string::npos) << stream.body;
  const test::ProcessResult exit = server.process().wait(std::chrono::seconds(90));
  EXPECT_EQ(exit.exitCode, 0) << exit.describe();
}

// curl -d sends application/x-www-form-urlencoded, which httplib would cap
// at 8 KiB and parse as a form: the server reads the body itself.
TEST_F(ServeTest, BodiesAreReadWhateverTheirContentType) {
  Server server(*dir_, *cnn_, {"--max-delay-ms", "0"});
  const std::string good = json{{"inputs", nested(pixels(1, 28, 28, 3))}, {"logits", true}}.dump();
  const std::string padded = good + std::string(20000, ' ');
  ASSERT_GT(padded.size(), 8192u);
  const Reply asJson = server.post("/v1/predict", good);
  ASSERT_EQ(asJson.status, 200) << asJson.body;
  for (const std::string type : {"application/x-www-form-urlencoded", "text/plain", "application/json"}) {
    const Reply r = server.post("/v1/predict", padded, type);
    ASSERT_EQ(r.status, 200) << type << ": " << r.body;
    expectSamePrediction(r.parsed()["predictions"][0], asJson.parsed()["predictions"][0], type);
  }
  // A form's fields are not query parameters: top_k=1 in the body is not JSON.
  EXPECT_EQ(server.post("/v1/predict", "top_k=1", "application/x-www-form-urlencoded").status, 400);
  // multipart/form-data is refused by name.
  httplib::MultipartFormDataItems items{{"inputs", good, "", "application/json"}};
  auto multipart = server.client()->Post("/v1/predict", items);
  ASSERT_TRUE(multipart) << httplib::to_string(multipart.error());
  EXPECT_EQ(multipart->status, 415) << multipart->body;
  EXPECT_NE(multipart->body.find("multipart"), std::string::npos) << multipart->body;
  EXPECT_EQ(server.post("/v1/predict", good).status, 200);  // still answering
  EXPECT_EQ(server.stop().exitCode, 0);
}

// A PNG whose header claims 9000 x 9000 px is refused before decoding (the
// shared serve::pixelsFromImage), and the server goes on.
TEST_F(ServeTest, AnImageTooLargeByItsHeaderIs400) {
  const std::string images = test::makeImageFolder(dir_->file("huge"), 1);
  std::string big = test::readText(images + "/red/red-0.png");
  const unsigned char dims[8] = {0, 0, 0x23, 0x28, 0, 0, 0x23, 0x28};  // IHDR width, height: 9000
  big.replace(16, 8, reinterpret_cast<const char*>(dims), 8);
  const uint32_t crc = crc32Of(big.data() + 12, 17);  // "IHDR" and its 13 bytes
  for (int i = 0; i < 4; ++i) big[static_cast<size_t>(29 + i)] = static_cast<char>((crc >> (24 - 8 * i)) & 0xff);
  Server server(*dir_, *shards_, {"--max-delay-ms", "0"});
  for (const std::string type : {"image/png", "application/octet-stream"}) {
    const Reply r = server.post("/v1/predict", big, type);
    EXPECT_EQ(r.status, 400) << type << ": " << r.body;
    EXPECT_NE(r.body.find("9000x9000"), std::string::npos) << r.body;
  }
  const Reply fine = server.post("/v1/predict", test::readText(images + "/red/red-0.png"), "image/png");
  EXPECT_EQ(fine.status, 200) << fine.body;
  EXPECT_EQ(server.stop().exitCode, 0);
}

// Generations that share forwards give each the text it gets alone: a
// batch of 4 runs only when all 4 contexts wait (600 s would pass first),
// so every step of the 4 is one forward of 4.
// Concurrent generations batched into one forward per token with the
// key/value caches give each request's answer alone: gpt's, and llama's,
// whose caches hold its 2 key/value heads for 4 query heads.
void generationsBatchAsEachAlone(const test::TempDir& dir, const std::string& run) {
  // Prompts of four lengths: each step of the four generations (their
  // prompts, then one token each, their sequences of four lengths) is one
  // forward with the key/value caches.
  constexpr int kTokens = 12;
  const char* prompts[] = {"the ", "a", "the lord said ", "unto "};
  std::vector<json> requests;
  for (int i = 0; i < 4; ++i) {
    requests.push_back({{"prompt", prompts[i]}, {"max_tokens", kTokens}, {"temperature", i == 0 ? 0.0 : 0.8},
                        {"top_k", i == 1 ? 10 : 0}, {"seed", 100 + i}});
  }
  std::vector<json> alone;
  {
    Server one(dir, run, {"--max-batch", "1"});
    for (const json& r : requests) {
      const Reply reply = one.post("/v1/generate", r.dump());
      ASSERT_EQ(reply.status, 200) << reply.body;
      alone.push_back(reply.parsed());
    }
    EXPECT_EQ(one.stop().exitCode, 0);
  }
  Server batched(dir, run, {"--max-batch", "4", "--max-delay-ms", "600000"});
  std::vector<Reply> together(requests.size());
  {
    std::vector<std::thread> clients;
    const JoinAll joinClients(clients);
    for (size_t i = 0; i < requests.size(); ++i) {
      clients.emplace_back([&, i] { together[i] = batched.post("/v1/generate", requests[i].dump()); });
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_EQ(together[i].status, 200) << together[i].body;
    EXPECT_EQ(together[i].parsed()["tokens"], alone[i]["tokens"]) << requests[i];
    EXPECT_EQ(together[i].parsed()["text"], alone[i]["text"]) << requests[i];
  }
  EXPECT_EQ(batched.metric("cohort_serve_batch_size_count"), kTokens);
  EXPECT_EQ(batched.metric("cohort_serve_batch_size_sum"), 4 * kTokens);
  EXPECT_EQ(batched.stop().exitCode, 0);
}

TEST_F(ServeTest, ConcurrentGenerationsEqualEachAlone) { generationsBatchAsEachAlone(*dir_, *gpt_); }

TEST_F(ServeTest, LlamaGenerationsBatchAsEachAlone) {
  generationsBatchAsEachAlone(*dir_, test::trainDeployRun(*dir_, test::DeployModel::llama));
}

// A --port-file that cannot be written (its directory would be inside a
// regular file) ends the server with exit 2 and a message naming it, not
// std::terminate with the accept thread running.
TEST_F(ServeTest, APortFileThatCannotBeWrittenExits2) {
  const std::string notADir = dir_->file("not-a-dir");
  test::writeText(notADir, "x");
  const std::string portFile = notADir + "/port";
  const test::ProcessResult r =
      test::cohort({"serve", *cnn_, "--port", "0", "--port-file", portFile}, {}, std::chrono::seconds(120));
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_EQ(r.signal, 0) << r.describe();
  EXPECT_NE(r.err.find("--port-file"), std::string::npos) << r.describe();
  EXPECT_NE(r.err.find(portFile), std::string::npos) << r.describe();
}

TEST_F(ServeTest, BearerTokenGuardsEverythingButHealth) {
  const std::string good = json{{"inputs", nested(pixels(1, 28, 28, 1))}}.dump();
  // Beyond loopback without a token: refused before loading anything.
  const test::ProcessResult refused =
      test::cohort({"serve", *cnn_, "--host", "0.0.0.0", "--port", "0"}, {{"COHORT_SERVE_TOKEN", ""}},
                   std::chrono::seconds(60));
  EXPECT_EQ(refused.exitCode, 2) << refused.describe();
  EXPECT_NE(refused.err.find("token"), std::string::npos) << refused.describe();

  // An empty token file, or an empty path, would leave the server open:
  // refused, naming the file.
  const std::string emptyToken = dir_->file("empty-token");
  test::writeText(emptyToken, " \n");
  ::chmod(emptyToken.c_str(), 0600);
  const test::ProcessResult empty =
      test::cohort({"serve", *cnn_, "--port", "0", "--token-file", emptyToken}, {}, std::chrono::seconds(60));
  EXPECT_EQ(empty.exitCode, 2) << empty.describe();
  EXPECT_NE(empty.err.find(emptyToken), std::string::npos) << empty.describe();
  const test::ProcessResult emptyPath =
      test::cohort({"serve", *cnn_, "--port", "0", "--token-file", ""}, {}, std::chrono::seconds(60));
  EXPECT_EQ(emptyPath.exitCode, 2) << emptyPath.describe();
  EXPECT_NE(emptyPath.err.find("--token-file"), std::string::npos) << emptyPath.describe();

  const std::string tokenFile = dir_->file("serve-token");
  test::writeText(tokenFile, "s3cret-token-of-the-test\n");
  ::chmod(tokenFile.c_str(), 0600);
  for (const auto& [args, env] :
       std::vector<std::pair<std::vector<std::string>, std::map<std::string, std::string>>>{
           {{"--token-file", tokenFile}, {}},
           {{"--host", "0.0.0.0"}, {{"COHORT_SERVE_TOKEN", "s3cret-token-of-the-test"}}}}) {
    Server server(*dir_, *cnn_, args, env);
    EXPECT_EQ(server.post("/v1/predict", good).status, 401);
    EXPECT_EQ(server.get("/metrics").status, 401);
    EXPECT_EQ(server.get("/healthz").status, 200);
    EXPECT_EQ(server.get("/readyz").status, 200);
    server.setToken("s3cret-token-of-the-tesT");
    EXPECT_EQ(server.post("/v1/predict", good).status, 401);
    server.setToken("s3cret-token-of-the-test");
    EXPECT_EQ(server.post("/v1/predict", good).status, 200);
    EXPECT_EQ(server.get("/metrics").status, 200);
    EXPECT_EQ(server.stop().exitCode, 0);
  }
}

TEST_F(ServeTest, MetricsParseAndCount) {
  ASSERT_TRUE(fs::exists(COHORT_PROMTOOL)) << COHORT_PROMTOOL << " is missing (scripts/install-deps.sh)";
  Server server(*dir_, *cnn_, {"--max-delay-ms", "0"});
  const std::string good = json{{"inputs", nested(pixels(1, 28, 28, 1))}}.dump();
  for (int i = 0; i < 3; ++i) ASSERT_EQ(server.post("/v1/predict", good).status, 200);
  ASSERT_EQ(server.post("/v1/predict", "{").status, 400);
  ASSERT_EQ(server.get("/healthz").status, 200);
  ASSERT_EQ(server.get("/v1/model").status, 200);
  // A request line httplib refuses before routing: counted, but with no
  // latency (its start was never taken; a stale one must not be recorded).
  const std::string garbage = rawExchange(server.port(), "NOT A REQUEST\r\n\r\n");
  ASSERT_EQ(garbage.rfind("HTTP/1.1 400", 0), 0u) << garbage;
  const Reply m = server.get("/metrics");
  ASSERT_EQ(m.status, 200);
  const std::string file = dir_->file("metrics.txt");
  test::writeText(file, m.body);
  const test::ProcessResult check =
      test::run({"/bin/sh", "-c", "exec \"$0\" check metrics < \"$1\"", COHORT_PROMTOOL, file});
  EXPECT_EQ(check.exitCode, 0) << check.describe() << "\n" << m.body;
  EXPECT_EQ(server.metric(R"(cohort_serve_requests_total{endpoint="/v1/predict",code="200"})"), 3);
  EXPECT_EQ(server.metric(R"(cohort_serve_requests_total{endpoint="/v1/predict",code="400"})"), 1);
  EXPECT_EQ(server.metric(R"(cohort_serve_requests_total{endpoint="/healthz",code="200"})"), 1);
  EXPECT_EQ(server.metric(R"(cohort_serve_request_duration_seconds_count{endpoint="/v1/predict"})"), 4);
  EXPECT_EQ(server.metric(R"(cohort_serve_requests_total{endpoint="/v1/model",code="200"})"), 1);
  EXPECT_EQ(server.metric(R"(cohort_serve_request_duration_seconds_count{endpoint="/v1/model"})"), 1);
  EXPECT_EQ(server.metric(R"(cohort_serve_requests_total{endpoint="other",code="400"})"), 1);
  EXPECT_EQ(server.metric(R"(cohort_serve_request_duration_seconds_count{endpoint="other"})"), -1);
  EXPECT_EQ(server.metric(R"(cohort_serve_batch_size_bucket{le="1"})"), 3);
  EXPECT_EQ(server.metric("cohort_serve_in_flight"), 0);
  EXPECT_EQ(server.metric("cohort_serve_queue_depth"), 0);
  EXPECT_EQ(server.stop().exitCode, 0);
}

}  // namespace
}  // namespace cohort
