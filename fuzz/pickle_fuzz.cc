// The pickle reader of PyTorch files (src/ckpt/pickle.cc): data.pkl of a
// torch.save archive, as loadStateDict hands it over.
//
// Input: the pickle bytes. Storages come from a loader that, like
// loadStateDict's, refuses a size the archive does not hold (here: more
// than 4096 elements).

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "ckpt/detail/pickle.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort;
  const std::string pickled = fuzz::asString(data, size);
  const std::string origin = "fuzz/data.pkl";
  auto load = [&](const std::string& key, at::ScalarType dtype, int64_t numel) {
    if (numel < 0 || numel > 4096) {
      throw DataError(fmt::format("{}: storage data/{} claims {} elements but holds 4096", origin,
                                  key, numel));
    }
    return at::zeros({numel}, at::TensorOptions().dtype(dtype));
  };
  ckpt::detail::ValuePtr root;
  // loadStateDict turns LibTorch's errors into DataError the same way.
  fuzz::expectInputError(origin, [&] {
    try {
      root = ckpt::detail::unpickle(pickled, load, origin);
    } catch (const c10::Error& e) {
      throw DataError(fmt::format("{}: malformed state dict: {}", origin, e.what_without_backtrace()));
    }
  });
  ckpt::detail::dismantle(std::move(root));
  return 0;
}
