#pragma once

// The job: everything a run needs, as plain structs with their defaults.
// Keys with a fixed set of values are enums (config/choices.h).
// Every key, its type, range and default is declared once, in
// src/config/schema.cc; docs/job-spec.md documents each of them (a test
// checks that the two agree).

#include <cstdint>
#include <string>
#include <vector>

#include "cohort/config/choices.h"

namespace cohort {

// LoRA adapters (models/lora.h): frozen base weights, trainable low-rank updates.
struct LoraConfig {
  int64_t rank = 0;          // 0: off
  double alpha = 16;         // the update is scaled by alpha / rank
  double dropout = 0.0;      // on the adapter's input
  std::vector<std::string> targets = {"attn"};  // layers adapted: attn, mlp, or layer names
};

// llama's rotary position embeddings (models/llama.h).
struct RopeConfig {
  double theta = 10000;          // the base of the frequencies
  RopeScaling scaling = RopeScaling::none;
  double factor = 1;             // linear, llama3: how much longer the context is
  double lowFreqFactor = 1;      // llama3
  double highFreqFactor = 4;     // llama3
  int64_t originalContext = 8192;  // llama3: the context the model was trained at
};

struct ModelConfig {
  ModelArch arch = ModelArch::simpleCnn;
  std::string path;         // torchscript: the scripted module (torch.jit.save)
  int64_t numClasses = 10;
  int64_t inChannels = 0;   // 0: taken from the training data
  bool smallInput = false;  // ResNet stem for 28-64 px images
  bool batchNorm = true;    // simple_cnn
  int64_t width = 32;       // simple_cnn: channels of the first convolution
  int64_t hidden = 128;     // simple_cnn: units of the hidden linear layer
  double dropout = 0.0;     // simple_cnn: before the classifier; gpt: embeddings, attention, residuals
  bool zeroInitResidual = false;  // ResNet: last BN of each block starts at 0
  std::string initFrom;     // weights to start from: .pt, .safetensors, a Hugging Face GPT-2 directory
  // gpt (models/gpt.h)
  int64_t nLayer = 4;
  int64_t nHead = 4;
  int64_t nEmbd = 128;      // divisible by n_head
  int64_t blockSize = 256;  // context length in tokens
  int64_t vocabSize = 0;    // 0: taken from the training data
  bool bias = true;         // in the Linear layers and LayerNorms
  Activation activation = Activation::gelu;  // the MLP's GELU: exact, or GPT-2's tanh approximation
  MemoryLayout memoryFormat = MemoryLayout::automatic;
  Recompute recompute = Recompute::none;  // blocks: activations recomputed in backward
  LoraConfig lora;
  // llama (models/llama.h); n_layer, n_head, n_embd, block_size, vocab_size as gpt's
  int64_t nKvHead = 0;            // grouped-query attention: key/value heads; 0: n_head
  int64_t intermediateSize = 0;   // the SwiGLU MLP's width; 0: 8/3 n_embd rounded up to 64
  double normEps = 0;             // llama's RMSNorm, bert's LayerNorm; 0: the architecture's (1e-5, 1e-12)
  bool tieEmbeddings = false;     // the head is the token embedding
  RopeConfig rope;
  BertTask task = BertTask::maskedLm;  // bert (models/bert.h)
  // Not a key: bert's padding token, resolved from the data's tokenizer as
  // vocab_size is; -1: none.
  int64_t padToken = -1;
};

struct AugmentConfig {
  bool hflip = false;       // random horizontal flip
  int64_t cropPadding = 0;  // random crop of the original size after zero padding
  bool randomResizedCrop = false;          // shards: RandomResizedCrop (else resize + center crop)
  std::vector<double> scale = {0.08, 1.0};  // random_resized_crop: area fraction range
  std::vector<double> ratio = {0.75, 4.0 / 3.0};  // random_resized_crop: aspect ratio range
};

struct DatasetConfig {
  DataKind kind = DataKind::none;
  std::string path;           // shards, tokens: dataset directory or blob URL (holds dataset.json)
  std::string images;         // idx: images file (raw or .gz)
  std::string labels;         // idx: labels file (raw or .gz)
  int64_t limit = 0;          // use only the first N samples; 0 = all
  int64_t size = 1024;        // synthetic: number of samples
  std::vector<int64_t> shape = {3, 32, 32};  // synthetic: C, H, W
  int64_t seed = 0;           // synthetic: content seed
  std::vector<double> mean;   // per-channel normalization; empty = none
  std::vector<double> std;
  int64_t cropSize = 224;     // shards of encoded images: output height and width
  int64_t resizeSize = 0;     // shards, no random crop: shorter side before the center crop; 0: crop_size / 0.875
  int64_t shuffleWindow = 4;  // shards: records are shuffled within groups of this many shards
  OnCorrupt onCorrupt = OnCorrupt::skip;  // shards: an undecodable image is skipped and counted, or fails
  std::string tokenizer;      // text_classes: the tokenizer's file or directory
  AugmentConfig augment;
};

struct CacheConfig {
  bool enabled = true;        // blob data: keep shards on local disk after the first read
  std::string dir = "/var/tmp/cohort-cache";  // node-local, shared by the ranks of a node
  double maxGb = 0;           // evict least recently used shards past this size; 0: no limit
};

struct DataConfig {
  DatasetConfig train;
  DatasetConfig eval;
  int64_t loaderThreads = 2;   // batch-building threads per rank
  int64_t prefetchBatches = 4; // batches built ahead of the trainer
  bool dropLast = false;       // drop the last incomplete training batch
  int64_t evalBatchSize = 0;   // 0: twice training.batch_size
  CacheConfig cache;
};

// How blob storage is reached. Secrets are never in the job file: they come
// from the environment or from the file `credentials_file` names.
struct StorageConfig {
  std::string credentialsFile;  // `account_key = ...`, `sas = ...` or `token = ...`; empty: environment
  bool managedIdentity = false;  // tokens from Azure's managed identity (IMDS)
  std::string identityClientId;  // a user-assigned identity's client id
  std::string identityEndpoint;  // empty: IMDS
  std::string endpoint;         // overrides https://<account>.blob.core.windows.net (emulator)
  std::string caFile;           // trusted certificate authorities (PEM); empty: the system's
  bool allowInsecure = false;   // emulator only: plain http / no certificate verification
  int64_t maxRetries = 5;       // transient errors (timeouts, 5xx, 429)
  double timeoutS = 60;         // per request
};

// distribution.pipeline.split: `auto`, or the blocks of each stage in order
// (gpt: transformer blocks; ResNet: layer groups).
struct PipelineSplit {
  std::vector<int64_t> blocks;  // empty: auto, balanced by measured time
  bool automatic() const { return blocks.empty(); }
  bool operator==(const PipelineSplit& o) const { return blocks == o.blocks; }
};

// distribution.pipeline: the model split into stages of consecutive blocks
// across ranks (docs/parallelism.md).
struct PipelineConfig {
  int64_t stages = 1;        // 1: no pipeline
  int64_t microBatches = 0;  // per round through the stages; 0: 4 x stages
  PipelineSchedule schedule = PipelineSchedule::oneFOneB;
  PipelineSplit split;
  int64_t microBatchCount() const { return microBatches > 0 ? microBatches : 4 * stages; }
};

struct DistributionConfig {
  int64_t nodes = 1;
  int64_t procsPerNode = 1;
  Backend backend = Backend::gloo;
  int64_t threadsPerRank = 0;    // intra-op threads; 0: cores / procs_per_node
  std::string masterAddr = "127.0.0.1";  // where `cohort run` hosts the store
  int64_t masterPort = 0;        // 0: a free port
  std::string interface;         // interface name or local address for collectives
  double timeoutS = 300;         // rendezvous and collective timeout
  double bucketCapMb = 25;       // gradient bucket size
  bool findUnusedParameters = false;
  bool broadcastBuffers = true;  // buffers (BatchNorm statistics) follow rank 0
  bool sharedMemory = true;      // ranks on one machine exchange gradients through shared memory
  GradCompression compression = GradCompression::none;  // gradients on Gloo's wire
  int64_t glooConnections = 1;   // sets of Gloo connections between each pair of ranks
  int64_t zero = 0;              // ZeRO stage: 0 none, 1 optimizer state, 2 + gradients (docs/zero.md)
  int64_t maxRestarts = 3;       // `cohort run`: restarts from the newest checkpoint
  double stopTimeoutS = 60;      // after SIGTERM: time to checkpoint before SIGKILL
  double heartbeatS = 2;         // heartbeat period (stall inspector)
  double stallWarnS = 60;        // a collective waited this long names the missing ranks
  double stallTimeoutS = 0;      // ... and this long ends the job (it can restart); 0: 0.8 x timeout_s
  double stragglerFactor = 1.5;  // a rank computing this much slower than the median is reported
  bool preflight = false;        // run the health checks before training; refuse to start on a failure
  PipelineConfig pipeline;
  int64_t tensor = 1;            // ranks splitting each layer (tensor parallelism, docs/parallelism.md)
  bool sequenceParallel = false; // with tensor > 1: the norm/residual regions split along the sequence
};

// `cohort agent`: elastic training across machines (docs/elastic.md).
struct ElasticConfig {
  // On a resize: keep the global batch (accumulation steps adjusted) or the
  // per-rank batch (the learning rate follows the linear rule).
  BatchPolicy batchPolicy = BatchPolicy::keepPerRank;
  // On a resize of a pipelined or tensor-parallel job: the axis of the mesh
  // (ranks = replicas x stages x tensor) that takes the change first.
  ReformAxis gives = ReformAxis::replicas;
  double lastCallS = 3;            // after MIN nodes joined, time for more to arrive
  double nodeTimeoutS = 10;        // a node unheard of this long is lost
  double belowMinTimeoutS = 600;   // fewer than MIN nodes this long: checkpoint and exit 75
  double rdzvTimeoutS = 60;        // retrying an unreachable rendezvous service
  std::string stateDir = "/dev/shm";  // where a node keeps the training state in memory
  // etcd over TLS (--rdzv etcds://): the CA that signs the members'
  // certificates (empty: the system's), this node's client certificate and
  // key (etcd's --client-cert-auth), and an etcd user with its password
  // (etcd's own authentication).
  std::string etcdCaFile;
  std::string etcdCertFile;
  std::string etcdKeyFile;
  std::string etcdUser;
  std::string etcdPasswordFile;
};

// How a rank drives LibTorch on the CPU (docs/performance.md).
struct ComputeConfig {
  Allocator allocator = Allocator::keep;  // system: glibc's defaults; map: blocks of 1 MB and more mapped and given back
  OneDnn onednn = OneDnn::automatic;    // convolutions through oneDNN
  BindCores bindCores = BindCores::automatic;  // each rank's threads on cores of its own (train/bind_cores.h)
};

struct OptimizerConfig {
  OptimizerKind name = OptimizerKind::sgd;
  double lr = 0.1;
  int64_t baseBatch = 0;     // linear scaling: lr * global_batch / base_batch; 0 = off
  double momentum = 0.9;
  bool nesterov = false;
  double weightDecay = 0.0;
  std::vector<double> betas = {0.9, 0.999};
  double eps = 1e-8;
};

struct ScheduleConfig {
  ScheduleKind name = ScheduleKind::constant;
  double warmupEpochs = 0;
  double minLr = 0;
  std::vector<double> milestones;  // step: epochs at which lr *= gamma
  double gamma = 0.1;
};

// Dynamic loss scaling (train/loss_scale.h).
struct LossScaleConfig {
  LossScaling enabled = LossScaling::automatic;  // auto: on for fp16 only
  double init = 65536;          // the first scale
  double growthFactor = 2;      // after growth_interval good steps in a row
  int64_t growthInterval = 2000;
  double backoffFactor = 0.5;   // after a step whose gradients overflowed
  double minScale = 1;
  double maxScale = 16777216;
};

struct TrainingConfig {
  int64_t epochs = 1;
  int64_t maxSteps = 0;       // stop after this many optimizer steps; 0 = no limit
  int64_t batchSize = 32;     // per rank and micro-step
  int64_t accumulateSteps = 1;
  int64_t seed = 0;
  double labelSmoothing = 0;
  double clipGradNorm = 0;    // clip the gradients' global L2 norm to this; 0 = off
  int64_t logEvery = 50;      // steps between train metrics
  int64_t evalEvery = 1;      // epochs between evaluations; 0 = only after the last
  OnNonfinite onNonfinite = OnNonfinite::stop;  // a NaN/Inf loss or gradient: stop, or skip the step
  Precision precision = Precision::fp32;  // bf16, fp16: autocast (train/precision.h)
  LossScaleConfig lossScale;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
};

struct OutputConfig {
  std::string dir = "runs";        // parent of run directories
  ProgressStyle progress = ProgressStyle::automatic;
  bool saveFinal = true;           // write model/final.pt
  bool mergeLora = false;          // model.lora: final.pt holds base + adapters merged
  WeightsFormat weightsFormat = WeightsFormat::pt;  // model/final.pt or model/final.safetensors
  bool tensorboard = true;         // rank 0 writes <run>/tensorboard/ event files
  bool timeline = false;           // each rank writes <run>/timeline/rank-<r>.json
  std::string profile;             // steps the operator profiler records ("20-22", "20"); empty: off
  int64_t metricsPort = 0;         // `cohort run` serves Prometheus /metrics here; 0: off
  std::string metricsHost = "127.0.0.1";
  std::string metricsTokenFile;  // bearer token scrapers must send; required beyond loopback
  std::string metricsTlsCert;    // PEM certificate (chain) and key: serve https
  std::string metricsTlsKey;
};

struct CheckpointConfig {
  bool enabled = true;
  int64_t everySteps = 0;       // 0: not by steps
  int64_t everyEpochs = 1;      // at the end of every N-th epoch; 0: not by epochs
  std::string dir;              // empty: <run dir>/checkpoints
  int64_t keepLast = 3;
  int64_t keepEverySteps = 0;   // also keep checkpoints at multiples of this step; 0: none
  int64_t maxInFlight = 1;      // snapshots held in host memory at once
  WhenBehind whenBehind = WhenBehind::skip;
  OnError onError = OnError::warn;
  std::string remote;           // a second tier: a directory (mounted file system)
};

// Health checks (`cohort health`, distribution.preflight): minimums that
// catch broken hardware, far below what a healthy machine measures, and the
// sizes of the measurements. A threshold of 0 measures without enforcing.
struct HealthConfig {
  double minMatmulGflops = 5;        // float32 matrix multiply per rank
  double minMemoryGbps = 1.5;        // memcpy, read + written, per rank
  double minDiskWriteMbps = 50;      // write + fsync in disk_dir, per rank
  double minAllreduceBusbwGbps = 0.05;  // allreduce bus bandwidth between the ranks
  int64_t matmulSize = 1024;         // n of the n x n matrices
  int64_t memoryMb = 128;            // each of the two buffers copied
  std::string diskDir;               // empty: the run directory (`cohort health`: output.dir)
  int64_t diskMb = 64;               // written at most, per rank
  double allreduceMb = 4;            // size of the tensor allreduced
  double secondsPerCheck = 0.5;      // time each measurement repeats for
};

// Encryption at rest (docs/security.md): where the key comes from, never the
// key itself.
struct EncryptionConfig {
  std::string keyFile;          // 64 hex digits, mode 0600
  std::string keyEnv;           // or: the environment variable holding them
  std::string previousKeyFile;  // the key before a rotation: opens older files only
  bool finalModel = false;      // model/final.pt too (PyTorch cannot load it then)
};

struct SecurityConfig {
  EncryptionConfig encryption;
  // The rendezvous store's token (mode 0600); empty: COHORT_STORE_TOKEN.
  std::string storeTokenFile;
};

struct JobConfig {
  std::string name = "job";
  ModelConfig model;
  DataConfig data;
  DistributionConfig distribution;
  ElasticConfig elastic;
  ComputeConfig compute;
  TrainingConfig training;
  OutputConfig output;
  CheckpointConfig checkpoint;
  StorageConfig storage;
  HealthConfig health;
  SecurityConfig security;
};

// Whether `arch` is one of cohort's decoders (gpt, llama): token windows in,
// next-token logits out, generation with a KvCache.
inline bool decoderArch(ModelArch arch) { return arch == ModelArch::gpt || arch == ModelArch::llama; }

// The MLP's width of llama and bert: model.intermediate_size, or the
// architecture's default (llama: 8/3 n_embd rounded up to 64, bert: 4 n_embd).
inline int64_t intermediateWidth(const ModelConfig& m) {
  if (m.intermediateSize > 0) return m.intermediateSize;
  return m.arch == ModelArch::llama ? (8 * m.nEmbd / 3 + 63) / 64 * 64 : 4 * m.nEmbd;
}

// Key/value heads of llama's grouped-query attention: model.n_kv_head, or n_head.
inline int64_t kvHeads(const ModelConfig& m) { return m.nKvHead > 0 ? m.nKvHead : m.nHead; }

// Whether the job pretrains bert by masked language modelling: windows of
// block_size tokens, some masked, the targets the tokens they hid.
inline bool maskedLm(const JobConfig& job) {
  return job.model.arch == ModelArch::bert && job.model.task == BertTask::maskedLm;
}

// Whether the job classifies texts (bert, task classify, on text_classes).
inline bool textClassifier(const JobConfig& job) {
  return job.model.arch == ModelArch::bert && job.model.task == BertTask::classify;
}

// Whether the model reads token windows and predicts a token at each
// position: gpt, llama, bert pretraining (the masked ones), or a
// TorchScript module trained on token data.
inline bool tokenModel(const JobConfig& job) {
  return decoderArch(job.model.arch) || maskedLm(job) ||
         (job.model.arch == ModelArch::torchscript && job.data.train.kind == DataKind::tokens);
}

// Micro-batches of training.batch_size each rank runs per optimizer step:
// accumulate_steps, each a round of the pipeline's micro-batches.
inline int64_t microBatchesPerStep(const JobConfig& job) {
  const PipelineConfig& pipe = job.distribution.pipeline;
  return job.training.accumulateSteps * (pipe.stages > 1 ? pipe.microBatchCount() : 1);
}

// Number of ranks the job asks for: nodes * procs_per_node.
inline int64_t requestedWorldSize(const JobConfig& job) {
  return job.distribution.nodes * job.distribution.procsPerNode;
}

// The blocks a pipeline splits the model into stages of: gpt's transformer
// blocks (model.n_layer), a ResNet's layer groups (4); 0 for an architecture
// that cannot be split (simple_cnn, torchscript).
inline int64_t pipelineBlocks(const ModelConfig& model) {
  switch (model.arch) {
    case ModelArch::gpt:
    case ModelArch::llama: return model.nLayer;
    case ModelArch::resnet18:
    case ModelArch::resnet34:
    case ModelArch::resnet50:
    case ModelArch::resnet101: return 4;
    case ModelArch::simpleCnn:
    case ModelArch::bert:
    case ModelArch::torchscript: return 0;
  }
  return 0;
}

}  // namespace cohort
