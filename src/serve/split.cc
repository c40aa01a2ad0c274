// The front of a split model (serve/detail/split.h): starts the ranks,
// joins their group holding no weights, and turns forward() and decode()
// into commands; a watcher thread notices a rank that ends.

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "cohort/comm/comm.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/launch/spawn.h"
#include "cohort/launch/supervisor.h"
#include "cohort/models/gpt.h"
#include "cohort/models/llama.h"
#include "cohort/parallel/tensor_gpt.h"
#include "cohort/parallel/tensor_llama.h"
#include "serve/detail/split.h"

namespace cohort::serve {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::string absoluteArg(const std::string& p) { return p.empty() ? p : fs::absolute(p).lexically_normal().string(); }

class SplitPredictor : public Predictor {
 public:
  SplitPredictor(const std::string& model, const std::string& jobPath, const SplitOptions& o)
      : procs_(o.procs), tensor_(o.tensor), timeout_(o.timeout) {
    {
      TrainedModel t = loadTrainedModel(model, jobPath, true);  // names and shapes: no weights held
      if (!t.weights) {
        throw UsageError(fmt::format("--procs {}: {} is a {} model{}; only gpt and llama without LoRA are served "
                                     "split",
                                     o.procs, model, t.info.arch, t.job.model.lora.rank > 0 ? " with LoRA" : ""));
      }
      const int64_t blocks = pipelineBlocks(t.job.model);
      if (o.tensor) {
        ModelConfig mc = t.job.model;
        mc.vocabSize = t.info.vocabSize;
        try {
          if (o.procs < 2) throw ConfigError("expected 2 or more ranks");
          if (mc.arch == ModelArch::llama) {
            parallel::checkLlamaTensorSplit(models::llamaOptions(mc, mc.vocabSize), o.procs);
          } else {
            parallel::checkGptTensorSplit(models::gptOptions(mc, mc.vocabSize), o.procs);
          }
        } catch (const ConfigError& e) {
          throw UsageError(fmt::format("--procs {} --tensor: {} cannot be split over {} ranks: {}", o.procs, model,
                                       o.procs, e.what()));
        }
      } else if (o.procs < 1 || o.procs > blocks) {
        throw UsageError(fmt::format("--procs {}: expected 1 to {}, the blocks of {} (model.n_layer): each rank "
                                     "holds at least one",
                                     o.procs, blocks, model));
      }
      info_ = t.info;
    }
    store_ = comm::hostStore("127.0.0.1", 0, o.timeout, "");
    signal(SIGCHLD, SIG_DFL);  // an inherited "ignore" would have the kernel reap the ranks
    const std::string exe = o.exe.empty() ? launch::engineExecutable() : o.exe;
    for (int r = 0; r < procs_; ++r) {
      std::vector<std::string> args = {exe, "serve", absoluteArg(model), "--procs", std::to_string(procs_),
                                       "--split-rank", std::to_string(r), "--split-store",
                                       std::to_string(store_.port)};
      if (tensor_) args.push_back("--tensor");
      if (!jobPath.empty()) args.insert(args.end(), {"--job", absoluteArg(jobPath)});
      if (o.computeThreads > 0) args.insert(args.end(), {"--compute-threads", std::to_string(o.computeThreads)});
      ranks_.start(r, exe, args, nullptr, nullptr, "cohort-torch for a rank of a split model");
    }
    waitLoaded();
    comm::CommOptions co;
    co.rank = procs_;
    co.worldSize = procs_ + 1;
    co.masterPort = store_.port;
    co.storePrefix = "cohort-split";
    co.timeout = detail::kSplitIdle;
    comm_ = comm::connect(co);
    comm_.timeout = timeout_;  // this process's waits are bounded
    watcher_ = std::thread([this] { watch(); });
    log::info("serve: {} split across {} ranks ({}); this process holds no weights", model, procs_,
              tensor_ ? "tensor parallel" : "pipeline stages");
  }

  ~SplitPredictor() override {
    {
      std::lock_guard<std::mutex> g(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (watcher_.joinable()) watcher_.join();
    if (broken().empty()) {
      try {
        detail::SplitCommand stop;
        send(stop);
      } catch (const std::exception& e) {
        log::warn("serve: could not tell the ranks to stop: {}", e.what());
      }
    }
    // They exit on stop; what does not within the grace is killed. Broken,
    // they are killed at once: they may wait for a command that never comes.
    ranks_.stop(broken().empty() ? 0 : SIGKILL, std::chrono::seconds(10));
    launch::Supervisor::Watch w;
    w.ended = [](const launch::Supervisor::Child&) {};
    ranks_.watch(w);
  }

  const ModelInfo& info() const override { return info_; }
  bool decodes() const override { return !tensor_; }

  at::Tensor forward(const at::Tensor& input) override {
    detail::checkInput(input, info_);
    detail::SplitCommand c;
    c.op = detail::SplitOp::forward;
    c.tokens = input.contiguous();
    c.ids.assign(static_cast<size_t>(input.size(0)), 0);
    c.counts.assign(static_cast<size_t>(input.size(0)), input.size(1));
    c.frees = takeFreed();
    return run(c, {input.size(0), input.size(1), info_.vocabSize});
  }

  at::Tensor decode(const std::vector<at::Tensor>& rows, const std::vector<models::KvCache*>& caches) override {
    if (tensor_) return Predictor::decode(rows, caches);  // throws: no cache
    if (rows.empty() || rows.size() != caches.size()) {
      throw DataError(fmt::format("{} rows for {} caches: expected one cache per row, at least one", rows.size(),
                                  caches.size()));
    }
    detail::SplitCommand c;
    c.op = detail::SplitOp::decode;
    int64_t longest = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      detail::checkInput(rows[r].unsqueeze(0), info_);
      if (caches[r]->length + rows[r].numel() > info_.blockSize) {
        throw DataError(fmt::format("row {}: {} positions cached and {} new pass the model's block_size ({})", r,
                                    caches[r]->length, rows[r].numel(), info_.blockSize));
      }
      longest = std::max(longest, rows[r].numel());
    }
    c.tokens = torch::zeros({static_cast<int64_t>(rows.size()), longest}, torch::kLong);
    for (size_t r = 0; r < rows.size(); ++r) {
      c.tokens[static_cast<int64_t>(r)].narrow(0, 0, rows[r].numel()).copy_(rows[r]);
      c.counts.push_back(rows[r].numel());
    }
    std::vector<int64_t> orphans;  // rows of ended sequences, still queued: state for this call only
    {
      std::lock_guard<std::mutex> g(mutex_);
      for (models::KvCache* cache : caches) {
        auto it = ids_.find(cache);
        if (cache->length == 0) {  // a new sequence (or one started again): new state on the ranks
          if (it != ids_.end()) freed_.push_back(it->second);
          it = ids_.insert_or_assign(cache, nextId_++).first;
        } else if (it == ids_.end()) {
          // Its sequence ended (endSequence) while this step waited: nobody
          // reads its logits.
          orphans.push_back(nextId_++);
          c.ids.push_back(orphans.back());
          continue;
        }
        c.ids.push_back(it->second);
      }
    }
    c.frees = takeFreed();
    at::Tensor logits = run(c, {static_cast<int64_t>(rows.size()), info_.vocabSize});
    if (!orphans.empty()) {
      std::lock_guard<std::mutex> g(mutex_);
      freed_.insert(freed_.end(), orphans.begin(), orphans.end());
    }
    for (size_t r = 0; r < rows.size(); ++r) caches[r]->length += rows[r].numel();
    return logits;
  }

  void endSequence(const models::KvCache& cache) override {
    std::lock_guard<std::mutex> g(mutex_);
    auto it = ids_.find(&cache);
    if (it == ids_.end()) return;
    freed_.push_back(it->second);
    ids_.erase(it);
  }

  std::string broken() const override {
    std::lock_guard<std::mutex> g(mutex_);
    return broken_;
  }

 private:
  // Every rank has set its ready key, or one ended (Error) or the time ran
  // out (TimeoutError).
  void waitLoaded() {
    const auto deadline = Clock::now() + timeout_;
    for (int r = 0; r < procs_;) {
      std::string ended;
      ranks_.reap([&](const launch::Supervisor::Child& c) {
        if (ended.empty()) ended = fmt::format("rank {} {}", c.rank, launch::describeStatus(c.status));
      });
      if (!ended.empty()) {
        throw Error(fmt::format("serve --procs {}: {} while loading its stage (its log above says why)", procs_,
                                ended));
      }
      if (store_.store->check({detail::splitReadyKey(r)})) {
        ++r;
        continue;
      }
      if (Clock::now() > deadline) {
        throw TimeoutError(fmt::format("serve --procs {}: rank {} did not load its stage within {} s", procs_, r,
                                       timeout_.count() / 1000.0));
      }
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }

  // The watcher: reaps the ranks; the first that ends breaks the predictor
  // and the others are killed, so that no wait on them lasts.
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      std::string ended;
      ranks_.reap([&](const launch::Supervisor::Child& c) {
        if (ended.empty()) ended = fmt::format("rank {} of the split model {}", c.rank, launch::describeStatus(c.status));
      });
      lock.lock();
      if (!ended.empty() && !stopping_) {
        if (!broken_.empty()) log::error("serve: {}", ended);  // what broke the calls already
        fail(ended);
        lock.unlock();
        ranks_.killAll();
        return;
      }
      wake_.wait_for(lock, std::chrono::milliseconds(50));
    }
  }

  // Under mutex_: the first failure is the one reported.
  void fail(const std::string& why) {
    if (!broken_.empty()) return;
    broken_ = why;
    log::error("serve: {}; no request can be answered any more", why);
  }

  std::vector<int64_t> takeFreed() {
    std::lock_guard<std::mutex> g(mutex_);
    return std::exchange(freed_, {});
  }

  void send(const detail::SplitCommand& c) {
    auto [header, body] = detail::packCommand(c);
    for (int r = 0; r < procs_; ++r) {
      std::vector<at::Tensor> h = {header};
      comm::wait(comm_.pg->send(h, r, detail::kTagCommand), comm_, "send a command");
      if (!body.defined()) continue;
      std::vector<at::Tensor> b = {body};
      comm::wait(comm_.pg->send(b, r, detail::kTagCommand), comm_, "send a command");
    }
  }

  // Sends `c` and returns the last stage's logits of shape `shape`. Any
  // failure breaks the predictor.
  at::Tensor run(const detail::SplitCommand& c, const std::vector<int64_t>& shape) {
    if (std::string why = broken(); !why.empty()) throw Error("the split model cannot answer: " + why);
    try {
      send(c);
      if (!tensor_) {
        std::vector<at::Tensor> out = {torch::empty(shape, torch::kFloat)};
        comm::wait(comm_.pg->recv(out, procs_ - 1, detail::kTagLogits), comm_, "receive the logits of the last stage");
        return out[0];
      }
      // Each rank's columns of the vocabulary, in rank order.
      std::vector<int64_t> sliceShape = shape;
      sliceShape.back() /= procs_;
      std::vector<at::Tensor> slices;
      for (int r = 0; r < procs_; ++r) {
        std::vector<at::Tensor> out = {torch::empty(sliceShape, torch::kFloat)};
        comm::wait(comm_.pg->recv(out, r, detail::kTagLogits), comm_, "receive a rank's slice of the logits");
        slices.push_back(out[0]);
      }
      return torch::cat(slices, -1);
    } catch (const std::exception& e) {
      {
        std::lock_guard<std::mutex> g(mutex_);
        fail(fmt::format("the ranks did not answer: {}", e.what()));
      }
      wake_.notify_all();
      throw Error(fmt::format("the split model cannot answer: {}", broken()));
    }
  }

  int procs_;
  bool tensor_;
  std::chrono::milliseconds timeout_;
  ModelInfo info_;
  comm::HostedStore store_;
  launch::Supervisor ranks_;  // kills and reaps whatever is left, whatever happens
  comm::Comm comm_;
  std::thread watcher_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::string broken_;
  std::map<const models::KvCache*, int64_t> ids_;  // the ranks' state of each cache
  std::vector<int64_t> freed_;                     // ids whose state the ranks drop with the next command
  int64_t nextId_ = 1;
};

class PredictorModel : public models::Model {
 public:
  explicit PredictorModel(std::unique_ptr<Predictor> p) : p_(std::move(p)) {}
  at::Tensor forward(const at::Tensor& input) override { return p_->forward(input); }
  bool decodes() const override { return p_->decodes(); }
  at::Tensor decode(const std::vector<at::Tensor>& rows, const std::vector<models::KvCache*>& caches) override {
    return p_->decode(rows, caches);
  }

 private:
  std::unique_ptr<Predictor> p_;
};

}  // namespace

std::shared_ptr<models::Model> predictorModel(std::unique_ptr<Predictor> predictor) {
  return std::make_shared<PredictorModel>(std::move(predictor));
}

std::unique_ptr<Predictor> openSplitPredictor(const std::string& model, const std::string& jobPath,
                                              const SplitOptions& o) {
  return std::make_unique<SplitPredictor>(model, jobPath, o);
}

}  // namespace cohort::serve
