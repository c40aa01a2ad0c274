#pragma once

// The run directory: everything one run produced, in one place.
//
//   job.yaml            the resolved job, every default filled in
//   logs/rank-<r>.log   one log per rank (logs/launcher.log for the launcher)
//   metrics.jsonl       train and eval records
//   model/final.pt      trained weights (a PyTorch state dict; with
//                       output.weights_format safetensors model/final.safetensors)
//   model/adapters.pt   model.lora: the adapters (model/base.pt: the frozen
//                       weights, when they are not model.init_from's)
//   summary.json        the outcome

#include <string>

namespace cohort {

struct RunDir {
  std::string root;

  std::string jobFile() const { return root + "/job.yaml"; }
  std::string logsDir() const { return root + "/logs"; }
  std::string rankLog(int rank) const { return logsDir() + "/rank-" + std::to_string(rank) + ".log"; }
  std::string launcherLog() const { return logsDir() + "/launcher.log"; }
  std::string metrics() const { return root + "/metrics.jsonl"; }
  std::string modelDir() const { return root + "/model"; }
  std::string finalModel() const { return modelDir() + "/final.pt"; }
  std::string finalSafetensors() const { return modelDir() + "/final.safetensors"; }
  // The trained weights as the run wrote them: finalSafetensors() or
  // finalModel(), whichever exists (the newer when both do).
  std::string finalWeights() const;
  std::string adapters() const { return modelDir() + "/adapters.pt"; }  // model.lora
  // model.lora without model.init_from: the frozen random weights the
  // adapters train beside, written when training starts.
  std::string frozenBase() const { return modelDir() + "/base.pt"; }
  std::string summary() const { return root + "/summary.json"; }
  // `cohort run --plan`: the prediction of `cohort plan --json`, compared in summary.json.
  std::string plan() const { return root + "/plan.json"; }
};

// Creates `<outputDir>/<jobName>-<UTC time>` (with a numeric suffix if it
// exists already) and its logs/ and model/ folders; the job's output.dir and
// name. Throws IoError.
RunDir createDefaultRunDir(const std::string& outputDir, const std::string& jobName);

// Creates `<outputDir>/<prefix>-<UTC time>` (numeric suffix if it exists)
// and returns its absolute path: a run directory's name, or a sweep's.
// Throws IoError.
std::string createStampedDir(const std::string& outputDir, const std::string& prefix);

// Creates `path` (and logs/, model/) if missing. Throws IoError.
RunDir openRunDir(const std::string& path);

}  // namespace cohort
