// dataset.json of a packed dataset (src/data/dataset_manifest.cc).
//
// Input: the JSON text. A manifest that parses must survive the round trip
// through datasetManifestJson unchanged.

#include "cohort/data/dataset_manifest.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort;
  const std::string text = fuzz::asString(data, size);
  data::DatasetManifest m;
  if (!fuzz::expectInputError("fuzz/dataset.json",
                              [&] { m = data::parseDatasetManifest(text, "fuzz/dataset.json"); })) {
    return 0;
  }
  std::string written;
  fuzz::require(fuzz::expectInputError("", [&] { written = data::datasetManifestJson(m); }),
                "a parsed manifest cannot be written");
  data::DatasetManifest again;
  fuzz::require(fuzz::expectInputError("", [&] { again = data::parseDatasetManifest(written, "again"); }),
                "a written manifest does not parse:\n" + written);
  fuzz::require(data::datasetManifestJson(again) == written, "the round trip changed the manifest");
  return 0;
}
