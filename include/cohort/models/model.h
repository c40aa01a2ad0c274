#pragma once

// The model zoo. Every network is a cohort::models::Model: a torch Module
// with a forward from the batch's input to logits: images [B, C, H, W] to
// [B, num_classes] for the CNNs here, tokens [B, T] to [B, T, vocab_size]
// for the GPT (models/gpt.h). Parameter and buffer names follow torchvision
// (and GPT-2), so state dicts move between cohort and PyTorch unchanged.

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cohort/ckpt/state_dict.h"

#include "cohort/config/job.h"
#include "cohort/models/kv_cache.h"
#include "cohort/models/unit_runner.h"

namespace cohort::models {

class Model : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& input) = 0;

  // forward() through the unit runner, if one is set (ZeRO stage 3): what
  // training and evaluation call.
  at::Tensor compute(const at::Tensor& input);

  // ZeRO stage 3: the submodules whose parameters are gathered together
  // just before their forward (and again before their backward) and freed
  // after, by name, in forward order; forward() runs each through inUnit().
  // The parameters outside them form one more unit, gathered around the
  // whole forward. None (the default): the whole model is one unit.
  virtual std::vector<std::string> shardingUnits() const { return {}; }
  // The runner compute() and inUnit() go through; nullptr: none. The
  // runner must outlive its use here (parallel::ShardedUnits unsets it).
  void setUnitRunner(UnitRunner* runner) { runner_ = runner; }

  // Whether images and 4-D weights are kept channels-last (NHWC in memory,
  // NCHW in shape). The function computed is the same either way.
  bool channelsLast() const { return channelsLast_; }
  void setChannelsLast(bool on);

  // For inference only (cohort serve, cohort score): folds each BatchNorm
  // into the convolution before it, from its running statistics, so that
  // forward() runs no normalization pass. The function is the same up to
  // float rounding; the model can no longer train, and its parameters no
  // longer match its state dict. Models without such pairs: nothing.
  virtual void foldForInference() {}

  // Tensors registered once here that PyTorch's module of the same
  // architecture lists under a second name too: (that name, the name here).
  virtual std::vector<std::pair<std::string, std::string>> tiedNames() const { return {}; }

  // Prefixes of tensors a pretrained file may lack, which then keep their
  // initial values (loadWeights): a classification head new to a model
  // fine-tuned from a pretrained encoder.
  virtual std::vector<std::string> optionalWeights() const { return {}; }

  // Language models that keep a KvCache (gpt, llama; not a TorchScript
  // module): decode() works on the whole model, decodePart() on any part.
  virtual bool decodes() const { return false; }
  // Token rows that continue the sequences of `caches` (one cache per row,
  // each of its own length L_r; rows[r] [T_r] int64 of its own length):
  // row r's tokens take positions L_r .. L_r + T_r - 1 and see its cached
  // ones. Returns the logits of each row's last token, [rows, vocab]; each
  // cache then holds its row's T_r positions too. Rows of any lengths run
  // together (a prompt beside single tokens of other sequences). The logits
  // are forward()'s for the whole sequence, up to float rounding. Under
  // inference or no-grad mode. Throws DataError when a row would pass
  // block_size (the caller starts a shorter sequence instead), Error for a
  // model that does not decode.
  virtual at::Tensor decode(const std::vector<at::Tensor>& rows, const std::vector<KvCache*>& caches);
  // decode() of a pipeline stage's part (ModelPart) of such a model: the
  // same rows, each cache holding this part's blocks only (by their index in
  // the part), and `hidden` what the part before returned for these rows
  // ([rows, longest row, n_embd]; the part that holds the input embeds
  // `rows` instead and takes an undefined tensor). Returns what the part
  // after takes, or, from the part that holds the output, decode()'s logits
  // [rows, vocab]; each cache then holds its row's new positions too. Parts
  // without the input read only the lengths of `rows`. decode() is this on
  // the whole model. Throws as decode() does, and DataError for `hidden` of
  // another shape.
  virtual at::Tensor decodePart(const at::Tensor& hidden, const std::vector<at::Tensor>& rows,
                                const std::vector<KvCache*>& caches);

 protected:
  // `images` in the layout the model computes in; forward() starts with it.
  at::Tensor inLayout(const at::Tensor& images) const;
  // f(x) as unit `unit` of shardingUnits() (through the runner, if set).
  at::Tensor inUnit(int unit, const UnitRunner::Forward& f, const at::Tensor& x) {
    return runner_ != nullptr ? runner_->run(unit, f, x) : f(x);
  }

 private:
  bool channelsLast_ = false;
  UnitRunner* runner_ = nullptr;
};

struct InputShape {
  int64_t channels = 0;
  int64_t height = 0;
  int64_t width = 0;
};

// The part of a model one process builds: consecutive blocks of those a
// pipeline splits (config/job.h, pipelineBlocks: gpt's transformer blocks,
// a ResNet's layer groups), with the model's input layers (the embeddings,
// the stem) and its output layers (the final norm and the head tied to the
// token embedding, which that part then holds too; pooling and the
// classifier). Its forward maps what the part before it returns (or the
// model's input) to what the part after it takes (or the logits). Tensor
// names are the whole model's, so the parts' state dicts put together are
// the whole model's.
struct ModelPart {
  int64_t firstBlock = 0;
  int64_t endBlock = -1;  // one past the last block; -1: through the model's last
  bool input = true;
  bool output = true;
  // true: every random number the whole model draws is drawn, in its order,
  // so that the part's tensors are exactly the whole model's of the same
  // seed (every block is built once, one at a time, and dropped unless
  // kept). false: only the part is built, from the generator as it is (to
  // time a block, not to train it).
  bool exact = true;
  // Where the sharding units' parameters go as they are built (ZeRO stage
  // 3; UnitSink): the model holds no more than one unit's values at any
  // time, and keeps those parameters without storage. Needs `exact`.
  // Ignored by models without units (their one unit is the whole model).
  UnitSink* sink = nullptr;
  bool whole() const { return firstBlock == 0 && endBlock < 0 && input && output; }
  // Whether block `b` of `blocks` is in the part.
  bool holds(int64_t b, int64_t blocks) const {
    return b >= firstBlock && b < (endBlock < 0 ? blocks : endBlock);
  }
};

// Builds the network `config` names for inputs of `input` shape (images;
// the GPT takes its sizes from `config` alone, model.vocab_size resolved), with
// weights initialized from the current torch seed, in the memory format
// config.memory_format resolves to; only `part` of it (the whole model by
// default), holding no more than the part and one block besides at any
// time. Throws ConfigError when the configuration cannot work (e.g. an input
// too small for the network, a part of a model that has no blocks).
std::shared_ptr<Model> createModel(const ModelConfig& config, const InputShape& input,
                                   const ModelPart& part = {});

// The state dict PyTorch's module of the same architecture has:
// ckpt::stateDict plus the second names of tied tensors. model/final.pt.
ckpt::StateDict publishedStateDict(const Model& model);

// `dict` without the second names of the model's tied tensors.
ckpt::StateDict withoutTiedNames(const Model& model, ckpt::StateDict dict);

// Loads a state dict into the model strictly (ckpt::loadStateDict), after
// dropping the second names of tied tensors, which a published state dict
// or PyTorch's holds. Throws DataError naming `origin`.
void loadWeights(Model& model, ckpt::StateDict dict, const std::string& origin);
// The same read one tensor at a time from `source` (a ckpt::LazyStateDict
// of model.init_from): the model and one tensor, not a second copy of the
// model. `part`: the model is a part of the one `source` holds
// (partOfStateDict), and only its own tensors are read.
void loadWeights(Model& model, ckpt::TensorSource& source, const std::string& origin, bool part = false);

// The entries of `dict` (a whole model's state dict) that `part` holds, by
// name (with the second names of its tied tensors), for loadWeights: the
// rest of the model is other parts'.
ckpt::StateDict partOfStateDict(const Model& part, ckpt::StateDict dict);

// Model::tiedNames() of the model `config` builds whole, without building
// it: (the second name, the tensor's name).
std::vector<std::pair<std::string, std::string>> tiedNamesOf(const ModelConfig& config);

// The tensors the first and the last pipeline stage both hold: a decoder's
// token embedding when it is its output head too (gpt; llama with
// tie_embeddings). Their gradients are summed across the two.
std::vector<std::string> tiedAcrossStages(const ModelConfig& config);

// Parameter count (trainable and not), for logs and tests.
int64_t parameterCount(const torch::nn::Module& module);

// Forwards of model.recompute's parts run again in backward so far, in this
// process: the summary's recomputed_forwards, which shows the setting reached
// the model.
int64_t recomputations();

}  // namespace cohort::models
