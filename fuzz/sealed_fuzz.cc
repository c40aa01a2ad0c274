// Encrypted files (src/security/sealed.cc), through readSealedFile and the
// random-access SealedReader with a fixed key: the header's sizes and key
// id, the chunk layout of both format versions, truncation and
// authentication.
//
// Input: the file's bytes, at step-1/model.bin (the label its seeds were
// sealed for, by an independent writer: fuzz/make_sealed_seeds.py).
// Whatever opens must open again to the same bytes, and read at random
// offsets to the same bytes as a whole read.

#include "cohort/security/sealed.h"

#include <algorithm>
#include "fuzz_util.h"

namespace {

const cohort::security::Keyring& keyring() {
  static const cohort::security::Keyring ring{
      cohort::security::parseKey("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
                                 "fuzz key"),
      std::nullopt};
  return ring;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort;
  const auto dir = fuzz::scratchDir() / "step-1";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "model.bin").string();
  fuzz::writeFile(path, fuzz::asString(data, size));
  std::string plain;
  if (!fuzz::expectInputError("model.bin", [&] { plain = security::readSealedFile(path, &keyring()); })) {
    return 0;
  }
  fuzz::require(fuzz::expectInputError("", [&] { security::verifySealedFile(path, &keyring()); }),
                "a file that opens does not verify");
  fuzz::require(security::readSealedFile(path, &keyring()) == plain, "two reads differ");
  const std::string file = fuzz::asString(data, size);
  const security::SealedReader reader(
      [&](uint64_t o, uint64_t n) { return file.substr(o, n); }, file.size(), "step-1/model.bin",
      &keyring(), "model.bin");
  fuzz::require(reader.plainBytes() == plain.size(), "the reader sees another size");
  for (uint64_t at : {uint64_t{0}, plain.size() / 3, plain.size() / 2}) {
    const uint64_t n = std::min<uint64_t>(plain.size() - at, 70);
    fuzz::require(reader.read(at, n) == plain.substr(at, n), "a random read differs");
  }
  return 0;
}
