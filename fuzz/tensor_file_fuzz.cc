// cohort's tensor files (src/ckpt/tensor_file.cc), through readTensorFile
// and readTensorFileInfo.
//
// Input: one tensor file. A file that reads must list the same tensors
// both ways, each of the size its header claims.

#include <ATen/ATen.h>

#include "cohort/ckpt/tensor_file.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort;
  const auto path = fuzz::scratchDir() / "fuzz.tensors";
  fuzz::writeFile(path, fuzz::asString(data, size));
  std::vector<ckpt::TensorInfo> infos;
  if (!fuzz::expectInputError(path.string(), [&] { infos = ckpt::readTensorFileInfo(path.string()); })) {
    return 0;
  }
  ckpt::TensorFile f;
  fuzz::require(fuzz::expectInputError(path.string(), [&] { f = ckpt::readTensorFile(path.string()); }),
                "readTensorFileInfo accepted a file readTensorFile refuses");
  fuzz::require(f.tensors.size() == infos.size(), "the two readers list different tensors");
  for (size_t i = 0; i < infos.size(); ++i) {
    const at::Tensor& t = f.tensors[i].second;
    fuzz::require(static_cast<uint64_t>(t.nbytes()) == infos[i].nbytes,
                  "tensor '" + infos[i].name + "' does not hold the bytes its header claims");
  }
  return 0;
}
