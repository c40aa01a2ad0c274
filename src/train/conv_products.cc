// chooseConvProducts (train/compute.h): which convolutions run as products
// over their unfolded input (models/gemm_conv.h), chosen per shape by
// timing both ways at start.

#include <fmt/format.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "cohort/core/log.h"
#include "cohort/models/model.h"
#include "cohort/train/compute.h"
#include "cohort/train/precision.h"
#include "models/gemm_conv.h"

namespace cohort::train {

std::string chooseConvProducts(models::Model& model, int64_t batch, int64_t channels, int64_t height,
                               int64_t width, const comm::Comm& comm, Precision precision) {
  models::setUnfoldedChoices({});
  bool convolutional = false;
  for (const auto& p : model.parameters()) convolutional = convolutional || p.dim() == 4;
  if (!convolutional) return "none (no convolution weights)";
  // Leaves the model as it found it: eval mode moves no BatchNorm
  // statistics; the generator that drew the batches is put back.
  auto generator = at::detail::getDefaultCPUGenerator();
  const at::Tensor rng = generator.get_state();
  const bool wasTraining = model.is_training();
  std::vector<models::UnfoldedCandidate> candidates;
  std::vector<double> seconds;
  try {
    model.eval();
    const auto options = model.parameters().front().options().requires_grad(false);
    const at::Tensor x = torch::randn({batch, channels, height, width}, options);
    candidates = models::recordUnfoldedCandidates([&] {
      torch::NoGradGuard noGrad;
      AutocastScope autocast(precision, x.device());
      model.forward(x);
    });
    model.train(wasTraining);
    // A few passes each: the shapes are small, and their times differ by
    // more than a few percent where it matters (docs/performance.md).
    constexpr int kRounds = 3;
    for (const auto& c : candidates) {
      const std::array<double, 2> t = models::timeUnfoldedCandidate(c, kRounds);
      seconds.push_back(t[0]);
      seconds.push_back(t[1]);
    }
  } catch (...) {
    model.train(wasTraining);
    generator.set_state(rng);
    throw;
  }
  generator.set_state(rng);
  // Every rank measured at once, as they will train: the mean of their
  // times decides, alike on every rank (an allreduce's sum is). Every rank
  // met the same shapes: they run the same model on the same batch size.
  at::Tensor times = torch::tensor(seconds, torch::kFloat64);
  if (comm.worldSize > 1 && times.numel() > 0) comm::allreduceSum(comm, times, "unfolded convolution times");
  // The unfolded product must win by kMargin: a near tie is noise, and
  // the choice changes the last bits of results.
  constexpr double kMargin = 0.03;
  std::map<std::vector<int64_t>, bool> choices;
  std::vector<std::string> kept;
  int64_t unfolded = 0;
  for (size_t k = 0; k < candidates.size(); ++k) {
    const double module = times[2 * k].item<double>(), product = times[2 * k + 1].item<double>();
    const bool take = product < (1 - kMargin) * module;
    choices[candidates[k].key] = take;
    unfolded += take ? 1 : 0;
    log::debug("convolution {}: {:.3f} ms, unfolded {:.3f} ms: {}", candidates[k].description,
               1000 * module / comm.worldSize, 1000 * product / comm.worldSize, take ? "unfolded" : "convolution");
    if (!take) kept.push_back(fmt::format("{} (unfolded {:.2f}x)", candidates[k].description, module / product));
  }
  models::setUnfoldedChoices(std::move(choices));
  if (candidates.empty()) return "none (no convolution the rule takes)";
  return fmt::format("measured: {} of {} shapes unfolded{}{}", unfolded, candidates.size(),
                     kept.empty() ? "" : "; convolution for ", fmt::join(kept, ", "));
}

}  // namespace cohort::train
