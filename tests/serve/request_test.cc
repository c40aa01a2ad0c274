// The fast reader of /v1/predict bodies (json_pixels.h) against the general
// JSON parser: the bodies it reads give the same inputs, top-k and logits
// flag; the ones it leaves (other keys, "shape", exponents, leading zeros,
// a key given twice, sizes that do not fit) go to the general parser,
// whose answer or message parsePredict then gives.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "cohort/core/error.h"
#include "serve/detail/json_pixels.h"
#include "serve/detail/request.h"
#include "util/serve_info.h"

namespace cohort::serve::detail {
namespace {

ModelInfo grayModel() { return test::imageModelInfo(1, 2, 3, 4); }

PredictRequest viaParsePredict(const std::string& body) {
  return parsePredict(body, "application/json", std::nullopt, std::nullopt, grayModel(), 5, 8);
}

void expectSame(const PredictRequest& a, const PredictRequest& b, const std::string& body) {
  ASSERT_EQ(a.inputs.size(), b.inputs.size()) << body;
  for (size_t i = 0; i < a.inputs.size(); ++i) EXPECT_TRUE(torch::equal(a.inputs[i], b.inputs[i])) << body;
  EXPECT_EQ(a.topK, b.topK) << body;
  EXPECT_EQ(a.logits, b.logits) << body;
}

TEST(PredictJson, TheFastReaderGivesWhatTheGeneralParserGives) {
  for (const std::string body : {
           R"({"inputs": [[[0, 1, 2], [3, 4, 255]]]})",
           R"( { "logits" : true , "inputs":[ [ [0.5,1.25,2.0],[3.000001,4.1,254.99] ] ],"top_k":2 } )",
           "{\n\t\"inputs\": [[[[1, 2, 3], [4, 5, 6]]], [[[7, 8, 9], [10, 11, 12]]]]\r\n}",
           R"({"top_k": 1000000, "inputs": [[[0,0,0],[0,0,0]]], "logits": false})",
       }) {
    const auto scanned = scanPredictJson(body, 1, 2, 3, 8);
    ASSERT_TRUE(scanned.has_value()) << "the fast reader left " << body;
    expectSame(viaParsePredict(body), parsePredictJsonGeneral(body, grayModel(), 5, 8), body);
  }
  const auto two = scanPredictJson("{\"inputs\": [[[[1, 2, 3], [4, 5, 6]]], [[[7, 8, 9], [10, 11, 12]]]]}", 1, 2, 3, 8);
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->images, 2);
  EXPECT_EQ(two->pixels.back(), 12.0f);
}

TEST(PredictJson, WhatTheFastReaderLeavesTheGeneralParserAnswers) {
  // Accepted by the general parser only.
  for (const std::string body : {
           R"({"inputs": [0, 1, 2, 3, 4, 5], "shape": [1, 2, 3]})",
           R"({"inputs": [[[1e2, 1, 2], [3, 4, 5]]]})",
           R"({"inputs": [[[1, 1, 2], [3, 4, 5]]], "top_k": 1, "top_k": 3})",
       }) {
    EXPECT_FALSE(scanPredictJson(body, 1, 2, 3, 8).has_value()) << body;
    expectSame(viaParsePredict(body), parsePredictJsonGeneral(body, grayModel(), 5, 8), body);
  }
  // Refused by both, with the general parser's message.
  for (const auto& [body, message] : std::vector<std::pair<std::string, std::string>>{
           {R"({"inputs": [[[01, 1, 2], [3, 4, 5]]]})", "not valid JSON"},
           {R"({"inputs": [[[1, 1, 2], [3, 4, 256]]]})", "inputs[0][1][2]: a raw pixel must be in [0, 255]"},
           {R"({"inputs": [[[1, 1], [3, 4]]]})", "expected an array of 3 values"},
           {R"({"inputs": [[[1, 1, 2], [3, 4, 5]]], "top_k": 0})", "\"top_k\" must be in [1, 1000000]"},
           {R"({"inputs": [[[1, 1, 2], [3, 4, 5]]]} x)", "not valid JSON"},
           {R"({"inputs": [[[1, 1, 2], [3, 4, 5]]], "extra": 1})", "unknown key \"extra\""},
           {R"({"inputs": [[[[1, 1, 2], [3, 4, 5]]]]], "logits": 1})", "not valid JSON"},
       }) {
    EXPECT_FALSE(scanPredictJson(body, 1, 2, 3, 8).has_value()) << body;
    try {
      viaParsePredict(body);
      ADD_FAILURE() << "accepted: " << body;
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << body << ": " << e.what();
    }
  }
  // More images than a request may hold.
  std::string many = R"({"inputs": [)";
  for (int i = 0; i < 9; ++i) many += std::string(i ? "," : "") + "[[[1,2,3],[4,5,6]]]";
  many += "]}";
  EXPECT_FALSE(scanPredictJson(many, 1, 2, 3, 8).has_value());
  EXPECT_THROW(viaParsePredict(many), DataError);
}

}  // namespace
}  // namespace cohort::serve::detail
