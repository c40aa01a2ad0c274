// bench/step: one process's training step, without cohort's trainer: a
// plain LibTorch loop over cohort's model against a plain PyTorch loop
// (bench/peers/step.py), under each allocator policy and each way of
// handing over gradients. It isolates what a rank's speed depends on from
// the rest of cohort (data loader, exchange, monitoring).
//
// Each configuration runs in a fresh process (an allocator policy cannot be
// undone), LibTorch and PyTorch alternating --repeat times:
//   allocator system   glibc's defaults
//             keep     freed memory kept (cohort's compute.allocator: keep)
//             tcmalloc, jemalloc   preloaded on both sides, as PyTorch's CPU
//                      launcher does (bench/launch_env.py)
//   grads     none     gradients undefined before backward (set_to_none)
//             keep     gradients kept and added into (PyTorch 1.13's zero_grad())
//             bucket   gradients are views into one flat tensor zeroed each
//                      step, as cohort's DDP engine keeps them (LibTorch only)
// Both sides start with bench/launch_env.py's environment for the allocator
// and threads, and a pair whose sides report another allocator or other
// thread counts stops the benchmark (bench/launch_env.h).
// Prints the CPU, then images/s and minor page faults per step.
//
//   cohort_bench_step [--arch resnet18] [--size 32] [--batch 32] [--threads 1]
//                     [--steps 20] [--repeat 2]

#include <fmt/format.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_paths.h"
#include "cohort/core/cpu.h"
#include "cohort/core/env.h"
#include "launch_env.h"
#include "cohort/models/model.h"
#include "cohort/core/malloc_policy.h"
#include "cohort/train/compute.h"
#include "util/process.h"

using namespace cohort;

namespace {

struct Options {
  std::string arch = "resnet18";
  int size = 32, batch = 32, threads = 1, steps = 20, warmup = 5, repeat = 2;
  std::string grads = "none", allocator = "system";
  bool child = false;
};

long minorFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// The loop of bench/peers/step.py, in LibTorch.
int runChild(const Options& o) {
  if (o.allocator == "keep" && !keepFreedMemory()) return 3;
  at::set_num_threads(o.threads);
  at::set_num_interop_threads(1);  // as cohort's ranks, and the peer
  torch::manual_seed(0);
  ModelConfig mc;
  mc.arch = choiceFromName<ModelArch>(o.arch).value();
  mc.numClasses = 1000;
  mc.memoryFormat = MemoryLayout::contiguous;  // PyTorch's default
  auto model = models::createModel(mc, {3, o.size, o.size});
  auto params = model->parameters();
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.01).momentum(0.9));
  at::Tensor flat;
  if (o.grads == "bucket") {
    int64_t total = 0;
    for (const auto& p : params) total += p.numel();
    flat = torch::zeros({total});
    int64_t offset = 0;
    for (auto& p : params) {
      p.mutable_grad() = flat.narrow(0, offset, p.numel()).view(p.sizes());
      offset += p.numel();
    }
  }
  const at::Tensor x = torch::randn({o.batch, 3, o.size, o.size});
  const at::Tensor y = torch::randint(0, 1000, {o.batch}, torch::kLong);
  long faults = 0;
  auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < o.warmup + o.steps; ++step) {
    if (step == o.warmup) {
      faults = minorFaults();
      start = std::chrono::steady_clock::now();
    }
    at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    if (o.grads == "bucket") {
      torch::NoGradGuard noGrad;
      flat.zero_();
    } else if (o.grads == "none") {
      for (auto& p : params) p.mutable_grad() = at::Tensor();
    } else {
      opt.zero_grad();  // LibTorch 1.13: zeroes each gradient in place
    }
    loss.backward();
    opt.step();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << nlohmann::json{{"peer", "libtorch_step"},
                              {"images_per_s", o.batch * o.steps / s},
                              {"faults_per_step", double(minorFaults() - faults) / o.steps},
                              {"malloc", env::servingMalloc().name},
                              {"intra_op_threads", at::get_num_threads()},
                              {"inter_op_threads", at::get_num_interop_threads()}}
                   .dump()
            << std::endl;
  return 0;
}

nlohmann::json lastJson(const test::ProcessResult& r, const std::string& what) {
  // The last line that is a JSON object.
  const std::string out = "\n" + r.out;
  const auto at = out.rfind("\n{");
  if (r.exitCode != 0 || at == std::string::npos) {
    std::cerr << what << " failed:\n" << r.describe() << "\n";
    std::exit(1);
  }
  return nlohmann::json::parse(out.substr(at + 1));
}

std::vector<std::string> common(const Options& o) {
  return {"--arch",  o.arch,        "--size",  std::to_string(o.size),
          "--batch", std::to_string(o.batch), "--threads", std::to_string(o.threads),
          "--steps", std::to_string(o.steps), "--warmup",  std::to_string(o.warmup)};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool more = i + 1 < argc;
    if (a == "--child") o.child = true;
    else if (a == "--arch" && more) o.arch = argv[++i];
    else if (a == "--size" && more) o.size = std::atoi(argv[++i]);
    else if (a == "--batch" && more) o.batch = std::atoi(argv[++i]);
    else if (a == "--threads" && more) o.threads = std::atoi(argv[++i]);
    else if (a == "--steps" && more) o.steps = std::atoi(argv[++i]);
    else if (a == "--warmup" && more) o.warmup = std::atoi(argv[++i]);
    else if (a == "--repeat" && more) o.repeat = std::max(1, std::atoi(argv[++i]));
    else if (a == "--grads" && more) o.grads = argv[++i];
    else if (a == "--allocator" && more) o.allocator = argv[++i];
    else {
      std::cerr << "usage: cohort_bench_step [--arch A] [--size PX] [--batch B] [--threads T] "
                   "[--steps N] [--warmup N] [--repeat N]\n";
      return 2;
    }
  }
  if (o.child) return runChild(o);

  std::cout << "cpu: " << describe(cpuInfo()) << "\n"
            << fmt::format("{} {} px, batch {}, {} thread(s), {} steps after {} warm-up\n\n", o.arch,
                           o.size, o.batch, o.threads, o.steps, o.warmup)
            << fmt::format("{:<9} {:<7} | {:>13} {:>14} | {:>13} {:>14} | {:>7}\n", "allocator",
                           "grads", "LibTorch img/s", "faults/step", "PyTorch img/s", "faults/step",
                           "ratio");
  std::vector<nlohmann::json> lines;
  for (const std::string allocator : {"system", "keep", "tcmalloc", "jemalloc"}) {
    // glibc's policy (mallopt) for system and keep; a preloaded allocator otherwise.
    const bool glibc = allocator == "system" || allocator == "keep";
    const std::string policy = glibc ? allocator : "system";
    std::map<std::string, std::string> env;
    try {
      env = bench::launchEnvironment(glibc ? "glibc" : allocator, o.threads);
    } catch (const std::exception& e) {
      std::cerr << allocator << ": skipped: " << e.what() << "\n";  // not installed: the other rows stand
      continue;
    }
    for (const std::string grads : {"none", "keep", "bucket"}) {
      double lt = 0, pt = 0, ltFaults = 0, ptFaults = 0;
      const bool peer = grads != "bucket";
      for (int k = 0; k < o.repeat; ++k) {
        auto args = common(o);
        args.insert(args.begin(), {argv[0], "--child", "--grads", grads, "--allocator", policy});
        const auto c = lastJson(test::run(args, env, std::chrono::minutes(30)), "LibTorch loop");
        lt += c["images_per_s"].get<double>() / o.repeat;
        ltFaults += c["faults_per_step"].get<double>() / o.repeat;
        if (!peer) continue;
        auto pargs = common(o);
        pargs.insert(pargs.begin(), {COHORT_PYTHON, std::string(COHORT_SOURCE_DIR) + "/bench/peers/step.py",
                                     "--grads", grads, "--allocator", policy});
        const auto p = lastJson(test::run(pargs, env, std::chrono::minutes(30)), "PyTorch loop");
        try {
          bench::requireSameLaunch(c, p.value("launch", nlohmann::json()), allocator + " " + grads);
        } catch (const std::exception& e) {
          std::cerr << e.what() << "\n";
          return 1;
        }
        pt += p["images_per_s"].get<double>() / o.repeat;
        ptFaults += p["faults_per_step"].get<double>() / o.repeat;
      }
      std::cout << fmt::format("{:<9} {:<7} | {:>13.1f} {:>14.0f} | ", allocator, grads, lt, ltFaults)
                << (peer ? fmt::format("{:>13.1f} {:>14.0f} | {:>6.2f}x", pt, ptFaults, lt / pt)
                         : fmt::format("{:>13} {:>14} | {:>7}", "-", "-", "-"))
                << std::endl;
      lines.push_back({{"bench", "step"}, {"arch", o.arch}, {"size", o.size}, {"batch", o.batch},
                       {"threads", o.threads}, {"allocator", allocator}, {"grads", grads},
                       {"libtorch_images_per_s", lt}, {"libtorch_faults_per_step", ltFaults},
                       {"pytorch_images_per_s", peer ? nlohmann::json(pt) : nlohmann::json()},
                       {"pytorch_faults_per_step", peer ? nlohmann::json(ptFaults) : nlohmann::json()}});
    }
  }
  for (const auto& l : lines) std::cout << l.dump() << "\n";
  return 0;
}
