// docs/job-spec.md documents every key of the schema, with its default.

#include <gtest/gtest.h>

#include "cohort/config/load.h"
#include "util/jobs.h"

namespace cohort {
namespace {

TEST(JobSpecDocs, EveryKeyIsDocumentedWithItsDefault) {
  const std::string doc = test::readText(test::sourceDir() + "/docs/job-spec.md");
  ASSERT_FALSE(doc.empty()) << "docs/job-spec.md is missing";
  const auto keys = describeJobKeys();
  ASSERT_GT(keys.size(), 50u);
  for (const auto& k : keys) {
    // Each key has a table row: | `path` | type | default | description |
    const std::string cell = "| `" + k.path + "` |";
    const size_t row = doc.find(cell);
    ASSERT_NE(row, std::string::npos) << "docs/job-spec.md has no row for " << k.path;
    const std::string line = doc.substr(row, doc.find('\n', row) - row);
    EXPECT_NE(line.find("| " + k.type + " |"), std::string::npos)
        << k.path << ": type should be " << k.type << "\n" << line;
    EXPECT_NE(line.find("`" + k.defaultValue + "`"), std::string::npos)
        << k.path << ": default should be " << k.defaultValue << "\n" << line;
  }
}

}  // namespace
}  // namespace cohort
