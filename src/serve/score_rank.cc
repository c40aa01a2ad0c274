// One rank of `cohort score` (serve/detail/score_rank.h).

#include "serve/detail/score_rank.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/serve/model.h"
#include "cohort/core/fd.h"
#include "serve/detail/score_data.h"
#include "serve/detail/score_run.h"

namespace cohort::serve::detail {

namespace {

using Json = nlohmann::ordered_json;  // lines keep their keys in the documented order

// The shortest decimal that reads back as the same float32: the model's
// precision, without the noise digits of its double widening.
double shortest(float v) {
  return std::isfinite(v) ? std::stod(fmt::format("{}", v)) : static_cast<double>(v);
}

Json lineStart(int64_t index, const ScoreItem& item) {
  Json j;
  j["index"] = index;
  j["id"] = item.id;
  return j;
}

// Appends whole batches of lines to a part file.
class PartWriter {
 public:
  explicit PartWriter(const std::string& path)
      : path_(path), fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) {
    if (!fd_.valid()) throw IoError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  }
  // One write per batch: a kill leaves at most this batch torn.
  void append(const std::string& lines) { writeAll(fd_.get(), lines, path_); }

 private:
  std::string path_;
  UniqueFd fd_;
};

// The lines of images [begin, end): one forward over the decodable ones.
std::string scoreImages(Predictor& predictor, ScoreData& data, int64_t begin, int64_t end, int64_t topK) {
  const ModelInfo& info = predictor.info();
  const int64_t n = end - begin;
  at::Tensor pixels = torch::empty({n, info.channels, info.height, info.width}, torch::kFloat);
  const int64_t numel = info.channels * info.height * info.width;
  std::vector<ScoreItem> items;
  std::vector<int64_t> row(static_cast<size_t>(n), -1);  // sample -> its row of `pixels`
  int64_t rows = 0;
  for (int64_t i = 0; i < n; ++i) {
    items.push_back(data.readImage(begin + i, pixels.data_ptr<float>() + rows * numel));
    if (items.back().error.empty()) row[static_cast<size_t>(i)] = rows++;
    else log::warn("sample {}: {}; its line holds the error", begin + i, items.back().error);
  }
  at::Tensor values, labels;
  if (rows > 0) {
    const at::Tensor probs = torch::softmax(predictor.forward(pixels.narrow(0, 0, rows)).to(torch::kFloat), 1);
    std::tie(values, labels) = probs.topk(std::min(topK, probs.size(1)), 1);
    values = values.contiguous();
    labels = labels.contiguous();
  }
  std::string out;
  for (int64_t i = 0; i < n; ++i) {
    const ScoreItem& item = items[static_cast<size_t>(i)];
    Json j = lineStart(begin + i, item);
    if (item.label) j["label"] = *item.label;
    const int64_t r = row[static_cast<size_t>(i)];
    if (r < 0) {
      j["error"] = item.error;
    } else {
      Json top = Json::array();
      for (int64_t k = 0; k < values.size(1); ++k) {
        const int64_t label = labels[r][k].item<int64_t>();
        top.push_back(Json{{"label", label},
                           {"name", info.className(label)},
                           {"probability", shortest(values[r][k].item<float>())}});
      }
      j["top"] = std::move(top);
    }
    out += j.dump() + "\n";
  }
  return out;
}

// The lines of token windows [begin, end): the mean next-token loss of each.
std::string scoreTokens(Predictor& predictor, ScoreData& data, int64_t begin, int64_t end) {
  const int64_t n = end - begin, window = predictor.info().blockSize + 1;
  at::Tensor tokens = torch::empty({n, window}, torch::kLong);
  std::vector<ScoreItem> items;
  for (int64_t i = 0; i < n; ++i) items.push_back(data.readTokens(begin + i, tokens.data_ptr<int64_t>() + i * window));
  const at::Tensor input = tokens.narrow(1, 0, window - 1).contiguous();
  const at::Tensor target = tokens.narrow(1, 1, window - 1);
  const at::Tensor logits = predictor.forward(input).to(torch::kFloat);
  const at::Tensor nll = -torch::log_softmax(logits, -1).gather(-1, target.unsqueeze(-1)).squeeze(-1);
  const at::Tensor loss = nll.mean(1).contiguous();
  std::string out;
  for (int64_t i = 0; i < n; ++i) {
    Json j = lineStart(begin + i, items[static_cast<size_t>(i)]);
    const float l = loss[i].item<float>();
    j["tokens"] = window - 1;
    j["loss"] = shortest(l);
    j["perplexity"] = shortest(static_cast<float>(std::exp(static_cast<double>(l))));
    out += j.dump() + "\n";
  }
  return out;
}

// COHORT_FAULT for a score rank: a "step" is a batch this process scored.
void maybeFault(int rank, int64_t batches) {
  static const std::optional<env::Fault> fault = env::fault();
  if (!fault || fault->rank != rank || fault->step != batches) return;
  if (!fault->everyAttempt && env::restartCount() > 0) return;
  log::flush();
  if (fault->action == env::Fault::Action::kill) {
    log::warn("COHORT_FAULT: killing this rank with SIGKILL after batch {}", batches);
    log::flush();
    ::raise(SIGKILL);
  }
  if (fault->action == env::Fault::Action::exit) {
    log::warn("COHORT_FAULT: exiting with code {} after batch {}", fault->exitCode, batches);
    log::flush();
    std::_Exit(fault->exitCode);
  }
  if (fault->action == env::Fault::Action::sleep) {
    log::warn("COHORT_FAULT: sleeping {} s after batch {}", fault->amount, batches);
    log::flush();
    std::this_thread::sleep_for(std::chrono::seconds(fault->amount));
  }
}

void scorePart(const ScoreOptions& o, const ScorePaths& paths) {
  const ScoreRecord record = readRecord(paths.record());
  if (o.rank >= record.procs) {
    throw UsageError(fmt::format("--rank {} is not below the run's {} procs", o.rank, record.procs));
  }
  const int threads = std::max(1, env::availableCores() / (record.procs * std::max(1, o.split)));
  at::set_num_threads(threads);
  at::set_num_interop_threads(1);
  const auto [begin, end] = record.parts[static_cast<size_t>(o.rank)];
  const int64_t kept = keptLines(paths.part(o.rank), begin, end - begin);
  log::info("samples {} to {}: {} already scored", begin, end - 1, kept);
  if (begin + kept >= end) return;

  std::unique_ptr<Predictor> predictor;
  if (o.split > 1) {
    // This rank holds no weights: its model is split across o.split
    // processes of its own, as `cohort serve --procs` splits it.
    SplitOptions so;
    so.procs = o.split;
    so.tensor = o.tensor;
    so.computeThreads = threads;
    predictor = openSplitPredictor(record.model, o.job, so);
  } else {
    predictor = openPredictor(record.model, o.job);
  }
  const std::unique_ptr<ScoreData> data = openScoreData(record.data, predictor->info(), o.storage);
  if (data->size() != record.samples) {
    throw DataError(fmt::format("{}: {} samples, the run started with {}", data->describe(), data->size(),
                                record.samples));
  }
  data->willRead(begin + kept, end);
  PartWriter part(paths.part(o.rank));
  int64_t batches = 0;
  auto lastLog = std::chrono::steady_clock::now();
  for (int64_t at = begin + kept; at < end;) {
    // Batches start at multiples of the run's --batch-size (the recorded
    // one, which the parts' boundaries are multiples of): the same batches
    // whatever the ranks and wherever a resumed part starts again.
    const int64_t stop = std::min(end, (at / record.batchSize + 1) * record.batchSize);
    part.append(data->tokens() ? scoreTokens(*predictor, *data, at, stop)
                               : scoreImages(*predictor, *data, at, stop, record.topK));
    at = stop;
    maybeFault(o.rank, ++batches);
    if (std::chrono::steady_clock::now() - lastLog > std::chrono::seconds(10)) {
      lastLog = std::chrono::steady_clock::now();
      log::info("{} of {} samples scored", at - begin, end - begin);
    }
  }
  log::info("done: {} samples scored in {} batches", end - begin - kept, batches);
}

}  // namespace

void runScoreRankAndExit(const ScoreOptions& o) {
  const ScorePaths paths{std::filesystem::absolute(o.out).lexically_normal().string()};
  // Everything this process prints goes to its log, LibTorch's warnings too.
  const int fd = ::open(paths.log(o.rank).c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
  }
  log::Options lo;
  lo.tag = fmt::format("score rank {}", o.rank);
  log::init(lo);
  int code = 0;
  try {
    scorePart(o, paths);
  } catch (const Error& e) {
    log::error("{}", e.what());
    code = e.exitCode() == 2 ? 2 : 1;
  } catch (const c10::Error& e) {
    log::error("{}", e.what_without_backtrace());
    code = 1;
  } catch (const std::exception& e) {
    log::error("{}", e.what());
    code = 1;
  }
  log::flush();
  std::fflush(stdout);
  std::fflush(stderr);
  // LibTorch's static destructors would only race its threads.
  std::_Exit(code);
}

}  // namespace cohort::serve::detail
