#pragma once

// The commands that need LibTorch, which `cohort` hands to `cohort-torch`
// (common.h says why), with the descriptions both programs show.

#include <CLI/CLI.hpp>

#include <string>

namespace cohort::cli {

struct EngineCommand {
  const char* name;
  const char* description;
};

// Top-level commands.
inline constexpr EngineCommand kEngineCommands[] = {
    {"agent",
     "Elastic training: run this node's ranks in a job of MIN..MAX nodes that may lose and gain nodes "
     "(docs/elastic.md)"},
    {"worker", "Run one rank (started by `cohort run`, mpirun, srun or a torchrun-style launcher)"},
    {"health",
     "Measure matmul, memory, disk and allreduce speed on N local ranks against the health.* thresholds; "
     "exit 1 naming each failing rank and check"},
    {"generate", "Sample text from a trained language model (model.arch: gpt or llama)"},
    {"export", "Write a trained model as ONNX, TorchScript, safetensors or Hugging Face's GPT-2 layout for "
               "other runtimes"},
    {"serve", "Answer predictions over HTTP, batching requests that arrive together"},
    {"score", "Predict over a whole dataset, data-parallel, resumable"},
};

// Commands under `cohort ckpt`.
inline constexpr EngineCommand kEngineCkptCommands[] = {
    {"inspect", "Show what a checkpoint holds"},
    {"consolidate",
     "Write a checkpoint's model as one PyTorch state dict, whatever its ZeRO stage and world size (and "
     "its optimizer state in torch.optim's state_dict() layout)"},
};

// The description of engine command `name` (under `cohort ckpt` when `ckpt`).
const char* engineCommandDescription(const std::string& name, bool ckpt = false);

// Whether argv names a command of kEngineCommands or kEngineCkptCommands,
// or asks `help` about one of them.
bool needsEngine(int argc, char** argv);

// The engine commands as they show in the front end's help: a description,
// no options (they are never parsed there: needsEngine() comes first).
void addEngineStubs(CLI::App& app, CLI::App* ckpt);

// Replaces this process with cohort-torch and the same arguments; returns
// (127, after logging why) only when it cannot be run.
int execEngine(int argc, char** argv);

}  // namespace cohort::cli
