#pragma once

// Hugging Face's BERT layouts (transformers' BertForMaskedLM,
// BertForSequenceClassification, and the BertForPreTraining and BertModel
// files published checkpoints come in) and cohort's bert (models/bert.h),
// whose names are BertForMaskedLM's and BertForSequenceClassification's.
// A file read into cohort's bert (hfBertAsCohort) loses what the model does
// not have: the position_ids buffer, the next-sentence head
// (cls.seq_relationship), the pooler for masked language modelling, the
// masked-LM head for classification; BertModel's names get the "bert."
// prefix and TensorFlow-era LayerNorm.gamma/beta become weight/bias.
// docs/models.md, "Hugging Face BERT".

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cohort/ckpt/state_dict.h"
#include "cohort/models/bert.h"

namespace cohort::models {

// config.json of a model of `o` as transformers writes it:
// BertForMaskedLM, or BertForSequenceClassification with num_labels.
nlohmann::json hfBertConfig(const BertOptions& o);

// The model a BERT config.json describes (model_type bert, hidden_act
// gelu, absolute positions). Throws DataError naming `origin` and the key.
BertOptions bertOptionsOf(const nlohmann::json& config, const std::string& origin);

// Checks `theirs` (bertOptionsOf a config.json at `origin`) against the
// job's model `ours`. Throws DataError naming the file, the key, its value
// and the model.* key to set.
void checkHfBertConfig(const BertOptions& theirs, const BertOptions& ours, const std::string& origin);

// `hf` in cohort's names for a model of `o` (see above). `origin` names the
// file in errors.
std::unique_ptr<ckpt::TensorSource> hfBertAsCohort(std::unique_ptr<ckpt::TensorSource> hf, const BertOptions& o,
                                                   std::string origin);

}  // namespace cohort::models
