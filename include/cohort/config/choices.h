#pragma once

// The job file's choices: every key whose value is one of a fixed set of
// names is an enum here, with one table mapping each value to its name.
// The parser turns the name into the value once (config/load.h), so the
// rest of cohort compares enums, never strings; the resolved YAML, the key
// list of docs/job-spec.md and error messages take the names from the same
// table.
//
// To add a choice: add the enumerator and its row in the table; the
// compiler then points at every switch that has to handle it.

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort {

enum class ModelArch { simpleCnn, resnet18, resnet34, resnet50, resnet101, gpt, llama, bert, torchscript };
// `auto` is spelled `automatic` where C++ reserves the word.
enum class MemoryLayout { automatic, channelsLast, contiguous };
enum class DataKind { idx, synthetic, shards, tokens, textClasses, none };
enum class OnCorrupt { skip, fail };
enum class Backend { gloo, nccl };
enum class GradCompression { none, fp16, bf16 };
enum class BatchPolicy { keepGlobal, keepPerRank };
enum class ReformAxis { replicas, stages };
enum class Allocator { keep, system, map };
enum class OneDnn { automatic, on, off };
enum class BindCores { automatic, on, off };
enum class OptimizerKind { sgd, adamw };
enum class ScheduleKind { constant, cosine, step };
enum class OnNonfinite { stop, skip };
enum class ProgressStyle { automatic, bar, plain, off };
enum class WhenBehind { skip, wait };
enum class OnError { warn, fail };
enum class Precision { fp32, bf16, fp16, automatic };
enum class LossScaling { automatic, on, off };
enum class Recompute { none, blocks };
// llama's rotary embeddings beyond the context they were trained at: none,
// positions interpolated (linear), or Llama 3.1's per-frequency scaling.
enum class RopeScaling { none, linear, llama3 };
// What bert is trained for: masked language modelling (pretraining) or
// classifying whole sequences (fine-tuning).
enum class BertTask { maskedLm, classify };
// gpt's MLP: GELU exactly (erf, nanoGPT's nn.GELU()) or its tanh
// approximation (GPT-2's "gelu_new").
enum class Activation { gelu, geluTanh };
// The file format of trained weights: PyTorch's zip or safetensors.
enum class WeightsFormat { pt, safetensors };
// `1f1b` is spelled `oneFOneB`: an identifier cannot start with a digit.
enum class PipelineSchedule { oneFOneB, gpipe };

// ChoiceNames<E>::table: each value of E with its name in the job file, in
// the order the documentation lists them.
template <class E>
struct ChoiceNames;

template <class E, size_t N>
using ChoiceTable = std::array<std::pair<E, std::string_view>, N>;

template <>
struct ChoiceNames<ModelArch> {
  static constexpr ChoiceTable<ModelArch, 9> table{{{ModelArch::simpleCnn, "simple_cnn"},
                                                    {ModelArch::resnet18, "resnet18"},
                                                    {ModelArch::resnet34, "resnet34"},
                                                    {ModelArch::resnet50, "resnet50"},
                                                    {ModelArch::resnet101, "resnet101"},
                                                    {ModelArch::gpt, "gpt"},
                                                    {ModelArch::llama, "llama"},
                                                    {ModelArch::bert, "bert"},
                                                    {ModelArch::torchscript, "torchscript"}}};
};
template <>
struct ChoiceNames<MemoryLayout> {
  static constexpr ChoiceTable<MemoryLayout, 3> table{{{MemoryLayout::automatic, "auto"},
                                                       {MemoryLayout::channelsLast, "channels_last"},
                                                       {MemoryLayout::contiguous, "contiguous"}}};
};
template <>
struct ChoiceNames<DataKind> {
  static constexpr ChoiceTable<DataKind, 6> table{{{DataKind::idx, "idx"},
                                                   {DataKind::synthetic, "synthetic"},
                                                   {DataKind::shards, "shards"},
                                                   {DataKind::tokens, "tokens"},
                                                   {DataKind::textClasses, "text_classes"},
                                                   {DataKind::none, "none"}}};
};
template <>
struct ChoiceNames<OnCorrupt> {
  static constexpr ChoiceTable<OnCorrupt, 2> table{{{OnCorrupt::skip, "skip"}, {OnCorrupt::fail, "fail"}}};
};
template <>
struct ChoiceNames<Backend> {
  static constexpr ChoiceTable<Backend, 2> table{{{Backend::gloo, "gloo"}, {Backend::nccl, "nccl"}}};
};
template <>
struct ChoiceNames<BatchPolicy> {
  static constexpr ChoiceTable<BatchPolicy, 2> table{
      {{BatchPolicy::keepGlobal, "keep_global"}, {BatchPolicy::keepPerRank, "keep_per_rank"}}};
};
template <>
struct ChoiceNames<ReformAxis> {
  static constexpr ChoiceTable<ReformAxis, 2> table{{{ReformAxis::replicas, "replicas"}, {ReformAxis::stages, "stages"}}};
};
template <>
struct ChoiceNames<GradCompression> {
  static constexpr ChoiceTable<GradCompression, 3> table{{{GradCompression::none, "none"},
                                                          {GradCompression::fp16, "fp16"},
                                                          {GradCompression::bf16, "bf16"}}};
};
template <>
struct ChoiceNames<Allocator> {
  static constexpr ChoiceTable<Allocator, 3> table{
      {{Allocator::keep, "keep"}, {Allocator::system, "system"}, {Allocator::map, "map"}}};
};
template <>
struct ChoiceNames<OneDnn> {
  static constexpr ChoiceTable<OneDnn, 3> table{
      {{OneDnn::automatic, "auto"}, {OneDnn::on, "on"}, {OneDnn::off, "off"}}};
};
template <>
struct ChoiceNames<BindCores> {
  static constexpr ChoiceTable<BindCores, 3> table{
      {{BindCores::automatic, "auto"}, {BindCores::on, "on"}, {BindCores::off, "off"}}};
};
template <>
struct ChoiceNames<OptimizerKind> {
  static constexpr ChoiceTable<OptimizerKind, 2> table{
      {{OptimizerKind::sgd, "sgd"}, {OptimizerKind::adamw, "adamw"}}};
};
template <>
struct ChoiceNames<ScheduleKind> {
  static constexpr ChoiceTable<ScheduleKind, 3> table{{{ScheduleKind::constant, "constant"},
                                                       {ScheduleKind::cosine, "cosine"},
                                                       {ScheduleKind::step, "step"}}};
};
template <>
struct ChoiceNames<OnNonfinite> {
  static constexpr ChoiceTable<OnNonfinite, 2> table{
      {{OnNonfinite::stop, "stop"}, {OnNonfinite::skip, "skip"}}};
};
template <>
struct ChoiceNames<ProgressStyle> {
  static constexpr ChoiceTable<ProgressStyle, 4> table{{{ProgressStyle::automatic, "auto"},
                                                        {ProgressStyle::bar, "bar"},
                                                        {ProgressStyle::plain, "plain"},
                                                        {ProgressStyle::off, "off"}}};
};
template <>
struct ChoiceNames<WhenBehind> {
  static constexpr ChoiceTable<WhenBehind, 2> table{{{WhenBehind::skip, "skip"}, {WhenBehind::wait, "wait"}}};
};
template <>
struct ChoiceNames<OnError> {
  static constexpr ChoiceTable<OnError, 2> table{{{OnError::warn, "warn"}, {OnError::fail, "fail"}}};
};

template <>
struct ChoiceNames<Precision> {
  static constexpr ChoiceTable<Precision, 4> table{{{Precision::fp32, "fp32"},
                                                    {Precision::bf16, "bf16"},
                                                    {Precision::fp16, "fp16"},
                                                    {Precision::automatic, "auto"}}};
};
template <>
struct ChoiceNames<LossScaling> {
  static constexpr ChoiceTable<LossScaling, 3> table{
      {{LossScaling::automatic, "auto"}, {LossScaling::on, "on"}, {LossScaling::off, "off"}}};
};
template <>
struct ChoiceNames<Recompute> {
  static constexpr ChoiceTable<Recompute, 2> table{{{Recompute::none, "none"}, {Recompute::blocks, "blocks"}}};
};

template <>
struct ChoiceNames<BertTask> {
  static constexpr ChoiceTable<BertTask, 2> table{{{BertTask::maskedLm, "masked_lm"}, {BertTask::classify, "classify"}}};
};

template <>
struct ChoiceNames<RopeScaling> {
  static constexpr ChoiceTable<RopeScaling, 3> table{
      {{RopeScaling::none, "none"}, {RopeScaling::linear, "linear"}, {RopeScaling::llama3, "llama3"}}};
};

template <>
struct ChoiceNames<Activation> {
  static constexpr ChoiceTable<Activation, 2> table{{{Activation::gelu, "gelu"}, {Activation::geluTanh, "gelu_tanh"}}};
};
template <>
struct ChoiceNames<WeightsFormat> {
  static constexpr ChoiceTable<WeightsFormat, 2> table{
      {{WeightsFormat::pt, "pt"}, {WeightsFormat::safetensors, "safetensors"}}};
};
template <>
struct ChoiceNames<PipelineSchedule> {
  static constexpr ChoiceTable<PipelineSchedule, 2> table{
      {{PipelineSchedule::oneFOneB, "1f1b"}, {PipelineSchedule::gpipe, "gpipe"}}};
};

// The job file's name of a value ("channels_last" for
// MemoryLayout::channelsLast).
template <class E>
constexpr std::string_view choiceName(E value) {
  for (const auto& [v, name] : ChoiceNames<E>::table) {
    if (v == value) return name;
  }
  return "?";  // not reached: every value has a row
}

// The value named `name`, or nothing if no value has that name.
template <class E>
std::optional<E> choiceFromName(std::string_view name) {
  for (const auto& [v, n] : ChoiceNames<E>::table) {
    if (n == name) return v;
  }
  return std::nullopt;
}

// All names of E, in the table's order.
template <class E>
std::vector<std::string> choiceNames() {
  std::vector<std::string> names;
  for (const auto& row : ChoiceNames<E>::table) names.emplace_back(row.second);
  return names;
}

}  // namespace cohort
