// IDX files (src/data/idx.cc), raw or gzip-compressed.
//
// Input: one IDX file. As an images file (3 dimensions) it is paired with a
// valid labels file of as many samples; as a labels file (1 dimension) with
// a valid images file of as many 2x2 images; anything else goes in as both.
// A dataset that opens must read its first and last samples.

#include <vector>

#include "cohort/data/dataset.h"
#include "fuzz_util.h"

namespace {

std::string idxHeader(int dims, const std::vector<uint32_t>& sizes) {
  std::string h = {0, 0, 0x08, static_cast<char>(dims)};
  for (uint32_t s : sizes) {
    for (int b = 3; b >= 0; --b) h.push_back(static_cast<char>((s >> (8 * b)) & 0xFF));
  }
  return h;
}

uint32_t count(const std::string& in) {
  if (in.size() < 8) return 1;
  uint32_t n = 0;
  for (int b = 4; b < 8; ++b) n = (n << 8) | static_cast<uint8_t>(in[b]);
  return std::min<uint32_t>(n, 1u << 16);  // the partner file stays small
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort;
  const std::string input = fuzz::asString(data, size);
  const auto images = fuzz::scratchDir() / "images-idx3-ubyte";
  const auto labels = fuzz::scratchDir() / "labels-idx1-ubyte";
  const uint32_t n = count(input);
  if (input.size() > 3 && input[3] == 1) {
    fuzz::writeFile(labels, input);
    fuzz::writeFile(images, idxHeader(3, {n, 2, 2}) + std::string(size_t{n} * 4, '\x7f'));
  } else if (input.size() > 3 && input[3] == 3) {
    fuzz::writeFile(images, input);
    fuzz::writeFile(labels, idxHeader(1, {n}) + std::string(n, '\x01'));
  } else {
    fuzz::writeFile(images, input);
    fuzz::writeFile(labels, input);
  }
  std::shared_ptr<data::Dataset> ds;
  if (!fuzz::expectInputError("-idx", [&] { ds = data::openIdx(images, labels, 0, 10); })) return 0;
  fuzz::require(ds->size() > 0, "an IDX dataset opened with no samples");
  std::vector<float> sample(static_cast<size_t>(ds->shape().numel()));
  for (int64_t i : {int64_t{0}, ds->size() - 1}) {
    const int64_t label = ds->read(i, sample.data());
    fuzz::require(label >= 0 && label < 10, "a label outside [0, num_classes)");
  }
  return 0;
}
