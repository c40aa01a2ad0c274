// safetensors files (ckpt/safetensors.h) and the weights interface over both
// formats (ckpt/weights.h): round trips, and every kind of bad file refused
// with its name and the tensor. weights_interop_test checks the format
// against an independent reader and writer.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "cohort/ckpt/safetensors.h"
#include "cohort/ckpt/weights.h"
#include "cohort/core/error.h"
#include "util/errors.h"
#include "util/process.h"

namespace cohort::ckpt {
namespace {

ckpt::StateDict sample() {
  torch::manual_seed(5);
  return {{"f32", torch::randn({3, 5})},
          {"f64", torch::randn({4}, torch::kFloat64)},
          {"f16", torch::randn({2, 3}).to(torch::kHalf)},
          {"bf16", torch::randn({7}).to(torch::kBFloat16)},
          {"i64", torch::tensor(std::vector<int64_t>{int64_t{1} << 40, -3, 7})},
          {"i32", torch::randint(-1000, 1000, {2, 2}, torch::kInt)},
          {"i16", torch::randint(-1000, 1000, {5}, torch::kShort)},
          {"i8", torch::randint(-100, 100, {6}, torch::kChar)},
          {"u8", torch::randint(0, 255, {2, 4}, torch::kByte)},
          {"bool", torch::rand({9}) > 0.5},
          {"scalar", torch::tensor(2.5)},
          {"empty", torch::zeros({0, 4})}};
}

void expectSame(const StateDict& want, TensorSource& got) {
  ASSERT_EQ(got.entries().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const auto& [name, t] = want[i];
    EXPECT_EQ(got.entries()[i].first, name);
    const at::Tensor g = got.load(name);
    EXPECT_EQ(g.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(g.sizes(), t.sizes()) << name;
    EXPECT_TRUE(torch::equal(g, t)) << name;
    got.drop(name);
  }
}

// A file of `header` and `data` bytes, as the format lays them out.
std::string fileOf(const std::string& dir, const std::string& header, size_t data, uint64_t length = 0) {
  const std::string path = dir + "/bad.safetensors";
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = length > 0 ? length : header.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
  f << header << std::string(data, '\0');
  return path;
}

TEST(Safetensors, EveryDtypeAndShapeRoundTripsWithItsMetadataAndTheTiedNameLeftOut) {
  test::TempDir dir;
  StateDict dict = sample();
  dict.emplace_back("tied", dict[0].second);  // the same tensor: written once
  saveSafetensors(dict, dir.file("w.safetensors"), {{"note", "x"}});
  EXPECT_TRUE(isSafetensors(dir.file("w.safetensors")));
  SafetensorsFile file(dir.file("w.safetensors"));
  dict.pop_back();
  expectSame(dict, file);
  EXPECT_EQ(file.metadata().at("note"), "x");
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.metadata().at("tied"), "tied=f32");
  // The data starts 8-byte aligned, as other writers expect.
  std::ifstream in(dir.file("w.safetensors"), std::ios::binary);
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  EXPECT_EQ(len[0] % 8, 0);
}

TEST(Safetensors, OneInterfaceWritesAndReadsBothFormats) {
  test::TempDir dir;
  const StateDict dict = sample();
  for (WeightsFormat f : {WeightsFormat::pt, WeightsFormat::safetensors}) {
    const std::string path = dir.file(std::string("m") + weightsExtension(f));
    auto w = openWeightsWriter(path, f);
    for (auto it = dict.rbegin(); it != dict.rend(); ++it) w->add(it->first, it->second);
    std::vector<std::string> order;
    for (const auto& [name, t] : dict) order.push_back(name);
    w->finish(order);
    EXPECT_EQ(isSafetensors(path), f == WeightsFormat::safetensors);
    auto source = openWeights(path);
    expectSame(dict, *source);
  }
  // Nothing at the path without finish(); no scratch file is left.
  {
    auto w = openWeightsWriter(dir.file("unfinished.safetensors"), WeightsFormat::safetensors);
    w->add("x", torch::ones({2}));
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("unfinished.safetensors")));
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 2);
  // A damaged .safetensors is named as one, whatever its first bytes.
  test::writeText(dir.file("broken.safetensors"), std::string("\xff\xff\xff\xff\xff\xff\xff\x7f{}"));
  EXPECT_NE(test::errorOf<DataError>([&] { openWeights(dir.file("broken.safetensors")); }).find("does not fit"),
            std::string::npos);
  // A writer's tensors are all in the file, once each; a transpose of a
  // tensor is a tensor of its own, not an alias.
  {
    auto w = openWeightsWriter(dir.file("o.safetensors"), WeightsFormat::safetensors);
    w->add("a", torch::ones({2}));
    EXPECT_NE(test::errorOf<Error>([&] { w->add("a", torch::ones({2})); }).find("'a' added twice"), std::string::npos);
    w->add("b", torch::ones({2}));
    EXPECT_NE(test::errorOf<Error>([&] { w->finish({"a"}); }).find("'b' was added but is not in the order"),
              std::string::npos);
  }
  const at::Tensor square = torch::randn({3, 3});
  saveSafetensors({{"w", square}, {"wt", square.t()}}, dir.file("t.safetensors"));
  SafetensorsFile transposed(dir.file("t.safetensors"));
  ASSERT_EQ(transposed.entries().size(), 2u);
  EXPECT_TRUE(torch::equal(transposed.load("wt"), square.t()));
  // safetensors cannot be sealed.
  security::Key key{};
  EXPECT_NE(test::errorOf<ConfigError>([&] { openWeightsWriter(dir.file("k.safetensors"), WeightsFormat::safetensors, &key); })
                .find("cannot be encrypted"),
            std::string::npos);
}

TEST(Safetensors, BadFilesNameTheFileAndTheTensor) {
  test::TempDir dir;
  auto bad = [&](const std::string& header, size_t data, uint64_t length = 0) {
    const std::string path = fileOf(dir.path(), header, data, length);
    return test::errorOf<DataError>([&] { SafetensorsFile f(path); });
  };
  auto has = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos && text.find("bad.safetensors") != std::string::npos;
  };
  EXPECT_TRUE(has(bad("{}", 0, uint64_t{1} << 40), "does not fit")) << bad("{}", 0, uint64_t{1} << 40);
  EXPECT_TRUE(has(bad("[1, 2]", 0), "no JSON header"));
  EXPECT_TRUE(has(bad("{\"a\": 1", 0), "not a JSON object"));
  EXPECT_TRUE(has(bad(R"({"a": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}})", 1),
                  "tensor 'a': dtype F8_E4M3, which cohort does not handle"));
  EXPECT_TRUE(has(bad(R"({"a": {"dtype": "U32", "shape": [1], "data_offsets": [0, 4]}})", 4), "dtype U32"));
  EXPECT_TRUE(has(bad(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8),
                  "tensor 'a': shape [3] of F32 needs 12 bytes"));
  EXPECT_TRUE(has(bad(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4),
                  "outside the 4 bytes of data"));
  EXPECT_TRUE(has(bad(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                          "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                      12),
                  "overlap"));
  EXPECT_TRUE(has(bad(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8),
                  "belong to no tensor"));
  EXPECT_TRUE(has(bad(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 12),
                  "last 8 bytes of the data belong to no tensor"));
  EXPECT_TRUE(has(bad(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4), "not a count"));
  EXPECT_TRUE(has(bad(R"({"a": {"dtype": "F32", "shape": [1]}})", 4), "expected"));
  EXPECT_TRUE(has(bad(R"({"__metadata__": {"k": 1}})", 0), "__metadata__ 'k' is not a string"));
  EXPECT_TRUE(has(bad(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296],
                                "data_offsets": [0, 4]}})",
                      4),
                  "too large"));
  // Too short for a length; a PyTorch file is not one.
  test::writeText(dir.file("short.safetensors"), "abc");
  EXPECT_NE(test::errorOf<DataError>([&] { SafetensorsFile f(dir.file("short.safetensors")); }).find("too short"),
            std::string::npos);
  saveStateDict({{"w", torch::ones({2})}}, dir.file("w.pt"));
  EXPECT_FALSE(isSafetensors(dir.file("w.pt")));
  EXPECT_FALSE(isSafetensors(dir.file("missing")));
}

}  // namespace
}  // namespace cohort::ckpt
