// A checkpoint's manifest.json (src/ckpt/manifest.cc), through readManifest.
//
// Input: the file's text. A manifest that reads must survive the round trip
// through writeManifest.

#include "cohort/ckpt/manifest.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort;
  const auto dir = fuzz::scratchDir() / "step-1";
  std::filesystem::create_directories(dir);
  fuzz::writeFile(dir / "manifest.json", fuzz::asString(data, size));
  ckpt::Manifest m;
  if (!fuzz::expectInputError("manifest.json", [&] { m = ckpt::readManifest(dir.string()); })) {
    return 0;
  }
  const std::string text = ckpt::toJson(m).dump(2);
  fuzz::writeFile(dir / "manifest.json", text);
  ckpt::Manifest again;
  fuzz::require(fuzz::expectInputError("", [&] { again = ckpt::readManifest(dir.string()); }),
                "a written manifest does not read back:\n" + text);
  fuzz::require(ckpt::toJson(again).dump(2) == text, "the round trip changed the manifest");
  return 0;
}
