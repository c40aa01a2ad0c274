#pragma once

// Small trained run directories for the deploy tests (export, serve, score):
// each made by `cohort run` in a few steps, so the weights are a trained
// model's, not an initialization.

#include <gtest/gtest.h>

#include <string>

#include "util/process.h"

namespace cohort::test {

enum class DeployModel {
  cnn,          // simple_cnn with BatchNorm, synthetic 1x28x28, 4 classes, mean/std set
  resnet,       // resnet18, small_input stem, synthetic 3x32x32, 5 classes
  gpt,          // gpt (1 layer, block 16) on byte tokens of util/corpus.h
  llama,        // llama (1 layer, 4 heads on 2 key/value heads, block 16) on the same
  imageShards,  // simple_cnn on shards packed from makeImageFolder: 3 named classes, crop 32
};

// Trains `kind` into dir/<name of kind>/run and returns that run directory
// (fails the calling test through ASSERT-free FAIL() messages when a step fails).
std::string trainDeployRun(const TempDir& dir, DeployModel kind);

// An image folder: `perClass` JPEG and `perClass` PNG files in each of the
// class folders red/, green/ and blue/ (sizes 40x48 and 52x36 px, patterns
// that differ per file), written by Python's PIL. Returns `root`.
std::string makeImageFolder(const std::string& root, int perClass);

// A fixture whose suite trains the cnn, imageShards and gpt runs once, in
// one temporary directory, for every case of the program (cohort_test's
// WHOLE). Derived suites read cnn_, shards_, gpt_ and dir_.
class DeployRunsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();
  static TempDir* dir_;
  static std::string *cnn_, *shards_, *gpt_;
};

}  // namespace cohort::test
