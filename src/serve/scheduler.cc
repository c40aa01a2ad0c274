#include "serve/detail/scheduler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>

#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace cohort::serve::detail {

namespace {

using SchedulerClock = std::chrono::steady_clock;

double secondsSince(SchedulerClock::time_point t) {
  return std::chrono::duration<double>(SchedulerClock::now() - t).count();
}

}  // namespace

bool Ticket::next(TokenChoice& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait_for(lock, timeout, [&] { return !tokens_.empty() || error_ != nullptr; });
  if (!tokens_.empty()) {
    out = std::move(tokens_.front());
    tokens_.pop_front();
    return true;
  }
  if (error_ != nullptr) std::rethrow_exception(error_);
  return false;
}

void Ticket::cancel() { cancelled_ = true; }

void Ticket::push(TokenChoice c) {
  {
    std::lock_guard<std::mutex> g(mutex_);
    tokens_.push_back(std::move(c));
  }
  cv_.notify_all();
}

void Ticket::fail(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> g(mutex_);
    if (error_ == nullptr) error_ = std::move(e);
  }
  cv_.notify_all();
}

struct Scheduler::Waiting {
  GenerateRequest request;
  std::shared_ptr<Ticket> ticket;
  SchedulerClock::time_point arrived;
};

struct Scheduler::Running {
  Running(Waiting w, int64_t blockSize, std::shared_ptr<models::KvPool> pool, Predictor& p)
      : request(std::move(w.request)), ticket(std::move(w.ticket)), arrived(w.arrived),
        seq(request.prompt, blockSize, /*cached=*/true, std::move(pool)),
        generator(at::make_generator<at::CPUGeneratorImpl>(request.sampling.seed)), predictor(p) {}
  // A predictor with state of its own per cache (a split model's ranks)
  // drops this sequence's.
  ~Running() { predictor.endSequence(seq.cache()); }
  Running(const Running&) = delete;
  Running& operator=(const Running&) = delete;
  GenerateRequest request;
  std::shared_ptr<Ticket> ticket;
  SchedulerClock::time_point arrived, last;
  infer::Sequence seq;  // its cache's blocks go back to the pool with it
  at::Generator generator;
  Predictor& predictor;
  int64_t generated = 0;
};

Scheduler::Scheduler(Predictor& predictor, SchedulerOptions options, ServeMetrics& metrics)
    : predictor_(predictor), options_(options), metrics_(metrics),
      pool_(std::make_shared<models::KvPool>(options.blockTokens)) {
  metrics_.generation = true;
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> g(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  const auto stopped = std::make_exception_ptr(
      Unavailable("the server is shutting down and the drain limit (--drain-seconds) has passed"));
  for (auto& w : waiting_) w->ticket->fail(stopped);
  for (auto& r : running_) r->ticket->fail(stopped);
}

std::shared_ptr<Ticket> Scheduler::submit(const GenerateRequest& request) {
  auto ticket = std::make_shared<Ticket>();
  {
    std::lock_guard<std::mutex> g(mutex_);
    if (stopping_ || static_cast<int64_t>(waiting_.size()) >= options_.maxWaiting) return nullptr;
    waiting_.push_back(std::make_unique<Waiting>(Waiting{request, ticket, SchedulerClock::now()}));
    metrics_.requestsWaiting = static_cast<int64_t>(waiting_.size());
    metrics_.queueDepth = static_cast<int64_t>(waiting_.size());
  }
  cv_.notify_all();
  return ticket;
}

void Scheduler::drain() {
  {
    std::lock_guard<std::mutex> g(mutex_);
    draining_ = true;
  }
  cv_.notify_all();
}

void Scheduler::publish(int64_t waiting) {
  metrics_.requestsWaiting = waiting;
  metrics_.queueDepth = waiting;
  metrics_.requestsRunning = static_cast<int64_t>(running_.size());
  metrics_.kvBlocksInUse = pool_->blocksInUse();
  metrics_.kvBlocksTotal = pool_->blocksReserved();
  metrics_.kvBlockBytes = pool_->bytesPerBlock();
}

void Scheduler::loop() {
  // Set on the thread that runs the model: with OpenMP the count is the
  // calling thread's own setting.
  if (options_.computeThreads > 0) at::set_num_threads(options_.computeThreads);
  auto purge = [&] {
    waiting_.erase(
        std::remove_if(waiting_.begin(), waiting_.end(), [](const auto& w) { return w->ticket->cancelled(); }),
        waiting_.end());
  };
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (running_.empty()) {
        publish(static_cast<int64_t>(waiting_.size()));
        cv_.wait(lock, [&] { return stopping_ || !waiting_.empty(); });
        // Idle: let a batch gather, as the Batcher does, at most maxDelay
        // after the oldest request (cancelled ones leave meanwhile).
        while (!stopping_ && !draining_ && !waiting_.empty() &&
               static_cast<int64_t>(waiting_.size()) < options_.maxRows) {
          const auto deadline = waiting_.front()->arrived + options_.maxDelay;
          const auto now = SchedulerClock::now();
          if (now >= deadline) break;
          cv_.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(50)));
          purge();
        }
      }
      if (stopping_) return;
      purge();
      while (static_cast<int64_t>(running_.size()) < options_.maxRows && !waiting_.empty()) {
        std::unique_ptr<Waiting> w = std::move(waiting_.front());
        waiting_.pop_front();
        if (w->request.maxTokens <= 0) continue;
        metrics_.promptTokens += static_cast<int64_t>(w->request.prompt.size());
        running_.push_back(std::make_unique<Running>(std::move(*w), options_.blockSize, pool_, predictor_));
      }
      publish(static_cast<int64_t>(waiting_.size()));
    }
    try {
      iterate();
    } catch (...) {
      // Not the forward (iterate answers that): sampling or bookkeeping
      // failed. No error is swallowed: every running request gets it.
      const std::exception_ptr error = std::current_exception();
      for (auto& r : running_) r->ticket->fail(error);
      running_.clear();
    }
  }
}

at::Tensor Scheduler::decodeApart(const std::vector<at::Tensor>& rows, const std::vector<models::KvCache*>& caches) {
  // One decode pads every row to the longest: a prompt of 200 tokens beside
  // 31 single tokens would compute 32 x 200 positions. The single tokens run
  // together, the prompts (and refills) together apart from them.
  std::vector<size_t> single, longer;
  for (size_t k = 0; k < rows.size(); ++k) (rows[k].size(0) == 1 ? single : longer).push_back(k);
  if (single.empty() || longer.empty()) return predictor_.decode(rows, caches).to(torch::kFloat).contiguous();
  at::Tensor out;
  for (const std::vector<size_t>* group : {&single, &longer}) {
    std::vector<at::Tensor> r;
    std::vector<models::KvCache*> c;
    for (size_t k : *group) {
      r.push_back(rows[k]);
      c.push_back(caches[k]);
    }
    const at::Tensor l = predictor_.decode(r, c).to(torch::kFloat);
    if (!out.defined()) out = torch::empty({static_cast<int64_t>(rows.size()), l.size(1)}, l.options());
    for (size_t i = 0; i < group->size(); ++i) out[static_cast<int64_t>((*group)[i])].copy_(l[static_cast<int64_t>(i)]);
  }
  return out;
}

void Scheduler::iterate() {
  // Sequences whose handler is done with them leave: their blocks go back.
  running_.erase(
      std::remove_if(running_.begin(), running_.end(), [](const auto& r) { return r->ticket->cancelled(); }),
      running_.end());
  if (running_.empty()) return;
  // Rows under way (one token each) first, then prompts and refills in the
  // order they came, each at least one token, the rest within stepTokens.
  std::vector<std::vector<int64_t>> inputs(running_.size());
  for (size_t i = 0; i < running_.size(); ++i) inputs[i] = running_[i]->seq.input();
  std::vector<size_t> order(running_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_partition(order.begin(), order.end(), [&](size_t i) { return inputs[i].size() <= 1; });
  std::vector<at::Tensor> rows;
  std::vector<models::KvCache*> caches;
  std::vector<bool> complete;
  int64_t budget = options_.stepTokens;
  for (size_t i : order) {
    const auto n = static_cast<int64_t>(inputs[i].size());
    const int64_t take = 1 + std::min(n - 1, std::max<int64_t>(budget, 0));
    budget -= take - 1;
    rows.push_back(torch::tensor(std::vector<int64_t>(inputs[i].begin(), inputs[i].begin() + take), torch::kInt64));
    caches.push_back(&running_[i]->seq.cache());
    complete.push_back(take == n);
  }
  const auto start = SchedulerClock::now();
  at::Tensor logits;
  try {
    logits = decodeApart(rows, caches);
  } catch (...) {
    // The whole iteration failed: each of its requests gets the error (a
    // bug: the parser checks prompts; answered 500), and leaves.
    const std::exception_ptr error = std::current_exception();
    for (auto& r : running_) r->ticket->fail(error);
    running_.clear();
    return;
  }
  metrics_.batch(static_cast<int64_t>(rows.size()), secondsSince(start));
  // The tokens go to their requests last, once the metrics count them and
  // the generations that are done have left (their blocks back): a client
  // that has its last token finds them so at /metrics.
  std::vector<std::pair<std::shared_ptr<Ticket>, TokenChoice>> handed;
  for (size_t k = 0; k < order.size(); ++k) {
    if (!complete[k]) continue;  // a prompt part-way in: its next part next time
    Running& r = *running_[order[k]];
    const at::Tensor l = logits[static_cast<int64_t>(k)].narrow(
        0, 0, options_.vocab > 0 ? std::min(options_.vocab, logits.size(1)) : logits.size(1));
    const int64_t token = infer::sampleNext(l, r.request.sampling, r.generator);
    TokenChoice c;
    if (r.request.logprobs >= 0) {
      c = choiceOf(l, token, r.request.logprobs);
    } else {
      c.token = token;
    }
    r.seq.append(token);
    ++r.generated;
    if (r.generated == 1) {
      metrics_.firstToken(secondsSince(r.arrived));
    } else {
      metrics_.betweenTokens(secondsSince(r.last));
    }
    r.last = SchedulerClock::now();
    handed.emplace_back(r.ticket, std::move(c));
  }
  metrics_.generatedTokens += static_cast<int64_t>(handed.size());
  // Those that reached max_tokens leave now.
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [](const auto& r) { return r->generated >= r->request.maxTokens; }),
                 running_.end());
  metrics_.requestsRunning = static_cast<int64_t>(running_.size());
  metrics_.kvBlocksInUse = pool_->blocksInUse();
  metrics_.kvBlocksTotal = pool_->blocksReserved();
  metrics_.kvBlockBytes = pool_->bytesPerBlock();
  for (auto& [ticket, c] : handed) ticket->push(std::move(c));
}

}  // namespace cohort::serve::detail
