// Encrypted files (src/security/sealed.cc), through readSealedFile with a
// fixed key: the header's sizes and key id, the chunk layout, truncation and
// authentication.
//
// Input: the file's bytes, at step-1/model.bin (the label its seeds were
// sealed for, by an independent writer: fuzz/make_sealed_seeds.py).
// Whatever opens must open again to the same bytes.

#include "cohort/security/sealed.h"
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
  return 0;
}
