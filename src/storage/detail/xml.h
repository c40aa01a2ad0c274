#pragma once

// The two XML documents the blob client reads: a List Blobs page and an
// error body. A small scanner for their fixed shapes, not a general parser.

#include <cstdint>
#include <string>
#include <vector>

namespace cohort::storage::detail {

struct ListedBlob {
  std::string name;  // full name in the container
  int64_t size = 0;
};

struct ListPage {
  std::vector<ListedBlob> blobs;
  std::string nextMarker;  // empty: the last page
};

// Parses <EnumerationResults>: each <Blob>'s <Name> (percent-decoded when
// marked Encoded="true") and <Content-Length>, and <NextMarker>. Throws
// std::runtime_error when the document is not such a page.
ListPage parseListPage(const std::string& xml);

// The <Code> of an Azure error body; empty when there is none.
std::string errorCodeFromBody(const std::string& xml);

// Replaces &amp; &lt; &gt; &quot; &apos; and numeric character references.
std::string xmlUnescape(const std::string& s);

}  // namespace cohort::storage::detail
