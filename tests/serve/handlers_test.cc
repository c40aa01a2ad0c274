// The routes of `cohort serve` in this process, over predictors made to
// fail where a trained model never does: a forward that throws answers 500
// with a JSON error to every request of its batch, and the server answers
// the next request; a prompt whose ids the model's embedding does not have
// is a 400 of its own, before it can join (and fail) a batch.

#include <gtest/gtest.h>
#include <httplib.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "cohort/serve/model.h"
#include "cohort/serve/server.h"
#include "serve/detail/batcher.h"
#include "serve/detail/handlers.h"
#include "serve/detail/serve_metrics.h"
#include "util/serve_info.h"

namespace cohort::serve {
namespace {

using nlohmann::json;

// An image model of 1x2x2 pixels and 3 classes whose forward fails on a
// batch holding a pixel of value 13.
class FailingImagePredictor : public Predictor {
 public:
  FailingImagePredictor() : info_(test::imageModelInfo(1, 2, 2, 3)) {}
  const ModelInfo& info() const override { return info_; }
  at::Tensor forward(const at::Tensor& input) override {
    if ((input == 13).any().item<bool>()) throw std::runtime_error("the forward failed on purpose");
    return input.flatten(1).narrow(1, 0, 3);
  }

 private:
  ModelInfo info_;
};

// A language model whose vocabulary (100 ids) is smaller than its byte
// tokenizer's: 'z' (122) has no embedding.
class SmallVocabPredictor : public Predictor {
 public:
  SmallVocabPredictor() {
    info_.arch = "gpt";
    info_.tokens = true;
    info_.tokenizer = "bytes";
    info_.vocabSize = 100;
    info_.tokenizerVocab = 100;
    info_.blockSize = 16;
  }
  const ModelInfo& info() const override { return info_; }
  at::Tensor forward(const at::Tensor& input) override {
    EXPECT_TRUE((input < info_.vocabSize).all().item<bool>()) << "an id beyond the vocabulary reached the model";
    return torch::zeros({input.size(0), input.size(1), info_.vocabSize});
  }

 private:
  ModelInfo info_;
};

// addRoutes over `predictor` on a free loopback port, served by a thread.
class InProcessServer {
 public:
  explicit InProcessServer(Predictor& predictor)
      : batcher_(predictor, detail::BatcherOptions{}, metrics_), state_{options_, predictor.info(), batcher_, metrics_} {
    detail::addRoutes(server_, state_);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!server_.is_running() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  ~InProcessServer() {
    server_.stop();
    thread_.join();
  }
  bool running() const { return port_ > 0 && server_.is_running(); }

  std::pair<int, json> post(const std::string& path, const json& body) {
    httplib::Client client("127.0.0.1", port_);
    client.set_read_timeout(30, 0);
    auto r = client.Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }

 private:
  ServeOptions options_;
  detail::ServeMetrics metrics_;
  detail::Batcher batcher_;
  detail::ServeState state_;
  httplib::Server server_;
  int port_ = -1;
  std::thread thread_;
};

TEST(ServeHandlers, AFailedForwardIs500AndTheServerGoesOn) {
  FailingImagePredictor predictor;
  InProcessServer server(predictor);
  ASSERT_TRUE(server.running());

  auto [status, body] = server.post("/v1/predict", {{"inputs", {{{1, 13}, {3, 4}}}}});
  EXPECT_EQ(status, 500) << body.dump();
  ASSERT_TRUE(body.is_object() && body.contains("error")) << body.dump();
  EXPECT_NE(body["error"].get<std::string>().find("the forward failed on purpose"), std::string::npos)
      << body.dump();

  auto [okStatus, ok] = server.post("/v1/predict", {{"inputs", {{{1, 2}, {3, 4}}}}, {"logits", true}});
  EXPECT_EQ(okStatus, 200) << ok.dump();
  ASSERT_TRUE(ok.contains("predictions")) << ok.dump();
  EXPECT_EQ(ok["predictions"].size(), 1u) << ok.dump();
}

TEST(ServeHandlers, PromptIdsBeyondTheVocabularyAre400AndNeverReachTheModel) {
  SmallVocabPredictor predictor;
  InProcessServer server(predictor);
  ASSERT_TRUE(server.running());

  auto [status, body] = server.post("/v1/generate", {{"prompt", "az"}, {"max_tokens", 2}});
  EXPECT_EQ(status, 400) << body.dump();
  ASSERT_TRUE(body.is_object() && body.contains("error")) << body.dump();
  EXPECT_NE(body["error"].get<std::string>().find("the prompt's token 1 is id 122: the model's vocabulary is 0..99"),
            std::string::npos)
      << body.dump();

  auto [okStatus, ok] = server.post("/v1/generate", {{"prompt", "aa"}, {"max_tokens", 2}});
  EXPECT_EQ(okStatus, 200) << ok.dump();
  EXPECT_EQ(ok["tokens"].size(), 2u) << ok.dump();
}

}  // namespace
}  // namespace cohort::serve
