#pragma once

// Training runs of the tiny job through the cohort binary, compared by
// their final weights.

#include <map>
#include <string>
#include <vector>

#include "cohort/ckpt/state_dict.h"
#include "util/process.h"

namespace cohort::test {

// Writes `yaml` to dir/<tag>.yaml and runs it (`cohort run`) with `procs`
// ranks into dir/<tag>, each of `overrides` passed as --set, then `extra`
// arguments (--resume PATH, say); `env` is added to the environment.
ProcessResult runJob(const TempDir& dir, const std::string& tag, const std::string& yaml, int procs,
                     const std::vector<std::string>& overrides,
                     const std::map<std::string, std::string>& env = {},
                     const std::vector<std::string>& extra = {});

// A small GPT (n_head 2, n_embd 10, block_size 12, `layers` blocks) on the
// token dataset at `tokens`, AdamW, 6 steps of 1 epoch, one thread per
// rank, logging every step: the language-model tests' job.
std::string tinyGptYaml(const std::string& name, const std::string& tokens, int layers);
// The same job around another model: `model` is the job's model: line's
// mapping ("{arch: llama, ...}").
std::string tinyTokenJobYaml(const std::string& name, const std::string& tokens, const std::string& model);

// A model's state dict by name.
std::map<std::string, at::Tensor> tensorsByName(const torch::nn::Module& model);

// Runs tinyJobYaml() with `procs` ranks into dir/<tag> with the given
// "key=value" overrides (each passed as --set) and returns model/final.pt.
// Records a test failure if the run does not exit 0. `env` is added to the
// environment of `cohort run` (and so of its ranks).
ckpt::StateDict trainTiny(const TempDir& dir, const std::string& tag, int procs,
                          const std::vector<std::string>& overrides,
                          const std::map<std::string, std::string>& env = {});

// The tensor named `name` in `d`; an undefined tensor when there is none.
at::Tensor tensorNamed(const ckpt::StateDict& d, const std::string& name);

// Largest absolute difference between same-named tensors (in double);
// records a failure if names, counts or shapes differ (infinity for a
// shape).
double maxDifference(const ckpt::StateDict& a, const ckpt::StateDict& b);

}  // namespace cohort::test
