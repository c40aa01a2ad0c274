#pragma once

// The job schema, declared once. Each describe() lists the keys of one
// section with their member, rule and one-line description; visitors walk
// it to parse YAML (parse.cc), emit YAML (emit.cc) and list the keys for
// documentation (describeJobKeys).
//
// A visitor V provides:
//   template <class T> void field(const char* key, T& member, const char* doc,
//                                 const Rule& rule = {});
//   template <class S> void section(const char* key, S& member, const char* doc);
// and section() calls describe(*this, member) for the nested keys. T is
// int64_t, double, bool, std::string, a vector of those, or a choice enum of
// config/choices.h, whose table gives the names the file may hold.

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cohort/config/job.h"

namespace cohort::detail {

struct Rule {
  std::optional<double> min;  // inclusive
  std::optional<double> max;  // inclusive
  bool minExclusive = false;
};

inline Rule atLeast(double v) { return Rule{v, std::nullopt, false}; }
inline Rule above(double v) { return Rule{v, std::nullopt, true}; }
inline Rule between(double lo, double hi) { return Rule{lo, hi, false}; }

template <class V>
void describe(V& v, LoraConfig& c) {
  v.field("rank", c.rank,
          "Rank r of each adapter (A: r x in, B: out x r); 0: no LoRA, every weight trains.",
          between(0, 65536));
  v.field("alpha", c.alpha, "The adapters' update B A is scaled by alpha / rank.", above(0));
  v.field("dropout", c.dropout, "Dropout on the adapters' input while training.", Rule{0.0, 0.99, false});
  v.field("targets", c.targets,
          "Layers that get adapters: attn (c_attn and attn.c_proj of every block), mlp (c_fc and "
          "mlp.c_proj), or a layer's name or the end of it (c_attn, h.0.mlp.c_fc).");
}

template <class V>
void describe(V& v, RopeConfig& c) {
  v.field("theta", c.theta, "The base of the rotary frequencies (Llama 2: 10000, Llama 3: 500000).", above(0));
  v.field("scaling", c.scaling,
          "Longer contexts than trained at: none; linear divides every position by factor; llama3 "
          "divides the low frequencies by factor and keeps the high ones (Llama 3.1).");
  v.field("factor", c.factor, "linear, llama3: the scaling factor.", between(1, 1024));
  v.field("low_freq_factor", c.lowFreqFactor, "llama3: wavelengths above original_context / this are scaled.",
          above(0));
  v.field("high_freq_factor", c.highFreqFactor,
          "llama3: wavelengths below original_context / this are kept; between, interpolated.", above(0));
  v.field("original_context", c.originalContext, "llama3: the context length the model was trained at.",
          between(1, 1 << 24));
}

template <class V>
void describe(V& v, ModelConfig& c) {
  v.field("arch", c.arch, "Model architecture.");
  v.field("path", c.path,
          "torchscript: the module file saved by torch.jit.save(torch.jit.script(model)); its "
          "forward maps the batch's inputs to logits (docs/models.md).");
  v.field("num_classes", c.numClasses, "Number of output classes.", between(1, 1e7));
  v.field("in_channels", c.inChannels, "Input channels; 0 takes them from the training data.",
          between(0, 4096));
  v.field("small_input", c.smallInput,
          "ResNet: 3x3 stride-1 stem without max-pool, for 28-64 px images.");
  v.field("batch_norm", c.batchNorm, "simple_cnn: BatchNorm after each convolution.");
  v.field("width", c.width, "simple_cnn: channels of the first convolution (the second has twice).",
          between(1, 65536));
  v.field("hidden", c.hidden, "simple_cnn: units of the hidden fully connected layer.", between(1, 1 << 24));
  v.field("dropout", c.dropout,
          "simple_cnn: dropout probability before the classifier; gpt: on the embeddings, the "
          "attention weights and each residual branch.",
          Rule{0.0, 0.99, false});
  v.field("zero_init_residual", c.zeroInitResidual,
          "ResNet: start the last BatchNorm of each residual block at zero.");
  v.field("init_from", c.initFrom,
          "Weights to start from: a state dict (.pt, as torch.save(model.state_dict()) writes it), "
          "a .safetensors file, or gpt: a Hugging Face GPT-2 checkpoint (a directory with "
          "config.json and model.safetensors or pytorch_model.bin, or such a file alone).");
  v.field("n_layer", c.nLayer, "gpt, llama: transformer blocks.", between(1, 1024));
  v.field("n_head", c.nHead, "gpt, llama: attention heads per block; n_embd must be divisible by it.",
          between(1, 1024));
  v.field("n_embd", c.nEmbd, "gpt, llama: width of the residual stream (embedding size).",
          between(1, 1 << 20));
  v.field("block_size", c.blockSize,
          "gpt, llama: context length in tokens; training samples are windows of block_size + 1 tokens.",
          between(1, 1 << 20));
  v.field("vocab_size", c.vocabSize,
          "gpt, llama: token ids are below it; 0 takes it from the training data's tokenizer.",
          between(0, 1 << 24));
  v.field("bias", c.bias, "gpt: biases in the Linear layers and LayerNorms.");
  v.field("activation", c.activation,
          "gpt: the MLP's GELU: gelu computes it exactly (nanoGPT), gelu_tanh with the tanh "
          "approximation GPT-2 was trained with (Hugging Face's gelu_new).");
  v.field("memory_format", c.memoryFormat,
          "Layout of images and convolution weights: channels_last (NHWC), contiguous (NCHW), or "
          "auto: `cohort run` times a few training steps in each and keeps the faster.");
  v.field("recompute", c.recompute,
          "Activation recomputation: blocks keeps only the input of each transformer block (gpt) "
          "or ResNet stage in forward and computes the rest again in backward: less memory for "
          "about one more forward pass of compute. none keeps every activation.");
  v.field("n_kv_head", c.nKvHead,
          "llama: key/value heads (grouped-query attention); n_head must be divisible by it; 0: "
          "n_head (multi-head attention).",
          between(0, 1024));
  v.field("intermediate_size", c.intermediateSize,
          "llama: width of the SwiGLU MLP; 0: 8/3 n_embd rounded up to a multiple of 64. bert: of the GELU MLP; 0: "
          "4 n_embd.",
          between(0, 1 << 22));
  v.field("norm_eps", c.normEps,
          "llama: RMSNorm's epsilon (Hugging Face's rms_norm_eps); bert: LayerNorm's (layer_norm_eps); 0: the "
          "architecture's (1e-5, 1e-12).",
          atLeast(0));
  v.field("tie_embeddings", c.tieEmbeddings,
          "llama: the output head is the token embedding (gpt's always is).");
  v.section("rope", c.rope, "llama: rotary position embeddings.");
  v.field("task", c.task,
          "bert: masked_lm pretrains on token data (15% of positions chosen: 80% masked, 10% a random token, "
          "10% kept); classify fine-tunes a classifier of whole texts (text_classes data, num_classes).");
  v.section("lora", c.lora,
            "gpt: LoRA fine-tuning. The weights (from init_from) are frozen; only the adapters "
            "train, are exchanged, checkpointed and saved (model/adapters.pt).");
}

template <class V>
void describe(V& v, AugmentConfig& c) {
  v.field("hflip", c.hflip, "Random horizontal flip.");
  v.field("crop_padding", c.cropPadding,
          "Random crop of the original size after zero-padding each side by this many pixels.",
          between(0, 4096));
  v.field("random_resized_crop", c.randomResizedCrop,
          "shards: crop a random area and aspect ratio, resized to crop_size (Inception-style); "
          "else resize and center crop.");
  v.field("scale", c.scale, "random_resized_crop: range of the crop's area fraction [min, max].");
  v.field("ratio", c.ratio, "random_resized_crop: range of the crop's aspect ratio [min, max].");
}

template <class V>
void describe(V& v, DatasetConfig& c) {
  v.field("kind", c.kind, "Source of samples.");
  v.field("path", c.path,
          "shards, tokens: the packed dataset, a directory or blob URL holding dataset.json "
          "(docs/shard-format.md, docs/token-format.md); text_classes: the text file, a line per "
          "example: its label, a tab, its text (docs/data.md).");
  v.field("tokenizer", c.tokenizer,
          "text_classes: the tokenizer's file or directory (a BERT vocab.txt, a tokenizer.json, a Hugging "
          "Face model directory), which has [CLS], [SEP] and [PAD].");
  v.field("images", c.images, "idx: images file (IDX format, raw or gzip).");
  v.field("labels", c.labels, "idx: labels file (IDX format, raw or gzip).");
  v.field("limit", c.limit, "Use only the first N samples; 0 uses all.", atLeast(0));
  v.field("size", c.size, "synthetic: number of samples.", between(1, 1e12));
  v.field("shape", c.shape, "synthetic: sample shape [channels, height, width].");
  v.field("seed", c.seed, "synthetic: seed of the sample contents.", atLeast(0));
  v.field("mean", c.mean, "Per-channel mean subtracted after scaling pixels to [0,1]; empty: none.");
  v.field("std", c.std, "Per-channel standard deviation divided by after the mean; empty: none.");
  v.field("crop_size", c.cropSize, "shards of encoded images: output height and width in pixels.",
          between(1, 65536));
  v.field("resize_size", c.resizeSize,
          "shards without random_resized_crop: the shorter side is resized to this before the "
          "center crop; 0: crop_size / 0.875.",
          between(0, 65536));
  v.field("shuffle_window", c.shuffleWindow,
          "shards: shard order is shuffled each epoch and records are shuffled within groups of "
          "this many consecutive shards.",
          between(1, 1e9));
  v.field("on_corrupt", c.onCorrupt,
          "shards: an image that does not decode is skipped (counted, warning with its key) or "
          "fails the run.");
  v.section("augment", c.augment, "Training-time augmentation.");
}

template <class V>
void describe(V& v, CacheConfig& c) {
  v.field("enabled", c.enabled,
          "Keep shards read from blob storage on local disk; later epochs read them there.");
  v.field("dir", c.dir, "Node-local cache directory, shared by the ranks of a node.");
  v.field("max_gb", c.maxGb, "Evict least recently used shards past this size; 0: no limit.",
          atLeast(0));
}

template <class V>
void describe(V& v, StorageConfig& c) {
  v.field("credentials_file", c.credentialsFile,
          "File with `account_key = ...`, `sas = ...` or `token = ...` (an OAuth bearer token); "
          "empty: AZURE_STORAGE_KEY, AZURE_STORAGE_SAS_TOKEN or AZURE_STORAGE_BEARER_TOKEN from "
          "the environment. Never put secrets in the job file.");
  v.field("managed_identity", c.managedIdentity,
          "Authenticate with tokens from Azure's managed identity of the machine (IMDS) instead "
          "of a key, SAS or token.");
  v.field("identity_client_id", c.identityClientId,
          "managed_identity: the client id of a user-assigned identity; empty: the "
          "system-assigned one.");
  v.field("identity_endpoint", c.identityEndpoint,
          "managed_identity: the token endpoint; empty: "
          "http://169.254.169.254/metadata/identity/oauth2/token.");
  v.field("endpoint", c.endpoint,
          "Where az://account/... goes; empty: https://<account>.blob.core.windows.net. "
          "For the emulator: http://127.0.0.1:10000/devstoreaccount1.");
  v.field("ca_file", c.caFile, "Trusted certificate authorities (PEM); empty: the system's.");
  v.field("allow_insecure", c.allowInsecure,
          "Emulator only: allow plain http and skip certificate verification.");
  v.field("max_retries", c.maxRetries,
          "Retries of a request after a transient error (timeout, 5xx, 429), with exponential "
          "backoff.",
          between(0, 100));
  v.field("timeout_s", c.timeoutS, "Timeout of one request, in seconds.", between(1, 86400));
}

template <class V>
void describe(V& v, DataConfig& c) {
  v.section("train", c.train, "Training data (required).");
  v.section("eval", c.eval, "Evaluation data, evaluated after each epoch; kind none skips it.");
  v.field("loader_threads", c.loaderThreads, "Batch-building threads per rank.", between(1, 256));
  v.field("prefetch_batches", c.prefetchBatches, "Batches built ahead of the trainer.",
          between(1, 4096));
  v.field("drop_last", c.dropLast, "Drop each rank's last incomplete training batch.");
  v.field("eval_batch_size", c.evalBatchSize,
          "Evaluation batch size per rank; 0 uses twice training.batch_size.", between(0, 1 << 24));
  v.section("cache", c.cache, "Local cache of shards read from blob storage.");
}

template <class V>
void describe(V& v, PipelineConfig& c) {
  v.field("stages", c.stages,
          "Pipeline stages: the model is split into this many stages of consecutive blocks, each "
          "held by one rank of every data replica (ranks = replicas x stages; docs/parallelism.md). "
          "1: no pipeline.",
          between(1, 4096));
  v.field("micro_batches", c.microBatches,
          "Micro-batches of training.batch_size that run through the stages together in one "
          "round (at least stages); a step is accumulate_steps rounds. 0: 4 x stages.",
          between(0, 1 << 20));
  v.field("schedule", c.schedule,
          "1f1b: each stage alternates one forward and one backward once the pipeline is full, "
          "holding the activations of at most `stages` micro-batches; gpipe: every forward, then "
          "every backward (activations of all micro-batches).");
  v.field("split", c.split,
          "Blocks of each stage, in order (gpt: transformer blocks, the embeddings with the first "
          "stage and the final norm and head with the last; ResNet: layer groups layer1..layer4, "
          "the stem with the first stage and the classifier with the last), e.g. [3, 5]; auto "
          "balances the stages by each block's measured time.");
}

template <class V>
void describe(V& v, DistributionConfig& c) {
  v.field("nodes", c.nodes,
          "Machines in the job; under `cohort agent`, the size the batch and learning rate are "
          "written for (elastic.batch_policy).",
          between(1, 1e6));
  v.field("procs_per_node", c.procsPerNode, "Ranks per machine (`cohort run --procs` sets it).",
          between(1, 4096));
  v.field("backend", c.backend, "Collective backend.");
  v.field("threads_per_rank", c.threadsPerRank,
          "Intra-op threads per rank; 0: available cores / procs_per_node (at least 1).",
          between(0, 1024));
  v.field("master_addr", c.masterAddr, "Address where `cohort run` hosts the rendezvous store.");
  v.field("master_port", c.masterPort, "Port of the rendezvous store; 0 picks a free port.",
          between(0, 65535));
  v.field("interface", c.interface,
          "Network interface (e.g. eth0) or local address the collectives use; empty: loopback "
          "when master_addr is a loopback address, else the address this machine reaches "
          "master_addr from.");
  v.field("timeout_s", c.timeoutS, "Timeout of rendezvous and of each collective, in seconds.",
          between(1, 7 * 86400));
  v.field("bucket_cap_mb", c.bucketCapMb, "Gradient bucket size in MiB.", Rule{0.0, 1 << 20, true});
  v.field("find_unused_parameters", c.findUnusedParameters,
          "Allow parameters that get no gradient in a step (their gradient counts as zero).");
  v.field("shared_memory", c.sharedMemory,
          "Ranks on one machine sum gradients in shared memory instead of over Gloo's loopback "
          "TCP; across machines, one rank per machine then exchanges its machine's sum over Gloo "
          "(hierarchical).");
  v.field("compression", c.compression,
          "Gradients on Gloo's wire: float32 (none), or rounded to 16 bits (fp16, bf16), summed "
          "and widened back to float32. Not in shared memory.");
  v.field("gloo_connections", c.glooConnections,
          "Sets of Gloo connections between each pair of ranks; successive bucket allreduces take "
          "successive sets.",
          between(1, 64));
  v.field("zero", c.zero,
          "ZeRO sharding (docs/zero.md): 0 every rank keeps all optimizer state; 1 each rank keeps "
          "and steps the optimizer state of 1/N of the parameters, which are then gathered; 2 as "
          "1, with the gradients reduce-scattered instead of allreduced; 3 as 2, with the "
          "parameters sharded too, gathered unit by unit. With a pipeline, N is each stage's "
          "replicas.",
          between(0, 3));
  v.field("tensor", c.tensor,
          "Tensor parallelism (docs/parallelism.md): ranks that split each layer of the gpt model "
          "the Megatron-LM way (attention by heads, the MLP by its width, the embedding and head "
          "by the vocabulary). The job's ranks are data replicas x pipeline stages x tensor.",
          between(1, 4096));
  v.field("sequence_parallel", c.sequenceParallel,
          "With tensor > 1: the LayerNorm and residual regions are split along the sequence too, "
          "so activations per rank are about 1/tensor (the sequence length must be divisible by "
          "tensor).");
  v.field("broadcast_buffers", c.broadcastBuffers,
          "Buffers (BatchNorm running statistics) follow rank 0's: every rank takes them before "
          "evaluation and the final save; false keeps each rank's own.");
  v.field("max_restarts", c.maxRestarts,
          "`cohort run`: when a rank crashes, is killed or times out, restart every rank from the "
          "newest checkpoint, at most this many times.",
          between(0, 1e6));
  v.field("stop_timeout_s", c.stopTimeoutS,
          "After SIGTERM (a preemption notice), seconds the ranks have to finish the step and "
          "write a checkpoint before they are killed.",
          between(1, 86400));
  v.field("heartbeat_s", c.heartbeatS,
          "Seconds between a rank's heartbeats (step, phase, the collective it waits in) in the "
          "rendezvous store.",
          between(0.05, 3600));
  v.field("stall_warn_s", c.stallWarnS,
          "A rank waiting this long in one collective logs which ranks are missing and what their "
          "heartbeats say, again every as many seconds; 0: never.",
          atLeast(0));
  v.field("stall_timeout_s", c.stallTimeoutS,
          "A rank waiting this long in one collective ends (exit 4) so the job fails and can "
          "restart from its last checkpoint instead of hanging; 0: 0.8 x timeout_s. Must be "
          "below timeout_s, where Gloo ends the wait with a vaguer error.",
          atLeast(0));
  v.field("straggler_factor", c.stragglerFactor,
          "At each train record, a rank whose compute time per step is this many times the "
          "median of the others' is reported as a straggler; 0: off.",
          atLeast(0));
  v.section("pipeline", c.pipeline,
            "Pipeline parallelism: the model split into stages across ranks (docs/parallelism.md).");
  v.field("preflight", c.preflight,
          "Run the health checks (see health) on every rank before training and refuse to start, "
          "naming the rank and the check, when one fails. Takes a few seconds.");
}

template <class V>
void describe(V& v, ElasticConfig& c) {
  v.field("batch_policy", c.batchPolicy,
          "When the number of ranks changes: keep_global keeps the global batch of "
          "distribution.nodes x procs_per_node ranks (accumulate_steps adjusted; it must divide "
          "evenly at every size --nnodes allows); keep_per_rank keeps batch_size and "
          "accumulate_steps, and the learning rate follows the global batch (linear rule; "
          "optimizer.base_batch, or the global batch at distribution.nodes).");
  v.field("gives", c.gives,
          "When the number of ranks changes under a pipeline (distribution.pipeline.stages) or a "
          "tensor split (distribution.tensor): replicas keeps the stages and the tensor split while "
          "the ranks are a multiple of stages x tensor and changes the data replicas (when they are "
          "not, the stages give: the most that fit); stages keeps the data replicas of the job's "
          "size and changes the pipeline's stages (up to the model's blocks; when that cannot hold, "
          "as replicas). The tensor split never changes; the checkpoint or held state is read back "
          "in the new layout (docs/elastic.md).");
  v.field("last_call_s", c.lastCallS,
          "Once --nnodes MIN nodes have joined, seconds more may join before the round starts.",
          between(0, 3600));
  v.field("node_timeout_s", c.nodeTimeoutS,
          "A node whose agent has not renewed its liveness this long is lost; the others re-form "
          "without it.",
          between(0.5, 3600));
  v.field("below_min_timeout_s", c.belowMinTimeoutS,
          "Fewer than MIN nodes for this long: the agents write the newest state to the "
          "checkpoint directory and exit 75.",
          between(1, 7 * 86400));
  v.field("rdzv_timeout_s", c.rdzvTimeoutS,
          "A rendezvous service (etcd, the store) that stays unreachable this long ends the "
          "agent; shorter outages are retried with backoff.",
          between(1, 86400));
  v.field("state_dir", c.stateDir,
          "Where a node keeps the training state between rounds: a memory file system "
          "(tmpfs), so a re-form reads no disk.");
  v.field("etcd_ca_file", c.etcdCaFile,
          "etcd over TLS (--rdzv etcds://...): PEM bundle of the CA that signs the members' "
          "certificates; empty: the system's (docs/security.md).");
  v.field("etcd_cert_file", c.etcdCertFile,
          "etcds://: the PEM client certificate this node presents (for etcd's "
          "--client-cert-auth); needs etcd_key_file. May differ per node (--set).");
  v.field("etcd_key_file", c.etcdKeyFile, "etcds://: the private key of etcd_cert_file (mode 0600).");
  v.field("etcd_user", c.etcdUser,
          "etcds://: an etcd user to authenticate as (etcd's own authentication, `etcdctl auth "
          "enable`); needs etcd_password_file.");
  v.field("etcd_password_file", c.etcdPasswordFile,
          "etcds://: a file (mode 0600) holding etcd_user's password.");
}

template <class V>
void describe(V& v, OptimizerConfig& c) {
  v.field("name", c.name,
          "Optimizer. adamw steps each float32 CPU parameter in one fused pass over its memory "
          "(docs/performance.md), equal to LibTorch's AdamW to float rounding.");
  v.field("lr", c.lr, "Base learning rate.", above(0));
  v.field("base_batch", c.baseBatch,
          "Linear scaling rule: the peak lr is lr * global_batch / base_batch; 0 uses lr as is.",
          atLeast(0));
  v.field("momentum", c.momentum, "sgd: momentum.", between(0, 1));
  v.field("nesterov", c.nesterov, "sgd: Nesterov momentum.");
  v.field("weight_decay", c.weightDecay,
          "Weight decay (sgd: L2 added to the gradient; adamw: decoupled).", atLeast(0));
  v.field("betas", c.betas, "adamw: [beta1, beta2].");
  v.field("eps", c.eps, "adamw: epsilon.", above(0));
}

template <class V>
void describe(V& v, ScheduleConfig& c) {
  v.field("name", c.name, "Learning-rate decay after warmup.");
  v.field("warmup_epochs", c.warmupEpochs,
          "Linear warmup to the peak lr over this many epochs (fractions allowed): step s of W "
          "trains at peak * (s+1) / W.",
          atLeast(0));
  v.field("min_lr", c.minLr, "cosine: final learning rate.", atLeast(0));
  v.field("milestones", c.milestones, "step: epochs at which the lr is multiplied by gamma.");
  v.field("gamma", c.gamma, "step: decay factor.", Rule{0.0, 1.0, true});
}

template <class V>
void describe(V& v, LossScaleConfig& c) {
  v.field("enabled", c.enabled,
          "Scale the loss before backward and unscale the gradients before the step; auto: on "
          "for precision fp16 only.");
  v.field("init", c.init, "The first scale.", Rule{1.0, 1e300, false});
  v.field("growth_factor", c.growthFactor, "The scale is multiplied by this after growth_interval "
          "good steps in a row.", Rule{1.0, 1e6, false});
  v.field("growth_interval", c.growthInterval, "Good steps in a row before the scale grows.",
          between(1, 1e12));
  v.field("backoff_factor", c.backoffFactor,
          "The scale is multiplied by this after a step whose gradients overflowed (the step is "
          "skipped).",
          Rule{0.0, 1.0, true});
  v.field("min_scale", c.minScale, "The scale never backs off below this.", Rule{0.0, 1e30, true});
  v.field("max_scale", c.maxScale, "The scale never grows above this.", Rule{1.0, 1e300, false});
}

template <class V>
void describe(V& v, TrainingConfig& c) {
  v.field("epochs", c.epochs, "Passes over the training data.", between(1, 1e7));
  v.field("max_steps", c.maxSteps, "Stop after this many optimizer steps; 0: no limit.", atLeast(0));
  v.field("batch_size", c.batchSize, "Samples per rank per micro-step.", between(1, 1 << 24));
  v.field("accumulate_steps", c.accumulateSteps,
          "Micro-steps per optimizer step; gradients are only exchanged on the last.", between(1, 1 << 20));
  v.field("seed", c.seed, "Seed of initialization, shuffling, augmentation and dropout.",
          atLeast(0));
  v.field("label_smoothing", c.labelSmoothing, "Cross-entropy label smoothing.", Rule{0.0, 1.0, false});
  v.field("clip_grad_norm", c.clipGradNorm,
          "Scale the gradients down when their global L2 norm (over every parameter, every rank, "
          "after loss-scale removal) exceeds this, as torch.nn.utils.clip_grad_norm_; 0: off.",
          atLeast(0));
  v.field("log_every", c.logEvery, "Optimizer steps between train records in metrics.jsonl.",
          between(1, 1e12));
  v.field("on_nonfinite", c.onNonfinite,
          "A NaN or Inf loss or gradient: stop (exit 3, the last checkpoint is the last good "
          "state) or skip the step (10 skipped in a row stop).");
  v.field("precision", c.precision,
          "Forward passes in fp32, or in bf16 autocast (matrix products and convolutions in "
          "bfloat16; weights, gradients, optimizer state and the loss stay float32); auto: bf16 "
          "when the CPU has avx512_bf16 or amx_bf16, else fp32; fp16: float16 autocast with "
          "loss scaling, CUDA builds only. See docs/performance.md.");
  v.field("eval_every", c.evalEvery, "Epochs between evaluations; 0: only after the last epoch.",
          atLeast(0));
  v.section("loss_scale", c.lossScale,
            "Dynamic loss scaling: a step whose gradients overflow is skipped and the scale "
            "backs off.");
  v.section("optimizer", c.optimizer, "Optimizer.");
  v.section("schedule", c.schedule, "Learning-rate schedule (per optimizer step).");
}

template <class V>
void describe(V& v, OutputConfig& c) {
  v.field("dir", c.dir, "Directory in which run directories are created.");
  v.field("progress", c.progress,
          "Console progress: bar on a terminal and plain lines otherwise (auto), or forced.");
  v.field("save_final", c.saveFinal,
          "Write the trained weights to model/final.pt (model/final.safetensors with "
          "weights_format: safetensors).");
  v.field("weights_format", c.weightsFormat,
          "The file format of the trained weights (model/final.*, a LoRA run's merged "
          "weights; its adapters.pt and base.pt stay pt): pt (PyTorch's torch.save) or safetensors. safetensors cannot be "
          "encrypted (security.encryption.final_model).");
  v.field("merge_lora", c.mergeLora,
          "model.lora: also write model/final.pt with the adapters merged into the weights "
          "(W + alpha / rank * B A), loadable without them.");
  v.field("tensorboard", c.tensorboard,
          "Rank 0 writes the scalars as TensorBoard event files in <run>/tensorboard/.");
  v.field("timeline", c.timeline,
          "Each rank writes a Chrome trace of its steps to <run>/timeline/rank-<r>.json "
          "(cohort run --timeline).");
  v.field("profile", c.profile,
          "Steps the operator profiler records on every rank, FIRST-LAST or one step N (cohort run "
          "--profile): LibTorch's operators with cohort's phases, as <run>/profile/operators-rank-<r>.csv "
          "and .json and a trace in <run>/tensorboard/plugins/profile/; empty: off.");
  v.field("metrics_port", c.metricsPort,
          "`cohort run` serves Prometheus metrics at http://<metrics_host>:<port>/metrics; 0: off.",
          between(0, 65535));
  v.field("metrics_host", c.metricsHost,
          "Address the metrics endpoint listens on. Any address but loopback needs "
          "metrics_token_file.");
  v.field("metrics_token_file", c.metricsTokenFile,
          "A file (mode 0600) holding the token scrapers must send as `Authorization: Bearer "
          "<token>` (Prometheus: authorization.credentials_file); empty: no token (loopback only).");
  v.field("metrics_tls_cert", c.metricsTlsCert,
          "PEM certificate (chain) the metrics endpoint serves https with; needs metrics_tls_key. "
          "Empty: plain http.");
  v.field("metrics_tls_key", c.metricsTlsKey, "PEM private key of metrics_tls_cert (mode 0600).");
}

template <class V>
void describe(V& v, CheckpointConfig& c) {
  v.field("enabled", c.enabled,
          "Take checkpoints, and resume from the newest valid one in the run directory.");
  v.field("every_steps", c.everySteps, "Checkpoint every N optimizer steps; 0: not by steps.",
          atLeast(0));
  v.field("every_epochs", c.everyEpochs,
          "Checkpoint at the end of every N-th epoch; 0: not by epochs.", atLeast(0));
  v.field("dir", c.dir,
          "Where the step-<N> directories go: <dir>/<run dir name>/step-<N>; empty: "
          "<run dir>/checkpoints.");
  v.field("keep_last", c.keepLast, "Keep this many newest valid checkpoints.", between(1, 1e9));
  v.field("keep_every_steps", c.keepEverySteps,
          "Also keep every checkpoint whose step is a multiple of this; 0: none.", atLeast(0));
  v.field("max_in_flight", c.maxInFlight,
          "Snapshots held in host memory at once (each the size of the model and optimizer "
          "state); 0: none, each checkpoint is written straight from the training state and the "
          "optimizer step after it waits for the write (also chosen, with a log line, when a "
          "copy would not fit in the rank's memory).",
          between(0, 64));
  v.field("when_behind", c.whenBehind,
          "When every snapshot buffer is still being written: skip this checkpoint (warning) or "
          "wait for a buffer.");
  v.field("on_error", c.onError,
          "When writing a checkpoint fails: warn and train on, or fail the run.");
  v.field("remote", c.remote,
          "A second, remote tier each committed checkpoint is copied to: a directory (e.g. a "
          "mounted network file system) or a blob URL (az://account/container/prefix); empty: "
          "none.");
}

template <class V>
void describe(V& v, HealthConfig& c) {
  v.field("min_matmul_gflops", c.minMatmulGflops,
          "Minimum float32 matrix-multiply speed of each rank, in GFLOP/s; 0: not enforced.",
          atLeast(0));
  v.field("min_memory_gbps", c.minMemoryGbps,
          "Minimum memory bandwidth of each rank (memcpy, bytes read + written), in GB/s; 0: not "
          "enforced.",
          atLeast(0));
  v.field("min_disk_write_mbps", c.minDiskWriteMbps,
          "Minimum speed of writing a file in disk_dir (then fsync), per rank, in MB/s; 0: not "
          "enforced.",
          atLeast(0));
  v.field("min_allreduce_busbw_gbps", c.minAllreduceBusbwGbps,
          "Minimum allreduce bus bandwidth between the ranks (algbw * 2(n-1)/n), in GB/s; 0: not "
          "enforced.",
          atLeast(0));
  v.field("matmul_size", c.matmulSize, "Matrix-multiply check: n of the n x n matrices.",
          between(16, 16384));
  v.field("memory_mb", c.memoryMb,
          "Memory check: MiB of each of the two buffers copied (keep it far above the caches).",
          between(1, 1 << 20));
  v.field("disk_dir", c.diskDir,
          "Directory the disk check writes its file in; empty: the run directory (`cohort "
          "health`: output.dir).");
  v.field("disk_mb", c.diskMb, "Disk check: MiB written at most per rank.", between(1, 1 << 20));
  v.field("allreduce_mb", c.allreduceMb, "Allreduce check: MiB of the float32 tensor allreduced.",
          Rule{0.0, 1 << 16, true});
  v.field("seconds_per_check", c.secondsPerCheck,
          "Seconds each measurement repeats for (at least two repetitions; disk: at most).",
          Rule{0.0, 600, true});
}

template <class V>
void describe(V& v, ComputeConfig& c) {
  v.field("allocator", c.allocator,
          "keep: freed memory stays in the rank for the next step (glibc neither trims the heap "
          "nor maps large blocks); system: glibc's defaults, which return it to the kernel and "
          "fault it back in every step; map: every block of 1 MB or more is mapped and given back "
          "when freed, so no hole of the heap stays resident (the least memory, for ZeRO stage 3 "
          "near the limit; slower, measured in docs/zero.md).");
  v.field("onednn", c.onednn,
          "Convolutions and their gradients through oneDNN (on) or LibTorch's own kernels (off); "
          "auto: on when LibTorch has oneDNN, except for a bf16 job when ONEDNN_MAX_CPU_ISA "
          "holds oneDNN below AVX-512 (no bf16 kernels there).");
  v.field("bind_cores", c.bindCores,
          "Hold each rank's threads to cores of its own (consecutive slices of the cores the "
          "process may use, distribution.threads_per_rank each, by local rank), as PyTorch's CPU "
          "launcher and DeepSpeed's --bind_cores_to_rank do; auto: when the machine's ranks x "
          "threads equal its cores, so that spare cores stay free for data loading; on: always "
          "(refused when they need more cores than there are); off: the scheduler places them.");
}

template <class V>
void describe(V& v, EncryptionConfig& c) {
  v.field("key_file", c.keyFile,
          "Encrypt checkpoints with AES-256-GCM under the key in this file: 64 hex digits "
          "(`openssl rand -hex 32`), mode 0600. Empty: no encryption unless key_env is set.");
  v.field("key_env", c.keyEnv,
          "Or: the name of the environment variable holding the key (64 hex digits).");
  v.field("previous_key_file", c.previousKeyFile,
          "The key before a rotation: files sealed with it still open; new files use the current "
          "key.");
  v.field("final_model", c.finalModel,
          "Encrypt model/final.pt too, and a LoRA run's model/adapters.pt and model/base.pt (PyTorch "
          "cannot load them then; `cohort ckpt decrypt` writes a plain copy).");
}

template <class V>
void describe(V& v, SecurityConfig& c) {
  v.section("encryption", c.encryption, "Encryption at rest (docs/security.md).");
  v.field("store_token_file", c.storeTokenFile,
          "A file (mode 0600) holding the rendezvous store's token, the same on every machine; "
          "required when the store listens beyond loopback. Empty: the environment variable "
          "COHORT_STORE_TOKEN, or a token `cohort run` makes for its own ranks.");
}

template <class V>
void describe(V& v, JobConfig& c) {
  v.field("name", c.name, "Job name; run directories are named <name>-<UTC time>.");
  v.section("model", c.model, "The network.");
  v.section("data", c.data, "Training and evaluation data.");
  v.section("distribution", c.distribution, "Ranks and communication.");
  v.section("elastic", c.elastic, "Elastic training with `cohort agent` (docs/elastic.md).");
  v.section("compute", c.compute, "How each rank computes on the CPU (docs/performance.md).");
  v.section("training", c.training, "The training loop.");
  v.section("output", c.output, "Run directory and console output.");
  v.section("checkpoint", c.checkpoint, "Checkpoints and resuming.");
  v.section("storage", c.storage, "How blob storage (az:// and https:// URLs) is reached.");
  v.section("health", c.health, "Health checks (`cohort health`, distribution.preflight).");
  v.section("security", c.security, "Encryption at rest (docs/security.md).");
}

}  // namespace cohort::detail
