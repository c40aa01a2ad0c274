// The command line: subcommands, help, version and exit codes.

#include <gtest/gtest.h>

#include "util/jobs.h"

namespace cohort {
namespace {

TEST(Cli, VersionAndHelp) {
  auto v = test::cohort({"--version"});
  EXPECT_EQ(v.exitCode, 0);
  EXPECT_NE(v.out.find("cohort 0."), std::string::npos) << v.out;
  auto h = test::cohort({"help"});
  EXPECT_EQ(h.exitCode, 0);
  for (const char* cmd : {"run", "worker", "validate"}) {
    EXPECT_NE(h.out.find(cmd), std::string::npos) << h.out;
  }
  auto hr = test::cohort({"help", "run"});
  EXPECT_EQ(hr.exitCode, 0);
  EXPECT_NE(hr.out.find("--procs"), std::string::npos) << hr.out;
  for (const char* cmd : {"run", "worker", "validate"}) {
    auto r = test::cohort({cmd, "--help"});
    EXPECT_EQ(r.exitCode, 0) << cmd;
    EXPECT_NE(r.out.find("--set"), std::string::npos) << r.out;
  }
}

TEST(Cli, BadArgumentsExitTwo) {
  EXPECT_EQ(test::cohort({"frobnicate"}).exitCode, 2);
  EXPECT_EQ(test::cohort({"run"}).exitCode, 2);  // no job file
  EXPECT_EQ(test::cohort({"run", "job.yaml", "--procs", "0"}).exitCode, 2);
  EXPECT_EQ(test::cohort({"help", "nothing"}).exitCode, 2);
}

TEST(Cli, ValidatePrintsTheResolvedJob) {
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("v"));
  auto r = test::cohort({"validate", dir.file("job.yaml"), "--set", "training.epochs=4"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.out.find("epochs: 4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bucket_cap_mb: 25.0"), std::string::npos) << "defaults filled in";
  // The printed job is itself a valid job file.
  test::writeText(dir.file("resolved.yaml"), r.out);
  auto again = test::cohort({"validate", dir.file("resolved.yaml")});
  EXPECT_EQ(again.exitCode, 0) << again.describe();
  EXPECT_EQ(again.out, r.out);
}

TEST(Cli, ValidateReportsBadInputWithLocation) {
  test::TempDir dir;
  std::string yaml = test::tinyJobYaml("v");
  yaml.replace(yaml.find("  epochs: 1"), 11, "  epochs: many");
  test::writeText(dir.file("job.yaml"), yaml);
  auto r = test::cohort({"validate", dir.file("job.yaml")});
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_NE(r.err.find(dir.file("job.yaml") + ":21:11: training.epochs: expected an integer, got "
                                              "'many'"),
            std::string::npos)
      << r.err;
  auto missing = test::cohort({"validate", dir.file("nope.yaml")});
  EXPECT_EQ(missing.exitCode, 2);
  EXPECT_NE(missing.err.find("job file not found"), std::string::npos);
}

}  // namespace
}  // namespace cohort
