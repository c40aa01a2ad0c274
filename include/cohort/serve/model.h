#pragma once

// A trained model, ready to answer: what `cohort export`, `cohort serve` and
// `cohort score` start from.
//
// MODEL, on their command lines, is one of
//   - a run directory (its model/final.pt, or a LoRA run's adapters, or its
//     newest valid checkpoint: the weights `cohort generate` samples with);
//   - a weights file or checkpoint directory inside a run directory
//     (RUN/model/final.pt, RUN/checkpoints/step-N): the job is RUN/job.yaml;
//   - a weights file anywhere, with `--job JOB.yaml` naming its architecture;
//   - a TorchScript file `cohort export --format torchscript` wrote (serve
//     and score only): it carries its ModelInfo, no run directory needed.
//
// The contract with clients is the same for all of them: an image model
// takes raw pixels, [B, C, H, W] float32 in 0..255 (the image after the
// eval resize and crop, before ToTensor's division and the normalization,
// which the model applies), and gives logits [B, num_classes]; a language
// model takes token ids [B, T] (int64, T <= block_size) and gives logits
// [B, T, vocab_size].

#include <torch/types.h>

#include <nlohmann/json_fwd.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cohort/ckpt/state_dict.h"
#include "cohort/config/job.h"
#include "cohort/data/image.h"
#include "cohort/data/tokenizer.h"
#include "cohort/models/model.h"

namespace cohort::serve {

// What a client needs to know to send inputs and read outputs. Recorded as
// JSON in every exported model (ONNX metadata_props "cohort", TorchScript
// extra file "cohort.json"); docs/deploy.md lists the keys.
struct ModelInfo {
  std::string arch;      // model.arch: simple_cnn, resnet18, ..., gpt, torchscript
  bool tokens = false;   // a language model
  bool texts = false;    // a classifier of texts (bert, task classify): tokens in, classes out
  // Images: the input's channels and size; raw pixels 0..255.
  int64_t channels = 0, height = 0, width = 0;
  // Per channel (channels values), applied to pixels / 255 inside the model.
  std::vector<double> mean, std;
  // The eval transform an encoded image (JPEG, PNG) goes through to become
  // the input: shorter side resized to `resize`, center crop height x width.
  int64_t resize = 0;
  int64_t numClasses = 0;
  std::vector<std::string> classes;  // label names (the dataset's); empty: the label is the name
  // Language models.
  std::string tokenizer;       // data/tokenizer.h: "bytes" or "sentencepiece"
  int64_t vocabSize = 0;       // the model's logits
  int64_t tokenizerVocab = 0;  // ids the tokenizer can decode (<= vocabSize)
  int64_t blockSize = 0;       // longest sequence
  std::string weights;         // where the weights came from
  // The tokenizer itself (not in the JSON: an export carries a
  // SentencePiece model as a file of its own, kTokenizerExtraFile); null
  // for the byte tokenizer.
  std::shared_ptr<const data::Tokenizer> text;

  nlohmann::json toJson() const;
  // Throws DataError naming `origin` when a key is missing or of a wrong type.
  static ModelInfo fromJson(const nlohmann::json& j, const std::string& origin);
  // The class name of label `label` (its index when there are no names).
  std::string className(int64_t label) const;
};

// A model of cohort's zoo with its trained weights, in eval mode; or,
// loaded with `weightsOnly`, its trained tensors alone, read one at a time
// and the model not built (an export of a model no process holds).
struct TrainedModel {
  JobConfig job;
  std::string runDir;  // "" for a weights file given with --job outside a run directory
  ModelInfo info;
  std::shared_ptr<models::Model> model;     // null with `weights`
  std::shared_ptr<ckpt::TensorSource> weights;
  // With `weights`: the model's state-dict names in its order (tied second
  // names too), and those of them that are buffers.
  std::vector<std::string> order;
  std::set<std::string> buffers;
};

// Loads MODEL (a run directory, a weights file or a checkpoint directory;
// see above); `jobPath` overrides the job found beside it. The input shape
// and class names come from the job's training data (its manifest, or the
// header of its IDX file). Throws UsageError (no job found, not cohort's
// zoo) or DataError (no weights, unreadable files) naming the path.
// `weightsOnly`: for a GPT without LoRA, the trained tensors (their names
// and shapes checked against the model's, built without values) as
// `weights` instead of a built model; other models are built as without it.
TrainedModel loadTrainedModel(const std::string& model, const std::string& jobPath = "",
                              bool weightsOnly = false);

// Raw pixels (float, 0..255) -> the input the network was trained on:
// / 255, then (x - mean) / std per channel. `info` must be an image model's.
at::Tensor normalizePixels(const at::Tensor& raw, const ModelInfo& info);

// The eval transform an encoded image (JPEG, PNG) goes through to become the
// input of `info`'s model: shorter side resized to info.resize, center crop
// height x width, gray or RGB as its channels. Throws DataError for a model
// of another channel count (it takes pixels only).
data::ImageTransform evalTransform(const ModelInfo& info);

// Images larger than this (width x height, as their header says) are
// refused before decoding: a small, highly compressed file must not make a
// server allocate gigabytes.
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 26;  // 64 Mpx, e.g. 8192 x 8192

// A JPEG or PNG as the raw pixels `info`'s model takes: [C, H, W] float in
// 0..255 after evalTransform. Throws DataError ("the image does not decode:
// ...", too large, wrong model) naming what is wrong.
at::Tensor pixelsFromImage(const uint8_t* bytes, size_t size, const ModelInfo& info);

// Whether `path` is a TorchScript export of cohort (a module archive with
// cohort.json), not a state dict; false for anything unreadable.
bool isScriptExport(const std::string& path);

// What serve and score call: a forward from the client's input (see the
// contract above) to logits. Not thread-safe: one caller at a time.
class Predictor {
 public:
  virtual ~Predictor() = default;
  virtual const ModelInfo& info() const = 0;
  // Under inference mode; throws DataError for an input of the wrong shape
  // or type (naming what was expected).
  virtual at::Tensor forward(const at::Tensor& input) = 0;
  // A language model that keeps a key/value cache (models::Model::decode):
  // rows of token ids [T_r] continuing each row's cache, to the logits of
  // each row's last token [rows, vocab]. A TorchScript export does not
  // decode.
  virtual bool decodes() const { return false; }
  virtual at::Tensor decode(const std::vector<at::Tensor>& rows, const std::vector<models::KvCache*>& caches);
  // The sequence of `cache` ended: a predictor that keeps state of its own
  // per cache (a split model's ranks keep the keys and values) drops it.
  // Thread-safe: called from any thread, while another forwards; a later
  // decode() may still name the cache only if it was cleared (length 0).
  virtual void endSequence(const models::KvCache& cache) { (void)cache; }
  // Why the predictor can answer no more (a split model's rank ended); ""
  // while it can. Thread-safe.
  virtual std::string broken() const { return ""; }
};

// A Predictor for MODEL: any of the forms above, a TorchScript export too.
std::unique_ptr<Predictor> openPredictor(const std::string& model, const std::string& jobPath = "");

// How a language model is split across local rank processes (`cohort serve
// --procs N`): N pipeline stages of consecutive blocks, one per process.
struct SplitOptions {
  int procs = 2;
  // Tensor parallel instead: every rank holds a slice of every layer (the
  // Megatron-LM cuts of parallel/tensor_model.h) over one tensor group of
  // the N ranks, and returns its slice of the vocabulary's logits. Such a
  // model keeps no key/value cache (decodes() is false): generation runs
  // the whole window each token.
  bool tensor = false;
  std::string exe;          // the cohort-torch program the ranks run; "": launch::engineExecutable()
  int computeThreads = 0;   // each rank's intra-op threads; 0: LibTorch's default
  // Loading the ranks, and each forward or decode, waits at most this.
  std::chrono::milliseconds timeout{300000};
};

// A Predictor for a gpt or llama MODEL (as openPredictor's) split across
// o.procs rank processes this process starts (`exe serve MODEL --procs N
// --split-rank r ...`) and joins over Gloo as a member that holds no
// weights: each rank builds and loads only its stage's blocks (the first
// also the embeddings, the last the final norm and head), read one tensor
// at a time; it keeps the key/value caches of its own blocks, by an id this
// process gives each cache. forward() and decode() send the tokens to the
// ranks, the stages pass activations on, the last returns the logits (with
// o.tensor: every rank computes its slice of every layer, and of the
// logits, which this process puts together). A
// rank that ends makes every call after throw Error naming it (broken());
// destroying the predictor stops the ranks (bounded). Throws UsageError for
// --procs outside 1..the model's blocks (with o.tensor: a count that does
// not divide the heads, the MLP or the vocabulary) or a model that is not
// gpt or llama, Error when a rank ends while loading (its log above says why),
// TimeoutError when loading takes longer than o.timeout.
std::unique_ptr<Predictor> openSplitPredictor(const std::string& model, const std::string& jobPath,
                                              const SplitOptions& o);

// `predictor` as a models::Model, for code that samples from a model
// (infer::generateCommand): forward, decodes and decode are the
// predictor's; it has no parameters.
std::shared_ptr<models::Model> predictorModel(std::unique_ptr<Predictor> predictor);

// The tokenizer of a language model's `info`: info.text, or the byte
// tokenizer. Throws DataError when the model's tokenizer is not here.
const data::Tokenizer& textTokenizer(const ModelInfo& info);

// The TorchScript extra file and ONNX metadata key of a SentencePiece
// model's bytes (base64 in ONNX).
inline constexpr const char* kTokenizerExtraFile = "tokenizer.model";

// The name of the TorchScript extra file (and ONNX metadata key, "cohort")
// that holds ModelInfo.
inline constexpr const char* kInfoExtraFile = "cohort.json";
inline constexpr const char* kInfoMetadataKey = "cohort";

}  // namespace cohort::serve
