// The command line: subcommands, help, version and exit codes.

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <regex>

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

// The maps of process `pid`: the libraries it has loaded.
std::string mapsOf(pid_t pid) { return test::readText("/proc/" + std::to_string(pid) + "/maps"); }

// `cohort` runs the commands without LibTorch itself, never loading it; the
// launcher of `cohort run` among them. The rest goes to cohort-torch.
TEST(Cli, TheFrontEndLoadsNoLibTorchAndHandsTheOtherCommandsToCohortTorch) {
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("front"));
  // LD_DEBUG=libs: the dynamic loader names each library it loads (stderr).
  const auto v = test::cohort({"validate", dir.file("job.yaml")}, {{"LD_DEBUG", "libs"}});
  EXPECT_EQ(v.exitCode, 0) << v.describe();
  EXPECT_NE(v.err.find("libyaml-cpp"), std::string::npos) << "no loader output: " << v.err.substr(0, 2000);
  EXPECT_EQ(v.err.find("libtorch"), std::string::npos) << "cohort validate loaded LibTorch";
  const auto w = test::cohort({"worker", "--help"}, {{"LD_DEBUG", "libs"}});
  EXPECT_EQ(w.exitCode, 0) << w.describe();
  EXPECT_NE(w.out.find("--resume"), std::string::npos) << w.out;
  EXPECT_NE(w.err.find("libtorch_cpu"), std::string::npos) << "cohort worker ran without LibTorch?";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"help", "export"}, {"ckpt", "consolidate", "--help"}, {"serve", "--help"}}) {
    const auto r = test::cohort(args);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    EXPECT_NE(r.out.find("Usage:"), std::string::npos) << r.out;
  }

  // While `cohort run` trains (its rank 0 held up after step 2), the
  // launcher has no LibTorch mapped and its children have: the fork server
  // its ranks are forked from (launch/fork_server.h) and the 2 ranks.
  test::Process run({test::cohortBin(), "run", dir.file("job.yaml"), "--procs", "2", "--run-dir", dir.file("run")},
                    {{"COHORT_FAULT", "sleep30@rank0:step2"}});
  std::vector<pid_t> ranks;
  ASSERT_TRUE(test::waitUntil(
      [&] {
        ranks = run.children();
        if (ranks.size() != 3) return false;
        for (pid_t r : ranks) {
          if (mapsOf(r).find("libtorch_cpu") == std::string::npos) return false;
        }
        return true;
      },
      std::chrono::seconds(60)))
      << run.stderrSoFar();
  EXPECT_EQ(mapsOf(run.pid()).find("libtorch"), std::string::npos) << "the launcher loaded LibTorch";
  EXPECT_NE(mapsOf(run.pid()).find("libyaml-cpp"), std::string::npos);
  run.signal(SIGKILL);
  run.wait(std::chrono::seconds(30));

  // Without cohort-torch beside it, such a command says what is missing
  // (exit 127); the others still work.
  const std::string alone = dir.file("alone/cohort");
  std::filesystem::create_directories(dir.file("alone"));
  std::filesystem::copy_file(test::cohortBin(), alone);
  const auto e = test::run({alone, "export", "--help"});
  EXPECT_EQ(e.exitCode, 127) << e.describe();
  EXPECT_NE(e.err.find("cohort-torch"), std::string::npos) << e.err;
  EXPECT_EQ(test::run({alone, "validate", dir.file("job.yaml")}).exitCode, 0);
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
  EXPECT_NE(r.err.find(dir.file("job.yaml") + ":22:11: training.epochs: expected an integer, got "
                                              "'many'"),
            std::string::npos)
      << r.err;
  auto missing = test::cohort({"validate", dir.file("nope.yaml")});
  EXPECT_EQ(missing.exitCode, 2);
  EXPECT_NE(missing.err.find("job file not found"), std::string::npos);
}

TEST(Cli, EachBadInputExitsTwoWithItsMessage) {
  test::TempDir dir;
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("bad"));
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--set", "training.epocs=2"}, "unknown key 'epocs' in 'training' (did you mean 'epochs'?)"},
      {{"--set", "training.batch_size=big"}, "training.batch_size: expected an integer, got 'big'"},
      {{"--set", "training.optimizer.lr=0"}, "training.optimizer.lr: must be > 0, got 0"},
      {{"--set", "data.train.kind=idx", "--set", "data.train.images=/nonexistent/images.gz",
        "--set", "data.train.labels=/nonexistent/labels.gz"},
       "data.train.images: data file not found: /nonexistent/images.gz"},
      {{"--set", "model.arch=resnet"}, "model.arch: 'resnet' is not one of"},
  };
  for (const auto& [sets, message] : cases) {
    for (const char* cmd : {"validate", "run"}) {
      std::vector<std::string> args{cmd, job};
      if (std::string(cmd) == "run") {
        args.push_back("--run-dir");
        args.push_back(dir.file("run"));
      }
      args.insert(args.end(), sets.begin(), sets.end());
      auto r = test::cohort(args);
      EXPECT_EQ(r.exitCode, 2) << cmd << " " << message << "\n" << r.describe();
      EXPECT_NE(r.err.find(message), std::string::npos) << cmd << "\n" << r.err;
    }
  }
}

TEST(Cli, ProgressIsPlainLinesWithoutATerminal) {
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("plain"));
  auto r = test::cohort({"run", dir.file("job.yaml"), "--run-dir", dir.file("run"), "--set",
                         "output.progress=auto", "--set", "training.log_every=4"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.err.find("epoch 1/1 step 4/12 (33%) loss "), std::string::npos) << r.err;
  // Throughput and the model FLOPs utilization (docs/performance.md).
  EXPECT_TRUE(std::regex_search(r.err, std::regex(" [0-9]+ img/s MFU [0-9]+% ETA "))) << r.err;
  EXPECT_EQ(r.err.find("\033[K"), std::string::npos) << "terminal control codes without a terminal";
}

TEST(Cli, ProgressBarOnATerminal) {
  // util-linux's script(1) runs the command on a pseudo-terminal.
  const std::string script = "/usr/bin/script";
  ASSERT_EQ(access(script.c_str(), X_OK), 0) << "script(1) (bsdutils) is missing";
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("bar"));
  const std::string cmd = test::cohortBin() + " run " + dir.file("job.yaml") + " --run-dir " +
                          dir.file("run") + " --set output.progress=auto";
  auto r = test::run({script, "-qec", cmd, "/dev/null"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const std::string out = r.out + r.err;
  EXPECT_NE(out.find("\r\033[Kepoch 1/1 ["), std::string::npos) << out;
  EXPECT_NE(out.find("] 100% 12/12 loss "), std::string::npos) << out;
  // The bar is cleared before the epoch's summary line.
  EXPECT_NE(out.find("\r\033[K\r"), std::string::npos) << out;
  EXPECT_NE(out.find("epoch 1/1: 12 steps in"), std::string::npos) << out;
}

}  // namespace
}  // namespace cohort
