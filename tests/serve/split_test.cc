// A language model served split across local ranks (`cohort serve --procs
// N`, openSplitPredictor): real rank processes on small trained gpt and
// llama runs. The logits of forward() and of decode() (ragged rows, fresh
// and ended sequences) of pipeline stages, and forward() over a tensor
// group (--tensor), equal the whole model's within 1e-4; a split server
// answers /v1/generate with the whole model's greedy text and stops on
// SIGTERM with its ranks; a rank killed makes the server exit 1 naming it;
// --procs outside 1..n_layer exits 2 naming the option. With per-rank
// memory cgroups (root only, skipped otherwise) a model whose weights pass
// each rank's limit answers. `cohort generate --procs N` prints the whole
// model's text.

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <torch/torch.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/models/model.h"
#include "cohort/serve/model.h"
#include "util/cgroup.h"
#include "util/corpus.h"
#include "util/jobs.h"
#include "util/process.h"
#include "util/runs.h"
#include "util/skip.h"

// A namespace of its own: the test program is a unity build.
namespace cohort {
namespace split_test {

using nlohmann::json;

const char* kGpt = "{arch: gpt, n_layer: 3, n_head: 2, n_embd: 32, block_size: 16}";
const char* kLlama =
    "{arch: llama, n_layer: 3, n_head: 4, n_kv_head: 2, n_embd: 32, intermediate_size: 48, block_size: 16}";

// Tokenizes the corpus into dir/tok (once per directory).
std::string tokens(const test::TempDir& dir) {
  const std::string out = dir.file("tok");
  if (std::filesystem::exists(out)) return out + "/train";
  test::writeText(dir.file("corpus.txt"), test::corpus(3'000));
  auto r = test::cohort({"data", "tokenize", dir.file("corpus.txt"), out, "--no-progress"});
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  return out + "/train";
}

std::string train(const test::TempDir& dir, const std::string& tag, const std::string& model,
                  const std::vector<std::string>& overrides = {}) {
  auto r = test::runJob(dir, tag, test::tinyTokenJobYaml(tag, tokens(dir), model), 1, overrides);
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  return dir.file(tag);
}

double maxDiff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

// The front's children that are ranks of a split model (not its fork
// server), by their command lines.
std::vector<pid_t> ranksOf(const test::Process& front) {
  std::vector<pid_t> out;
  for (pid_t pid : front.children()) {
    std::string cmdline = test::readText(fmt::format("/proc/{}/cmdline", pid));
    if (cmdline.find(std::string("--split-rank") + '\0') != std::string::npos) out.push_back(pid);
  }
  return out;
}

// `cohort serve` on a free port; port() once it listens.
struct Server {
  test::TempDir dir;
  std::unique_ptr<test::Process> process;
  int port = -1;
  explicit Server(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {}) {
    std::vector<std::string> argv = {test::cohortBin(), "serve"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--port", "0", "--port-file", dir.file("port")});
    process = std::make_unique<test::Process>(argv, env);
    port = test::waitForPortFile(dir.file("port"));
  }
  // /v1/generate, greedy: the reply's status and body.
  std::pair<int, json> generate(const std::string& prompt, int tokens) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    const json body = {{"prompt", prompt}, {"max_tokens", tokens}, {"temperature", 0}};
    auto res = c.Post("/v1/generate", body.dump(), "application/json");
    if (!res) return {-1, json()};
    return {res->status, json::parse(res->body, nullptr, false)};
  }
};

class SplitServe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    gpt_ = new std::string(train(*dir_, "gpt", kGpt));
    llama_ = new std::string(train(*dir_, "llama", kLlama));
  }
  static void TearDownTestSuite() {
    delete gpt_;
    delete llama_;
    delete dir_;
  }

  static serve::SplitOptions split(int procs) {
    serve::SplitOptions o;
    o.procs = procs;
    o.exe = test::cohortBin();
    o.timeout = std::chrono::seconds(120);
    return o;
  }

  // forward() and a generation's decode() steps through the split model
  // and the whole one: the same logits within 1e-4.
  static void expectSameLogits(const std::string& run, int procs) {
    const auto whole = serve::openPredictor(run);
    const auto parts = serve::openSplitPredictor(run, "", split(procs));
    ASSERT_TRUE(parts->decodes());
    EXPECT_EQ(parts->info().vocabSize, whole->info().vocabSize);
    torch::manual_seed(3);
    const int64_t vocab = whole->info().vocabSize;
    const at::Tensor batch = torch::randint(vocab, {3, 11}, torch::kLong);
    EXPECT_LT(maxDiff(parts->forward(batch), whole->forward(batch)), 1e-4);

    // Two sequences of other lengths, then both at once (ragged rows), one
    // ended and a new one started in its place.
    models::KvCache wa, wb, sa, sb;
    auto step = [&](const std::vector<at::Tensor>& rows, std::vector<models::KvCache*> w,
                    std::vector<models::KvCache*> s) {
      const at::Tensor a = whole->decode(rows, w), b = parts->decode(rows, s);
      EXPECT_LT(maxDiff(b, a), 1e-4);
      for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(s[i]->length, w[i]->length);
    };
    const at::Tensor t = torch::randint(vocab, {16}, torch::kLong);
    step({t.narrow(0, 0, 5)}, {&wa}, {&sa});
    step({t.narrow(0, 5, 3)}, {&wb}, {&sb});
    for (int i = 0; i < 4; ++i) step({t.narrow(0, 8 + i, 1), t.narrow(0, i, 2 - i % 2)}, {&wa, &wb}, {&sa, &sb});
    parts->endSequence(sb);
    wb.clear();
    models::KvCache sc;
    step({t.narrow(0, 2, 4), t.narrow(0, 12, 1)}, {&wb, &wa}, {&sc, &sa});
    sa.clear();  // a context shift: the same cache starts again
    wa.clear();
    step({t.narrow(0, 1, 6)}, {&wa}, {&sa});
  }

  // forward() of the model split over a tensor group (--tensor): the whole
  // model's logits within 1e-4.
  static void expectSameTensorLogits(const std::string& run, int procs) {
    const auto whole = serve::openPredictor(run);
    serve::SplitOptions o = split(procs);
    o.tensor = true;
    const auto parts = serve::openSplitPredictor(run, "", o);
    EXPECT_FALSE(parts->decodes());
    torch::manual_seed(5);
    for (const auto& shape : {std::vector<int64_t>{2, 9}, std::vector<int64_t>{1, 16}}) {
      const at::Tensor batch = torch::randint(whole->info().vocabSize, shape, torch::kLong);
      EXPECT_LT(maxDiff(parts->forward(batch), whole->forward(batch)), 1e-4);
    }
  }

  static test::TempDir* dir_;
  static std::string *gpt_, *llama_;
};

test::TempDir* SplitServe::dir_ = nullptr;
std::string* SplitServe::gpt_ = nullptr;
std::string* SplitServe::llama_ = nullptr;

TEST_F(SplitServe, GptOnTwoAndThreeStagesGivesTheWholeModelsLogits) {
  expectSameLogits(*gpt_, 2);
  expectSameLogits(*gpt_, 3);
}

TEST_F(SplitServe, LlamaOnTwoStagesGivesTheWholeModelsLogits) { expectSameLogits(*llama_, 2); }

TEST_F(SplitServe, GptAndLlamaOverATensorGroupOfTwoGiveTheWholeModelsLogits) {
  expectSameTensorLogits(*gpt_, 2);
  expectSameTensorLogits(*llama_, 2);
}

TEST_F(SplitServe, ServesTheWholeModelsGreedyTextAndStopsWithItsRanksOnSigterm) {
  for (const auto& [run, tensor] : {std::pair{gpt_, false}, std::pair{llama_, false}, std::pair{gpt_, true}}) {
    Server whole({*run});
    std::vector<std::string> args = {*run, "--procs", "2"};
    if (tensor) args.push_back("--tensor");
    Server parts(args);
    ASSERT_GT(whole.port, 0) << whole.process->stderrSoFar();
    ASSERT_GT(parts.port, 0) << parts.process->stderrSoFar();
    for (const char* prompt : {"The ", "Once upon a"}) {
      const auto [ws, wj] = whole.generate(prompt, 12);
      const auto [ps, pj] = parts.generate(prompt, 12);
      ASSERT_EQ(ws, 200) << wj.dump();
      ASSERT_EQ(ps, 200) << pj.dump() << parts.process->stderrSoFar();
      EXPECT_EQ(pj["tokens"], wj["tokens"]);
      EXPECT_EQ(pj["text"], wj["text"]);
    }
    const std::vector<pid_t> ranks = ranksOf(*parts.process);
    EXPECT_EQ(ranks.size(), 2u);
    parts.process->signal(SIGTERM);
    const auto r = parts.process->wait(std::chrono::seconds(60));
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    for (pid_t pid : ranks) EXPECT_NE(::kill(pid, 0), 0) << "rank pid " << pid << " still runs";
  }
}

// 24 tokens after a prompt of 9 pass block_size 16: the window shifts, and
// the split model's caches start again.
TEST_F(SplitServe, GenerateWithProcsPrintsTheWholeModelsText) {
  for (const std::string* run : {gpt_, llama_}) {
    // Sampled (temperature 1, a seed): the draws follow the logits closely.
    const std::vector<std::string> base = {"generate", *run, "--prompt", "Once upon", "--tokens",
                                           "24",       "--temperature", "1", "--seed", "3"};
    const auto whole = test::cohort(base);
    ASSERT_EQ(whole.exitCode, 0) << whole.describe();
    for (const std::vector<std::string>& extra :
         {std::vector<std::string>{"--procs", "2"}, {"--procs", "3"}, {"--procs", "2", "--tensor"}}) {
      std::vector<std::string> args = base;
      args.insert(args.end(), extra.begin(), extra.end());
      const auto split = test::cohort(args);
      EXPECT_EQ(split.exitCode, 0) << split.describe();
      EXPECT_EQ(split.out, whole.out) << fmt::format("{}", fmt::join(extra, " "));
    }
  }
}

// In-process: the forward after a rank's death fails (HTTP answers it 500),
// and so does every later one, naming the rank once the front has reaped it.
TEST_F(SplitServe, ARankKilledFailsTheCallsAfterIt) {
  const auto parts = serve::openSplitPredictor(*gpt_, "", split(2));
  const at::Tensor batch = torch::zeros({1, 4}, torch::kLong);
  ASSERT_NO_THROW(parts->forward(batch));
  std::vector<pid_t> ranks;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream in(task.path() / "children");
    for (pid_t pid; in >> pid;) {
      const std::string cmdline = test::readText(fmt::format("/proc/{}/cmdline", pid));
      if (cmdline.find(std::string("--split-rank") + '\0' + "1") != std::string::npos) ranks.push_back(pid);
    }
  }
  ASSERT_EQ(ranks.size(), 1u);
  ASSERT_EQ(::kill(ranks[0], SIGKILL), 0);
  EXPECT_THROW(parts->forward(batch), Error);
  ASSERT_TRUE(test::waitUntil([&] { return !parts->broken().empty(); }, std::chrono::seconds(30)));
  try {
    parts->forward(batch);
    ADD_FAILURE() << "a forward after a rank's death answered";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot answer"), std::string::npos) << e.what();
  }
}

TEST_F(SplitServe, ARankKilledMakesTheServerExit1NamingIt) {
  Server parts({*gpt_, "--procs", "2"});
  ASSERT_GT(parts.port, 0) << parts.process->stderrSoFar();
  ASSERT_EQ(parts.generate("a", 2).first, 200);
  std::vector<pid_t> ranks = ranksOf(*parts.process);
  ASSERT_EQ(ranks.size(), 2u) << parts.process->stderrSoFar();
  ::kill(ranks[1], SIGKILL);
  const auto r = parts.process->wait(std::chrono::seconds(60));
  EXPECT_EQ(r.exitCode, 1) << r.describe();
  EXPECT_NE(r.err.find("rank 1 of the split model was killed by signal 9"), std::string::npos)
      << r.describe();
  for (pid_t pid : ranks) EXPECT_NE(::kill(pid, 0), 0) << "rank pid " << pid << " still runs";
}

TEST_F(SplitServe, ProcsOutsideOneToTheBlocksExits2NamingTheOption) {
  for (const char* procs : {"0", "4"}) {
    auto r = test::cohort({"serve", *gpt_, "--procs", procs, "--port", "0"});
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_NE(r.err.find(fmt::format("--procs {}", procs)), std::string::npos) << r.describe();
  }
  auto r = test::cohort({"serve", *gpt_, "--procs", "4", "--port", "0"});
  EXPECT_NE(r.err.find("expected 1 to 3"), std::string::npos) << r.describe();
  // n_head 2 does not split over 3 ranks.
  r = test::cohort({"serve", *gpt_, "--procs", "3", "--tensor", "--port", "0"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("--procs 3 --tensor"), std::string::npos) << r.describe();
}

// cohort score --split N: each score rank's model split across N
// processes of its own; the same losses as the whole model's score within
// 1e-4, pipeline stages (gpt, 2 score ranks) and tensor parallel (llama).
TEST_F(SplitServe, ScoreWithSplitGivesTheWholeModelsLosses) {
  const std::string data = dir_->file("tok") + "/train";
  for (const auto& [run, extra] :
       {std::pair<const std::string*, std::vector<std::string>>{gpt_, {"--split", "2", "--procs", "2"}},
        {llama_, {"--split", "2", "--tensor"}}}) {
    const std::string tag = std::filesystem::path(*run).filename().string();
    const std::string whole = dir_->file(tag + "-whole.jsonl"), split = dir_->file(tag + "-split.jsonl");
    auto r = test::cohort({"score", *run, "--data", data, "--out", whole, "--batch-size", "4"});
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    std::vector<std::string> args = {"score", *run, "--data", data, "--out", split, "--batch-size", "4"};
    args.insert(args.end(), extra.begin(), extra.end());
    r = test::cohort(args);
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    // The score rank held no weights: its model was split (its log says so,
    // and the split ranks' lines, which write to it, what each loaded).
    const std::string log = test::readText(split + ".run/rank-0.log");
    EXPECT_NE(log.find("split across 2 ranks"), std::string::npos) << log;
    EXPECT_NE(log.find("split rank 1:"), std::string::npos) << log;
    const auto a = test::readJsonLines(whole), b = test::readJsonLines(split);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_GE(a.size(), 2u);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i]["index"], b[i]["index"]);
      EXPECT_NEAR(a[i]["loss"].get<double>(), b[i]["loss"].get<double>(), 1e-4) << tag << " line " << i;
    }
  }
  // Bad input, before any rank starts: exit 2 naming the option.
  auto r = test::cohort({"score", *gpt_, "--data", data, "--out", dir_->file("bad.jsonl"), "--split", "0"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("--split"), std::string::npos) << r.describe();
  r = test::cohort({"score", *gpt_, "--data", data, "--out", dir_->file("bad.jsonl"), "--tensor"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("--tensor"), std::string::npos) << r.describe();
}

// 8 blocks of n_embd 1536 over the byte vocabulary: 227M parameters, 866
// MiB of float32 weights; each of 2 ranks is limited to 85% of that (its
// half, LibTorch and the tensor being read are below it).
TEST(SplitServeMemory, EachRankUnderALimitBelowTheWholeModelsWeightsAnswers) {
  std::vector<std::unique_ptr<test::MemoryCgroup>> groups;
  for (int r = 0; r < 2; ++r) {
    groups.push_back(std::make_unique<test::MemoryCgroup>(fmt::format("split{}", r)));
    if (!groups.back()->unavailable().empty()) COHORT_SKIP(groups.back()->unavailable());
  }
  test::TempDir dir;
  const std::string run = train(dir, "big", "{arch: gpt, n_layer: 8, n_head: 8, n_embd: 1536, block_size: 16}",
                                {"training.max_steps=1", "training.batch_size=1", "checkpoint.every_epochs=0",
                                 "compute.allocator=map"});
  const auto weights = std::filesystem::file_size(run + "/model/final.pt");
  const auto limit = static_cast<int64_t>(static_cast<double>(weights) * 0.85);
  for (auto& g : groups) g->setLimit(limit);
  std::string pattern = groups[0]->path(), second = pattern;
  pattern.replace(pattern.rfind("split0"), 6, "split{rank}");
  second.replace(second.rfind("split0"), 6, "split1");
  ASSERT_EQ(groups[1]->path(), second);
  Server parts({run, "--procs", "2"}, {{"COHORT_SERVE_RANK_CGROUP", pattern}});
  ASSERT_GT(parts.port, 0) << parts.process->stderrSoFar();
  const auto [status, body] = parts.generate("The ", 4);
  EXPECT_EQ(status, 200) << body.dump() << parts.process->stderrSoFar();
  EXPECT_EQ(body["tokens"].size(), 4u) << body.dump();
  const std::string log = parts.process->stderrSoFar();
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(log.find(fmt::format("split rank {}: in cgroup {}", r, groups[static_cast<size_t>(r)]->path())),
              std::string::npos)
        << log;
  }
  std::printf("whole model's weights %.0f MiB; each rank limited to %.0f MiB\n", weights / 1048576.0,
              limit / 1048576.0);
  parts.process->signal(SIGTERM);
  EXPECT_EQ(parts.process->wait(std::chrono::seconds(60)).exitCode, 0);
  for (size_t r = 0; r < groups.size(); ++r) {  // cgroup v1 and v2 name the peak differently
    for (const char* name : {"/memory.max_usage_in_bytes", "/memory.peak"}) {
      if (!std::filesystem::exists(groups[r]->path() + name)) continue;
      const double peak = std::stod(test::readText(groups[r]->path() + name));
      EXPECT_LT(peak, static_cast<double>(limit));
      std::printf("rank %zu peak %.0f MiB\n", r, peak / 1048576.0);
    }
  }
  // The limit bites: the whole model (`cohort generate`) does not load under it.
  const auto whole = test::run(groups[0]->wrap({test::cohortBin(), "generate", run, "--tokens", "1"}));
  EXPECT_EQ(whole.signal, SIGKILL) << whole.describe();  // by the kernel, out of memory
}

}  // namespace split_test
}  // namespace cohort
