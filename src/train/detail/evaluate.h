#pragma once

// Evaluation: every data rank scores its split of the evaluation set (a
// pipeline's stages pass each batch on, and its last stage scores it); the
// sums are allreduced, so every rank returns the same figures.

#include <cstdint>

#include "cohort/config/choices.h"
#include "cohort/data/loader.h"
#include "cohort/data/sampler.h"
#include "cohort/parallel/plan.h"
#include "cohort/monitor/metrics.h"

namespace cohort::train::detail {

// Top-1, top-5 (top-k for fewer classes), mean cross-entropy and the number
// of samples over the whole evaluation set, with the model in eval mode (the
// caller puts it back in training mode). For a language model every token
// of a window is a prediction: the loss and accuracies are per token, and
// the record holds the token count and the perplexity, exp(loss). `step`, `epoch` and `seconds` of the
// record are the caller's to fill in. Forward passes run in `precision`
// (fp32, bf16 or fp16, as training does), the loss in float32.
monitor::EvalRecord evaluate(parallel::Plan& plan, data::BatchLoader& loader,
                             const data::DistributedSampler& sampler, Precision precision);

}  // namespace cohort::train::detail
