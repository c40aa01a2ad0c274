// What the blob client parses from the blob service (src/storage/detail/
// xml.cc): a List Blobs page and an error body's <Code>.
//
// parseListPage throws std::runtime_error for a document that is not a page
// (xml.h), which the client turns into a StorageError naming the request;
// every other outcome is a finding. A listed blob's size is never negative.

#include <stdexcept>

#include "fuzz_util.h"
#include "storage/detail/xml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort;
  using namespace cohort::storage::detail;
  const std::string xml = fuzz::asString(data, size);
  try {
    const ListPage page = parseListPage(xml);
    for (const auto& b : page.blobs) {
      fuzz::require(b.size >= 0, "a listed blob of negative size " + std::to_string(b.size));
    }
  } catch (const std::runtime_error&) {
    // The documented outcome for a malformed page.
  } catch (const std::exception& e) {
    fuzz::finding(std::string("parseListPage threw ") + typeid(e).name() + ": " + e.what());
  }
  try {
    errorCodeFromBody(xml);
    xmlUnescape(xml);
  } catch (const std::exception& e) {
    fuzz::finding(std::string("errorCodeFromBody/xmlUnescape threw: ") + e.what());
  }
  return 0;
}
