// The safetensors header (src/ckpt/safetensors_header.cc): a whole file as
// SafetensorsFile reads it, its length and JSON checked against the data.
//
// Input: the file's bytes. A length that does not fit is what the reader
// refuses before parsing; the rest must parse or be refused with DataError
// naming the file, and what parses must hold every byte of the data once.

#include <cstring>

#include "cohort/ckpt/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort;
  if (size < 8) return 0;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > size - 8 || n > ckpt::kSafetensorsMaxHeader) return 0;
  const std::string origin = "fuzz.safetensors";
  const std::string_view header(reinterpret_cast<const char*>(data) + 8, n);
  const uint64_t dataBytes = size - 8 - n;
  ckpt::SafetensorsHeader h;
  if (!fuzz::expectInputError(origin, [&] { h = ckpt::parseSafetensorsHeader(header, dataBytes, origin); })) {
    return 0;
  }
  uint64_t covered = 0;
  for (const auto& e : h.tensors) {
    fuzz::require(e.end >= e.begin && e.end <= dataBytes, "a tensor outside the data: " + e.name);
    covered += e.end - e.begin;
  }
  fuzz::require(covered == dataBytes, "bytes of the data in no tensor, or in two");
  return 0;
}
