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
#include "cohort/models/gpt.h"
#include "cohort/models/llama.h"
#include "cohort/parallel/pipeline.h"
#include "cohort/parallel/tensor_gpt.h"
#include "cohort/parallel/tensor_llama.h"

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

// A rank's model, as SplitPredictor's ranks hold it: a pipeline stage of
// consecutive blocks, or (--tensor) a slice of every tensor of the whole
// model over the tensor group of all ranks.
class SplitRank {
 public:
  // The tensor group `tensorGroup` (tensor mode only) is this rank's with
  // the other ranks, without the front.
  SplitRank(const ServeOptions& o, const comm::Comm* tensorGroup) : rank_(o.splitRank), procs_(o.procs) {
    TrainedModel t = loadTrainedModel(o.model, o.job, true);
    if (!t.weights) throw UsageError(fmt::format("{}: only gpt and llama without LoRA are served split (--procs)", o.model));
    ModelConfig mc = t.job.model;
    mc.vocabSize = t.info.vocabSize;
    mc.memoryFormat = MemoryLayout::contiguous;
    width_ = mc.nEmbd;
    torch::NoGradGuard noGrad;
    if (tensorGroup != nullptr) {
      tensor_ = true;
      // Its slices are drawn as the whole model draws its values, then
      // overwritten by the trained ones: one whole tensor read at a time.
      model_ = mc.arch == ModelArch::llama
                   ? parallel::createTensorParallelLlama(models::llamaOptions(mc, mc.vocabSize), *tensorGroup)
                   : parallel::createTensorParallelGpt(models::gptOptions(mc, mc.vocabSize), *tensorGroup);
      loadSlices(*t.weights, t.info.weights);
      log::info("split rank {}: a slice of {} of {} ranks (tensor parallel) loaded from {} ({} parameters)", rank_,
                t.info.arch, procs_, t.info.weights, models::parameterCount(*model_));
    } else {
      const auto [first, end] = stageBlocks(pipelineBlocks(mc), procs_)[static_cast<size_t>(rank_)];
      models::ModelPart part;
      part.firstBlock = first;
      part.endBlock = end;
      part.input = rank_ == 0;
      part.output = rank_ == procs_ - 1;
      part.exact = false;  // its values are the trained ones, loaded next
      model_ = models::createModel(mc, {t.info.channels, t.info.height, t.info.width}, part);
      models::loadWeights(*model_, *t.weights, t.info.weights, true);
      log::info("split rank {}: blocks [{}, {}) of {} loaded from {} ({} parameters)", rank_, first, end,
                pipelineBlocks(mc), t.info.weights, models::parameterCount(*model_));
    }
    model_->eval();
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
      if (tensor_) {  // every rank embeds the tokens; each returns its slice of the vocabulary
        torch::NoGradGuard noGrad;
        std::vector<at::Tensor> send = {model_->forward(cmd.tokens).to(torch::kFloat).contiguous()};
        comm::wait(c.pg->send(send, front, kTagLogits), c, "send the logits");
        continue;
      }
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
  // Each tensor of the model takes this rank's slice of the trained one.
  void loadSlices(ckpt::TensorSource& source, const std::string& origin) {
    const int tensors = procs_;
    std::map<std::string, at::Tensor> entries;  // names and shapes, no data
    for (const auto& [name, e] : source.entries()) entries.emplace(name, e);
    auto load = [&](const std::string& name, at::Tensor& into) {
      if (entries.count(name) == 0) {
        throw DataError(fmt::format("{}: missing tensor '{}' that the model needs", origin, name));
      }
      const at::Tensor slice = parallel::sliceByCut(source.load(name), parallel::tensorCut(name), tensors, rank_);
      source.drop(name);
      if (!slice.sizes().equals(into.sizes())) {
        throw DataError(fmt::format("{}: tensor '{}' of shape [{}] cuts into [{}] on rank {} of {}, the split "
                                    "model's is [{}]",
                                    origin, name, fmt::join(entries.at(name).sizes(), ", "),
                                    fmt::join(slice.sizes(), ", "), rank_, tensors, fmt::join(into.sizes(), ", ")));
      }
      into.copy_(slice);
    };
    for (auto& p : model_->named_parameters()) load(p.key(), p.value());
    for (auto& b : model_->named_buffers()) {
      if (entries.count(b.key()) != 0) load(b.key(), b.value());
    }
  }

  int rank_, procs_;
  bool tensor_ = false;
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
    // The tensor group of the ranks alone (the front is not in it), before
    // the model, whose slices are built over it.
    std::optional<comm::Comm> tensorGroup;
    if (o.tensor) {
      comm::CommOptions to;
      to.rank = o.splitRank;
      to.worldSize = o.procs;
      to.masterPort = o.splitStorePort;
      to.storePrefix = "cohort-split-tensor";
      to.timeout = kSplitIdle;
      tensorGroup = comm::connect(to);
    }
    SplitRank stage(o, tensorGroup ? &*tensorGroup : nullptr);
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
