// The scheduler of `cohort serve`'s generations (serve/detail/scheduler.h)
// in this process, over a small gpt: requests submitted from many threads,
// more than run at once, with prompts fed in parts and windows shifting
// past block_size, each get the tokens `cohort generate`'s path gives alone
// (infer::Sequence, nextLogits, sampleNext); cancelled ones stop; every
// cache block goes back to the pool. Label threaded: ThreadSanitizer runs it.

#include "serve/detail/scheduler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "cohort/infer/decoding.h"
#include "cohort/models/gpt.h"
#include "util/gpt.h"

namespace cohort::serve::detail {
namespace {

// A Predictor over a model that decodes, as serve's for a run.
class DecodingPredictor : public Predictor {
 public:
  explicit DecodingPredictor(std::shared_ptr<models::Model> m) : model_(std::move(m)) {
    info_.arch = "gpt";
    info_.tokens = true;
    info_.tokenizer = "bytes";
    info_.vocabSize = 50;
    info_.blockSize = 16;
  }
  const ModelInfo& info() const override { return info_; }
  at::Tensor forward(const at::Tensor& input) override {
    c10::InferenceMode guard;
    return model_->forward(input);
  }
  bool decodes() const override { return true; }
  at::Tensor decode(const std::vector<at::Tensor>& rows, const std::vector<models::KvCache*>& caches) override {
    c10::InferenceMode guard;
    return model_->decode(rows, caches);
  }

 private:
  std::shared_ptr<models::Model> model_;
  ModelInfo info_;
};

std::shared_ptr<models::Model> schedulerGpt() {
  torch::manual_seed(23);
  auto m = models::createGpt(test::gptSizes(50, 16, 2, 2, 16));
  m->eval();
  return m;
}

// `request` generated alone, as `cohort generate` does.
std::vector<int64_t> generatedAlone(models::Model& model, const GenerateRequest& request) {
  c10::InferenceMode guard;
  infer::Sequence seq(request.prompt, 16, /*cached=*/true);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(request.sampling.seed);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < request.maxTokens; ++i) {
    const int64_t token = infer::sampleNext(infer::nextLogits(model, seq), request.sampling, gen);
    seq.append(token);
    out.push_back(token);
  }
  return out;
}

TEST(ServeScheduler, ConcurrentRequestsGetTheirTokensAloneAndGiveEveryBlockBack) {
  auto model = schedulerGpt();
  DecodingPredictor predictor(model);
  ServeMetrics metrics;
  SchedulerOptions o;
  o.maxRows = 4;  // 10 requests: some wait to join
  o.maxDelay = std::chrono::microseconds(0);
  o.stepTokens = 5;  // prompts of up to 16 go in over several iterations
  o.blockTokens = 4;
  o.blockSize = 16;
  std::vector<GenerateRequest> requests(10);
  for (size_t i = 0; i < requests.size(); ++i) {
    GenerateRequest& r = requests[i];
    for (size_t t = 0; t < 1 + (i * 5) % 16; ++t) r.prompt.push_back(static_cast<int64_t>((i * 7 + t * 3) % 50));
    r.maxTokens = 10 + static_cast<int64_t>(i) * 3;  // up to 37: the window shifts past 16
    r.sampling.temperature = i % 3 == 0 ? 0.0 : 0.9;
    r.sampling.seed = 40 + i;
    r.logprobs = i % 2 == 0 ? 2 : -1;
  }
  std::vector<std::vector<int64_t>> got(requests.size());
  std::vector<std::vector<TokenChoice>> choices(requests.size());
  {
    Scheduler scheduler(predictor, o, metrics);
    std::vector<std::thread> clients;
    for (size_t i = 0; i < requests.size(); ++i) {
      clients.emplace_back([&, i] {
        std::shared_ptr<Ticket> ticket = scheduler.submit(requests[i]);
        ASSERT_NE(ticket, nullptr);
        // Two requests give up part-way (a client gone).
        const int64_t wanted = i == 4 || i == 7 ? 3 : requests[i].maxTokens;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
        while (static_cast<int64_t>(got[i].size()) < wanted && std::chrono::steady_clock::now() < deadline) {
          TokenChoice c;
          if (ticket->next(c, std::chrono::milliseconds(50))) {
            got[i].push_back(c.token);
            choices[i].push_back(c);
          }
        }
        ticket->cancel();
      });
    }
    for (auto& t : clients) t.join();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (scheduler.pool().blocksInUse() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(scheduler.pool().blocksInUse(), 0);
    EXPECT_LE(scheduler.pool().blocksTotal(), 4 * 4) << "at most 4 running, 16 positions in blocks of 4 each";
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    std::vector<int64_t> alone = generatedAlone(*model, requests[i]);
    if (i == 4 || i == 7) alone.resize(3);
    EXPECT_EQ(got[i], alone) << "request " << i;
    for (const TokenChoice& c : choices[i]) {
      EXPECT_EQ(c.top.size(), requests[i].logprobs >= 0 ? 2u : 0u) << "request " << i;
      if (requests[i].logprobs >= 0) {
        EXPECT_LE(c.logprob, 0) << "request " << i;
      }
    }
  }
  EXPECT_GT(metrics.generatedTokens.load(), 0);
  EXPECT_EQ(metrics.requestsRunning.load(), 0);
}

TEST(ServeScheduler, AFullQueueRefusesAndAStoppedSchedulerFailsWhatWaits) {
  auto model = schedulerGpt();
  DecodingPredictor predictor(model);
  ServeMetrics metrics;
  SchedulerOptions o;
  o.maxRows = 3;
  o.maxWaiting = 2;
  o.maxDelay = std::chrono::seconds(600);  // idle: waits for 3 requests, or a drain
  o.blockSize = 16;
  GenerateRequest r;
  r.prompt = {1, 2, 3};
  r.maxTokens = 4;
  std::shared_ptr<Ticket> first;
  {
    Scheduler scheduler(predictor, o, metrics);
    first = scheduler.submit(r);
    ASSERT_NE(first, nullptr);
    EXPECT_NE(scheduler.submit(r), nullptr);
    EXPECT_EQ(scheduler.submit(r), nullptr) << "--max-queue 2 requests wait";
    TokenChoice c;
    EXPECT_FALSE(first->next(c, std::chrono::milliseconds(100))) << "the batch waits to fill";
    // Draining: nothing more will come, so what waits runs now.
    scheduler.drain();
    int tokens = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (tokens < 4 && std::chrono::steady_clock::now() < deadline) {
      tokens += first->next(c, std::chrono::milliseconds(50)) ? 1 : 0;
    }
    EXPECT_EQ(tokens, 4);
  }
  GenerateRequest lone = r;
  std::shared_ptr<Ticket> waiting;
  {
    Scheduler scheduler(predictor, o, metrics);
    waiting = scheduler.submit(lone);  // waits 600 s for more requests
  }
  TokenChoice c;
  EXPECT_THROW(waiting->next(c, std::chrono::milliseconds(10)), Unavailable);
}

}  // namespace
}  // namespace cohort::serve::detail
