#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "cohort/ckpt/mapped_tensors.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/core/file.h"
#include "cohort/core/error.h"
#include "util/process.h"
#include "util/errors.h"

namespace cohort::ckpt {
namespace {

struct Tiny : torch::nn::Module {
  Tiny() {
    fc = register_module("fc", torch::nn::Linear(3, 2));
    bn = register_module("bn", torch::nn::BatchNorm1d(2));
  }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

TEST(StateDict, OrderFollowsPyTorch) {
  Tiny m;
  std::vector<std::string> names;
  for (const auto& [n, t] : stateDict(m)) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"fc.weight", "fc.bias", "bn.weight", "bn.bias",
                                             "bn.running_mean", "bn.running_var",
                                             "bn.num_batches_tracked"}));
}

TEST(StateDict, SaveAndReadRoundTrip) {
  test::TempDir dir;
  at::Tensor big = torch::randn({4, 6});
  StateDict in = {{"a", torch::randn({2, 3})},
                  {"view", big.t()},  // non-contiguous
                  {"count", torch::tensor(7, torch::kLong)},
                  {"half", torch::ones({5}, torch::kHalf)},
                  {"flags", torch::tensor({true, false})},
                  {"empty", torch::zeros({0, 3})}};
  saveStateDict(in, dir.file("x.pt"));
  StateDict out = readStateDict(dir.file("x.pt"));
  ASSERT_EQ(out.size(), in.size());
  for (size_t k = 0; k < in.size(); ++k) {
    EXPECT_EQ(out[k].first, in[k].first);
    EXPECT_EQ(out[k].second.scalar_type(), in[k].second.scalar_type()) << in[k].first;
    EXPECT_TRUE(torch::equal(out[k].second, in[k].second)) << in[k].first;
  }
}

// Tensor by tensor, in the order asked at the end, a second name sharing
// one storage: what saveStateDict writes, read back the same way.
TEST(StateDict, WrittenTensorByTensorReadsBackAsSaved) {
  test::TempDir dir;
  at::Tensor big = torch::randn({4, 6});
  const StateDict in = {{"a", torch::randn({2, 3})},
                        {"view", big.t()},
                        {"count", torch::tensor(7, torch::kLong)},
                        {"half", torch::ones({5}, torch::kHalf)},
                        {"empty", torch::zeros({0, 3})}};
  {
    StateDictWriter w(dir.file("s.pt"));
    for (auto k = in.rbegin(); k != in.rend(); ++k) w.add(k->first, k->second);
    w.alias("a2", "a");
    EXPECT_FALSE(std::filesystem::exists(dir.file("s.pt"))) << "visible before finish()";
    w.finish({"a", "a2", "view", "count", "half", "empty"});
  }
  const StateDict out = readStateDict(dir.file("s.pt"));
  ASSERT_EQ(out.size(), in.size() + 1);
  EXPECT_EQ(out[1].first, "a2");
  EXPECT_TRUE(torch::equal(out[1].second, in[0].second));
  for (size_t k = 0; k < in.size(); ++k) {
    const auto& got = out[k == 0 ? 0 : k + 1];
    EXPECT_EQ(got.first, in[k].first);
    EXPECT_EQ(got.second.scalar_type(), in[k].second.scalar_type()) << in[k].first;
    EXPECT_TRUE(torch::equal(got.second, in[k].second)) << in[k].first;
  }
  // Abandoned (no finish): nothing at the path, no temporary file left.
  {
    StateDictWriter w(dir.file("gone.pt"));
    w.add("a", torch::ones({3}));
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("gone.pt")));
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().rfind(".tmp.", 0), std::string::npos) << e.path();
  }
  // A name in the order that was never added, or a dtype PyTorch's format has no storage for.
  StateDictWriter bad(dir.file("bad.pt"));
  bad.add("a", torch::ones({2}));
  EXPECT_THROW(bad.finish({"b"}), Error);
  EXPECT_THROW(bad.add("c", torch::ones({2}, torch::kComplexFloat)), Error);
}

// A process that had this pid (a restarted container reuses them) and ended
// before its commit left temporary files under the names this one picks:
// they are replaced, not an error.
TEST(StateDict, AnAtomicWriteReplacesTheTemporaryFileOfAnEndedProcess) {
  test::TempDir dir;
  for (int n = 0; n < 2000; ++n) test::writeText(dir.file(fmt::format(".tmp.x.json.{}.{}", ::getpid(), n)), "stale");
  writeFileAtomic(dir.file("x.json"), std::string("fresh"));
  EXPECT_EQ(test::readText(dir.file("x.json")), "fresh");
}

// Read lazily: names and shapes at once, each tensor's data when asked,
// given back when dropped; the values are readStateDict's.
TEST(StateDict, ReadLazilyEachTensorsDataComesWhenAsked) {
  test::TempDir dir;
  const at::Tensor big = torch::randn({4, 6});
  const StateDict in = {{"a", torch::randn({2, 3})}, {"view", big.t()}, {"n", torch::tensor(int64_t{5})}};
  saveStateDict(in, dir.file("x.pt"));
  LazyStateDict lazy(dir.file("x.pt"));
  ASSERT_EQ(lazy.entries().size(), in.size());
  for (size_t k = 0; k < in.size(); ++k) {
    EXPECT_EQ(lazy.entries()[k].first, in[k].first);
    EXPECT_EQ(lazy.entries()[k].second.sizes(), in[k].second.sizes());
    EXPECT_EQ(lazy.entries()[k].second.storage().data_ptr().get(), nullptr) << "read before asked";
  }
  for (const auto& [name, t] : in) {
    EXPECT_TRUE(torch::equal(lazy.load(name), t)) << name;
    lazy.drop(name);
    EXPECT_EQ(lazy.entries().front().second.storage().data_ptr().get(), nullptr);
  }
  EXPECT_THROW(lazy.load("missing"), DataError);
}

// A LazyStateDict that counts the tensors loaded and not yet dropped.
struct Counting : TensorSource {
  explicit Counting(const std::string& path) : lazy(path) {}
  const StateDict& entries() const override { return lazy.entries(); }
  at::Tensor load(const std::string& name) override {
    ++loads;
    maxHeld = std::max(maxHeld, ++held);
    return lazy.load(name);
  }
  void drop(const std::string& name) override {
    --held;
    lazy.drop(name);
  }
  LazyStateDict lazy;
  int held = 0, maxHeld = 0, loads = 0;
};

// Loaded from a TensorSource (model.init_from, a checkpoint): checked whole
// before any read, then one tensor read, copied and dropped at a time.
TEST(StateDict, LoadedFromASourceOneTensorAtATime) {
  test::TempDir dir;
  Tiny from;
  saveStateDict(stateDict(from), dir.file("x.pt"));
  Tiny into;
  {
    Counting source(dir.file("x.pt"));
    loadStateDict(stateDict(into), source, source.entries(), dir.file("x.pt"));
    EXPECT_EQ(source.maxHeld, 1);
    EXPECT_EQ(source.held, 0);
  }
  for (const auto& entry : stateDict(from)) {
    const std::string& name = entry.first;
    auto got = stateDict(into);
    const auto it = std::find_if(got.begin(), got.end(), [&](const auto& e) { return e.first == name; });
    ASSERT_NE(it, got.end()) << name;
    EXPECT_TRUE(torch::equal(it->second, entry.second)) << name;
  }
  // A tensor the model does not have: refused before anything is read.
  StateDict extra = stateDict(from);
  extra.emplace_back("fc.extra", torch::ones({2}));
  saveStateDict(extra, dir.file("extra.pt"));
  Counting bad(dir.file("extra.pt"));
  const std::string error =
      test::errorOf<DataError>([&] { loadStateDict(stateDict(into), bad, bad.entries(), dir.file("extra.pt")); });
  EXPECT_NE(error.find(dir.file("extra.pt") + ": unexpected tensor 'fc.extra'"), std::string::npos) << error;
  EXPECT_EQ(bad.loads, 0);
}

// Spilled and mapped (an export of a model no process holds): each tensor
// read, converted and dropped before the next is read; the views hold the
// values, also after release() gave their pages back; the file has no name.
TEST(StateDict, MappedTensorsReadOneAtATimeAndHoldTheValues) {
  test::TempDir dir;
  const StateDict in = {{"a", torch::randn({300, 7})},
                        {"b", torch::randn({5}, torch::kDouble)},
                        {"n", torch::tensor(int64_t{5})},
                        {"empty", torch::zeros({0, 3})},
                        {"big", torch::randn({4096 * 3 + 5})}};
  saveStateDict(in, dir.file("x.pt"));
  Counting source(dir.file("x.pt"));
  const auto toFloat = [](const at::Tensor& t) { return t.is_floating_point() ? t.to(torch::kFloat) : t; };
  MappedTensors mapped(source, {"a", "b", "n", "empty", "big"}, dir.file("spill"), toFloat);
  EXPECT_EQ(source.held, 0);
  EXPECT_EQ(source.maxHeld, 1);
  ASSERT_EQ(mapped.tensors().size(), in.size());
  for (const auto& [name, t] : in) {
    const at::Tensor& got = mapped.tensors().at(name);
    EXPECT_TRUE(torch::equal(got, toFloat(t))) << name;
  }
  const at::Tensor& big = mapped.tensors().at("big");
  mapped.release(big.data_ptr(), big.nbytes());
  mapped.release(in[0].second.data_ptr(), in[0].second.nbytes());  // outside the map: ignored
  EXPECT_TRUE(torch::equal(big, in[4].second)) << "read again from the file";
  EXPECT_TRUE(std::filesystem::is_empty(dir.file("spill")));
  EXPECT_THROW(MappedTensors(source, {"missing"}, dir.file("spill"), toFloat), DataError);
}

TEST(StateDict, LoadIsStrictAndNamesTheTensor) {
  test::TempDir dir;
  Tiny a, b;
  {
    torch::NoGradGuard g;
    a.fc->weight.fill_(0.5);
  }
  loadStateDict(b, stateDict(a), "mem");
  EXPECT_TRUE(torch::equal(b.fc->weight, a.fc->weight));

  StateDict missing = stateDict(a);
  missing.erase(missing.begin() + 1);
  EXPECT_EQ(test::errorOf<DataError>([&] { loadStateDict(b, missing, "w.pt"); }),
            "w.pt: missing tensor 'fc.bias' (shape [2]) that the model needs");

  StateDict extra = stateDict(a);
  extra.emplace_back("head.weight", torch::zeros({2, 2}));
  EXPECT_EQ(test::errorOf<DataError>([&] { loadStateDict(b, extra, "w.pt"); }),
            "w.pt: unexpected tensor 'head.weight' (shape [2, 2]): the model has no such "
            "parameter or buffer");

  StateDict wrong = stateDict(a);
  wrong[0].second = torch::zeros({2, 4});
  EXPECT_EQ(test::errorOf<DataError>([&] { loadStateDict(b, wrong, "w.pt"); }),
            "w.pt: tensor 'fc.weight' has shape [2, 4], the model expects [2, 3]");
}

TEST(StateDict, RejectsFilesThatAreNotStateDicts) {
  test::TempDir dir;
  test::writeText(dir.file("text.pt"), "just some text");
  EXPECT_NE(test::errorOf<DataError>([&] { readStateDict(dir.file("text.pt")); }).find("not a zip-format PyTorch file"),
            std::string::npos);
  EXPECT_NE(test::errorOf<DataError>([&] { readStateDict(dir.file("missing.pt")); }).find("cannot open"),
            std::string::npos);

  // A pickle that would call os.system("ls") in Python.
  static const char kEvil[] =
      "\x80\x02" "cos\nsystem\nq\x00" "X\x02\x00\x00\x00" "lsq\x01\x85q\x02Rq\x03.";
  const std::string evil(kEvil, sizeof kEvil - 1);
  {
    caffe2::serialize::PyTorchStreamWriter w(dir.file("evil.pt"));
    w.writeRecord("data.pkl", evil.data(), evil.size());
    w.writeEndOfFile();
  }
  EXPECT_NE(test::errorOf<DataError>([&] { readStateDict(dir.file("evil.pt")); }).find("refusing Python object 'os.system'"),
            std::string::npos);

  // Hostile shapes: a list nested 300,000 levels deep, a list holding itself.
  auto writePickle = [&](const std::string& name, const std::string& pickle) {
    caffe2::serialize::PyTorchStreamWriter w(dir.file(name));
    w.writeRecord("data.pkl", pickle.data(), pickle.size());
    w.writeEndOfFile();
  };
  writePickle("deep.pt", std::string("\x80\x02") + std::string(300000, ']') +
                             std::string(299999, 'a') + ".");
  EXPECT_NE(test::errorOf<DataError>([&] { readStateDict(dir.file("deep.pt")); }).find("not a state dict"),
            std::string::npos);
  writePickle("deep-bad.pt", std::string("\x80\x02") + std::string(300000, ']') + "\xff");
  EXPECT_NE(test::errorOf<DataError>([&] { readStateDict(dir.file("deep-bad.pt")); }).find("unsupported pickle opcode"),
            std::string::npos);
  static const char kCycle[] = "\x80\x02" "]q\x00" "h\x00" "a.";
  writePickle("cycle.pt", std::string(kCycle, sizeof kCycle - 1));
  EXPECT_NE(test::errorOf<DataError>([&] { readStateDict(dir.file("cycle.pt")); }).find("holds itself (a cycle)"),
            std::string::npos);

  // Truncated archive.
  StateDict in = {{"a", torch::randn({100})}};
  saveStateDict(in, dir.file("ok.pt"));
  std::string bytes = test::readText(dir.file("ok.pt"));
  test::writeText(dir.file("cut.pt"), bytes.substr(0, bytes.size() / 2));
  EXPECT_NE(test::errorOf<DataError>([&] { readStateDict(dir.file("cut.pt")); }).find(dir.file("cut.pt")),
            std::string::npos);
}

}  // namespace
}  // namespace cohort::ckpt
