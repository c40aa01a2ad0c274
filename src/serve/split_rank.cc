// One rank of a split model (serve/detail/split.h): its stage of the
// blocks, loaded alone, answering the front's commands; and the commands'
// layout, which the front shares.

#include "serve/detail/split.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>

#include "cohort/comm/comm.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/models/model.h"
#include "cohort/parallel/pipeline.h"

namespace cohort::serve::detail {

std::pair<at::Tensor, at::Tensor> packCommand(const SplitCommand& c) {
  const auto rows = static_cast<int64_t>(c.ids.size());
  const int64_t longest = c.tokens.defined() ? c.tokens.size(1) : 0;
  at::Tensor header =
      torch::tensor({static_cast<int64_t>(c.op), rows, longest, static_cast<int64_t>(c.frees.size())}, torch::kLong);
  if (c.op == SplitOp::stop) return {header, {}};
  std::vector<at::Tensor> parts = {torch::tensor(c.ids, torch::kLong), torch::tensor(c.counts, torch::kLong),
                                   torch::tensor(c.frees, torch::kLong).view({-1}),
                                   c.tokens.to(torch::kLong).reshape({-1})};
  return {header, torch::cat(parts).contiguous()};
}

int64_t commandBodySize(const at::Tensor& header) {
  const auto* h = header.data_ptr<int64_t>();
  const int64_t op = h[0], rows = h[1], longest = h[2], frees = h[3];
  if (op < 1 || op > 3 || rows < 0 || longest < 0 || frees < 0) {
    throw DataError(fmt::format("split model: a command header [{}, {}, {}, {}] that is not one", op, rows, longest,
                                frees));
  }
  return op == static_cast<int64_t>(SplitOp::stop) ? 0 : 2 * rows + frees + rows * longest;
}

SplitCommand unpackCommand(const at::Tensor& header, const at::Tensor& body) {
  const auto* h = header.data_ptr<int64_t>();
  SplitCommand c;
  c.op = static_cast<SplitOp>(h[0]);
  if (c.op == SplitOp::stop) return c;
  const int64_t rows = h[1], longest = h[2], frees = h[3];
  const int64_t* b = body.data_ptr<int64_t>();
  c.ids.assign(b, b + rows);
  c.counts.assign(b + rows, b + 2 * rows);
  c.frees.assign(b + 2 * rows, b + 2 * rows + frees);
  c.tokens = body.narrow(0, 2 * rows + frees, rows * longest).view({rows, longest});
  return c;
}

std::vector<std::pair<int64_t, int64_t>> stageBlocks(int64_t blocks, int procs) {
  const std::vector<int64_t> counts =
      parallel::balanceStages(std::vector<double>(static_cast<size_t>(blocks), 1.0), procs);
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t first = 0;
  for (int64_t n : counts) {
    out.emplace_back(first, first + n);
    first += n;
  }
  return out;
}

std::string splitReadyKey(int rank) { return fmt::format("split/ready/{}", rank); }

namespace {

// COHORT_SERVE_RANK_CGROUP: this process joins the cgroup before it loads.
void joinCgroup(int rank) {
  const std::optional<std::string> pattern = env::serveRankCgroup();
  if (!pattern || pattern->empty()) return;
  std::string dir = *pattern;
  for (size_t at = dir.find("{rank}"); at != std::string::npos; at = dir.find("{rank}")) {
    dir.replace(at, 6, std::to_string(rank));
  }
  std::ofstream procs(dir + "/cgroup.procs");
  procs << ::getpid() << std::endl;
  if (!procs) {
    throw UsageError(fmt::format("${} {}: cannot join {}/cgroup.procs: {}", env::kServeRankCgroupVar, *pattern, dir,
                                 std::strerror(errno)));
  }
  log::info("split rank {}: in cgroup {}", rank, dir);
}

class StageRank {
 public:
  explicit StageRank(const ServeOptions& o) : rank_(o.splitRank), procs_(o.procs) {
    TrainedModel t = loadTrainedModel(o.model, o.job, true);
    if (!t.weights) throw UsageError(fmt::format("{}: only gpt and llama without LoRA are served split (--procs)", o.model));
    ModelConfig mc = t.job.model;
    mc.vocabSize = t.info.vocabSize;
    mc.memoryFormat = MemoryLayout::contiguous;
    width_ = mc.nEmbd;
    const auto [first, end] = stageBlocks(pipelineBlocks(mc), procs_)[static_cast<size_t>(rank_)];
    models::ModelPart part;
    part.firstBlock = first;
    part.endBlock = end;
    part.input = rank_ == 0;
    part.output = rank_ == procs_ - 1;
    part.exact = false;  // its values are the trained ones, loaded next
    torch::NoGradGuard noGrad;
    model_ = models::createModel(mc, {t.info.channels, t.info.height, t.info.width}, part);
    models::loadWeights(*model_, *t.weights, t.info.weights, true);
    model_->eval();
    log::info("split rank {}: blocks [{}, {}) of {} loaded from {} ({} parameters)", rank_, first, end,
              pipelineBlocks(mc), t.info.weights, models::parameterCount(*model_));
  }

  // Answers commands until stop.
  void serve(const comm::Comm& c) {
    const int front = procs_;
    std::map<int64_t, models::KvCache> caches;  // by the front's id
    while (true) {
      std::vector<at::Tensor> header = {torch::empty({4}, torch::kLong)};
      comm::wait(c.pg->recv(header, front, kTagCommand), c, "receive a command");
      const int64_t size = commandBodySize(header[0]);
      std::vector<at::Tensor> body = {torch::empty({size}, torch::kLong)};
      if (size > 0) comm::wait(c.pg->recv(body, front, kTagCommand), c, "receive a command");
      const SplitCommand cmd = unpackCommand(header[0], body[0]);
      if (cmd.op == SplitOp::stop) return;
      for (int64_t id : cmd.frees) caches.erase(id);
      const auto rows = static_cast<int64_t>(cmd.ids.size());
      const int64_t longest = cmd.tokens.size(1);
      at::Tensor hidden;
      if (rank_ > 0) {
        std::vector<at::Tensor> in = {torch::empty({rows, longest, width_}, torch::kFloat)};
        comm::wait(c.pg->recv(in, rank_ - 1, kTagActivations), c, "receive the activations of the stage before");
        hidden = in[0];
      }
      c10::InferenceMode guard;
      at::Tensor out;
      if (cmd.op == SplitOp::forward) {
        out = model_->forward(rank_ == 0 ? cmd.tokens : hidden);
      } else {
        std::vector<at::Tensor> tokens;
        std::vector<models::KvCache*> rowCaches;
        for (int64_t r = 0; r < rows; ++r) {
          const auto i = static_cast<size_t>(r);
          tokens.push_back(cmd.tokens[r].narrow(0, 0, cmd.counts[i]));
          rowCaches.push_back(&caches[cmd.ids[i]]);
        }
        out = model_->decodePart(hidden, tokens, rowCaches);
      }
      std::vector<at::Tensor> send = {out.to(torch::kFloat).contiguous()};
      const bool last = rank_ == procs_ - 1;
      comm::wait(c.pg->send(send, last ? front : rank_ + 1, last ? kTagLogits : kTagActivations), c,
                 last ? "send the logits" : "send activations to the next stage");
    }
  }

 private:
  int rank_, procs_;
  int64_t width_ = 0;
  std::shared_ptr<models::Model> model_;
};

}  // namespace

int runSplitRank(const ServeOptions& o) {
  log::Options lo;
  lo.tag = fmt::format("serve rank {}/{}", o.splitRank, o.procs);
  log::init(lo);
  try {
    if (o.computeThreads > 0) at::set_num_threads(o.computeThreads);
    joinCgroup(o.splitRank);
    StageRank stage(o);
    const std::chrono::milliseconds connectTimeout(300000);
    auto store = comm::connectStoreClient("127.0.0.1", o.splitStorePort, "", connectTimeout);
    store->set(splitReadyKey(o.splitRank), std::vector<uint8_t>{1});
    comm::CommOptions co;
    co.rank = o.splitRank;
    co.worldSize = o.procs + 1;
    co.masterPort = o.splitStorePort;
    co.storePrefix = "cohort-split";
    // A rank waits for the front's next command for as long as the server
    // runs: the front's end closes the connections (and kills the rank).
    co.timeout = kSplitIdle;
    const comm::Comm c = comm::connect(co);
    stage.serve(c);
    log::info("split rank {}: stopped", o.splitRank);
    return 0;
  } catch (const std::exception& e) {
    log::error("split rank {}: {}", o.splitRank, e.what());
    return dynamic_cast<const UsageError*>(&e) != nullptr ? 2 : 1;
  }
}

}  // namespace cohort::serve::detail
