#include <gtest/gtest.h>

#include "cohort/config/load.h"
#include "cohort/config/step_range.h"
#include "cohort/core/error.h"
#include "util/process.h"

namespace cohort {
namespace {

const char* kValid = R"(name: t
model:
  arch: simple_cnn
data:
  train:
    kind: synthetic
    size: 10
    shape: [1, 8, 8]
training:
  epochs: 2
  batch_size: 4
)";

template <class E>
std::string errorOf(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    loadJobFromString(yaml, "job.yaml", overrides);
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("WRONG EXCEPTION TYPE: ") + e.what();
  }
  return "NO ERROR";
}

TEST(JobConfig, ValidJobGetsDefaultsFilledIn) {
  JobConfig j = loadJobFromString(kValid, "job.yaml");
  EXPECT_EQ(j.name, "t");
  EXPECT_EQ(j.training.epochs, 2);
  EXPECT_EQ(j.training.batchSize, 4);
  EXPECT_EQ(j.training.optimizer.name, OptimizerKind::sgd);
  EXPECT_DOUBLE_EQ(j.distribution.bucketCapMb, 25.0);
  EXPECT_EQ(j.data.train.shape, (std::vector<int64_t>{1, 8, 8}));
  EXPECT_EQ(j.data.eval.kind, DataKind::none);
}

TEST(JobConfig, UnknownKeyNamesLineColumnAndSuggests) {
  std::string yaml = std::string(kValid) + "  epocs: 3\n";
  std::string e = errorOf<ConfigError>(yaml);
  EXPECT_NE(e.find("job.yaml:12:3"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key 'epocs' in 'training'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'epochs'"), std::string::npos) << e;
}

TEST(JobConfig, UnknownTopLevelSection) {
  std::string e = errorOf<ConfigError>(std::string(kValid) + "modle: {}\n");
  EXPECT_NE(e.find("job.yaml:12:1: unknown key 'modle'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'model'"), std::string::npos) << e;
}

TEST(JobConfig, WrongTypeNamesKeyAndValue) {
  std::string yaml = kValid;
  yaml.replace(yaml.find("epochs: 2"), 9, "epochs: ten");
  std::string e = errorOf<ConfigError>(yaml);
  EXPECT_NE(e.find("job.yaml:10:11: training.epochs: expected an integer, got 'ten'"),
            std::string::npos)
      << e;
}

TEST(JobConfig, WrongTypeForList) {
  std::string yaml = kValid;
  yaml.replace(yaml.find("[1, 8, 8]"), 9, "big");
  std::string e = errorOf<ConfigError>(yaml);
  EXPECT_NE(e.find("job.yaml:8:12: data.train.shape: expected a list, got 'big'"),
            std::string::npos)
      << e;
}

TEST(JobConfig, OutOfRangeValue) {
  std::string yaml = kValid;
  yaml.replace(yaml.find("batch_size: 4"), 13, "batch_size: 0");
  std::string e = errorOf<ConfigError>(yaml);
  EXPECT_NE(e.find("job.yaml:11:15: training.batch_size: must be >= 1, got 0"), std::string::npos)
      << e;
}

TEST(JobConfig, BadChoiceSuggests) {
  std::string yaml = kValid;
  yaml.replace(yaml.find("simple_cnn"), 10, "resnet5O");
  std::string e = errorOf<ConfigError>(yaml);
  EXPECT_NE(e.find("job.yaml:3:9: model.arch: 'resnet5O' is not one of"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'resnet50'"), std::string::npos) << e;
}

TEST(JobConfig, AnEmptyOrNonScalarChoiceIsRejectedWithTheNames) {
  std::string yaml = kValid;
  yaml.replace(yaml.find(" simple_cnn"), 11, "");
  std::string e = errorOf<ConfigError>(yaml);
  EXPECT_NE(e.find("model.arch: '' is not one of: simple_cnn, resnet18, resnet34, resnet50, resnet101"),
            std::string::npos)
      << e;
  e = errorOf<ConfigError>(kValid, {"training.optimizer.name=[sgd]"});
  EXPECT_NE(e.find("training.optimizer.name: expected one of: sgd, adamw, got a list"), std::string::npos)
      << e;
}

TEST(JobConfig, ChoicesArePickedByNameAndWrittenBackByName) {
  const JobConfig j = loadJobFromString(
      kValid, "job.yaml",
      {"model.memory_format=channels_last", "output.progress=off", "checkpoint.when_behind=wait",
       "distribution.compression=bf16", "training.schedule.name=cosine"});
  EXPECT_EQ(j.model.memoryFormat, MemoryLayout::channelsLast);
  EXPECT_EQ(j.output.progress, ProgressStyle::off);
  EXPECT_EQ(j.checkpoint.whenBehind, WhenBehind::wait);
  EXPECT_EQ(j.distribution.compression, GradCompression::bf16);
  EXPECT_EQ(j.training.schedule.name, ScheduleKind::cosine);
  // The resolved YAML names them as the file does, and reads back the same.
  const std::string yaml = toYaml(j);
  EXPECT_NE(yaml.find("memory_format: channels_last"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("when_behind: wait"), std::string::npos) << yaml;
  EXPECT_EQ(toYaml(loadJobFromString(yaml, "resolved.yaml")), yaml);
}

template <class E>
void expectNamesRoundTrip() {
  std::vector<std::string> seen;
  for (const auto& [value, name] : ChoiceNames<E>::table) {
    EXPECT_EQ(choiceName(value), name);
    EXPECT_EQ(choiceFromName<E>(name), value) << name;
    for (const auto& s : seen) EXPECT_NE(s, name) << "two values named " << name;
    seen.emplace_back(name);
  }
  EXPECT_EQ(choiceNames<E>(), seen);
  EXPECT_FALSE(choiceFromName<E>("").has_value());
}

TEST(Choices, EveryValueHasOneNameThatLeadsBackToIt) {
  expectNamesRoundTrip<ModelArch>();
  expectNamesRoundTrip<MemoryLayout>();
  expectNamesRoundTrip<DataKind>();
  expectNamesRoundTrip<OnCorrupt>();
  expectNamesRoundTrip<Backend>();
  expectNamesRoundTrip<GradCompression>();
  expectNamesRoundTrip<Allocator>();
  expectNamesRoundTrip<OneDnn>();
  expectNamesRoundTrip<OptimizerKind>();
  expectNamesRoundTrip<ScheduleKind>();
  expectNamesRoundTrip<OnNonfinite>();
  expectNamesRoundTrip<ProgressStyle>();
  expectNamesRoundTrip<WhenBehind>();
  expectNamesRoundTrip<OnError>();
  expectNamesRoundTrip<Precision>();
}

TEST(JobConfig, MissingDataFileIsDataErrorWithLocationAndPath) {
  const std::string yaml = R"(name: t
data:
  train:
    kind: idx
    images: /nonexistent/train-images.gz
    labels: /nonexistent/train-labels.gz
)";
  std::string e = errorOf<DataError>(yaml);
  EXPECT_NE(e.find("job.yaml:5:13: data.train.images: data file not found: "
                   "/nonexistent/train-images.gz"),
            std::string::npos)
      << e;
}

TEST(JobConfig, MissingTrainingData) {
  std::string e = errorOf<ConfigError>("name: t\n");
  EXPECT_NE(e.find("data.train.kind: training data is required"), std::string::npos) << e;
}

TEST(JobConfig, DuplicateKeyIsAnError) {
  std::string e = errorOf<ConfigError>(std::string(kValid) + "  epochs: 90\n");
  EXPECT_NE(e.find("job.yaml:12:3: duplicate key 'epochs' in 'training' (first at job.yaml:10:3)"),
            std::string::npos)
      << e;
}

TEST(JobConfig, LimitsOnSizesAndTimeouts) {
  std::string e = errorOf<ConfigError>(kValid, {"distribution.timeout_s=0.0004"});
  EXPECT_NE(e.find("distribution.timeout_s: must be >= 1, got 0.0004"), std::string::npos) << e;
  e = errorOf<ConfigError>(kValid, {"distribution.procs_per_node=4294967297"});
  EXPECT_NE(e.find("distribution.procs_per_node: must be <= 4096"), std::string::npos) << e;
  e = errorOf<ConfigError>(kValid, {"output.dir="});
  EXPECT_NE(e.find("output.dir: must not be empty"), std::string::npos) << e;
}

TEST(JobConfig, YamlSyntaxErrorHasLocation) {
  std::string e = errorOf<ConfigError>("name: t\nmodel: [unclosed\n");
  EXPECT_NE(e.find("job.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("YAML syntax error"), std::string::npos) << e;
}

TEST(JobConfig, SectionMustBeMapping) {
  std::string e = errorOf<ConfigError>(std::string(kValid) + "output: 3\n");
  EXPECT_NE(e.find("job.yaml:12:9: output: expected a mapping of keys, got '3'"),
            std::string::npos)
      << e;
}

TEST(JobConfig, SetOverridesWithSameValidation) {
  JobConfig j = loadJobFromString(kValid, "job.yaml",
                                  {"training.epochs=5", "training.optimizer.lr=0.25",
                                   "data.train.shape=[1, 16, 16]", "name=other"});
  EXPECT_EQ(j.training.epochs, 5);
  EXPECT_DOUBLE_EQ(j.training.optimizer.lr, 0.25);
  EXPECT_EQ(j.data.train.shape, (std::vector<int64_t>{1, 16, 16}));
  EXPECT_EQ(j.name, "other");

  std::string e = errorOf<ConfigError>(kValid, {"training.epochs=abc"});
  EXPECT_NE(e.find("--set training.epochs=abc: training.epochs: expected an integer, got 'abc'"),
            std::string::npos)
      << e;
  e = errorOf<ConfigError>(kValid, {"training.epocs=3"});
  EXPECT_NE(e.find("--set training.epocs=3: unknown key 'epocs' in 'training' (did you mean "
                   "'epochs'?)"),
            std::string::npos)
      << e;
  e = errorOf<ConfigError>(kValid, {"training.epochs=-1"});
  EXPECT_NE(e.find("--set training.epochs=-1: training.epochs: must be >= 1, got -1"),
            std::string::npos)
      << e;
  e = errorOf<ConfigError>(kValid, {"noequals"});
  EXPECT_NE(e.find("--set noequals: expected key.path=value"), std::string::npos) << e;
  e = errorOf<ConfigError>(kValid, {"training.epochs.x=1"});
  EXPECT_NE(e.find("'training.epochs' is a value, not a section"), std::string::npos) << e;
}

TEST(JobConfig, SetCreatesMissingSections) {
  JobConfig j = loadJobFromString(kValid, "job.yaml", {"data.eval.kind=synthetic"});
  EXPECT_EQ(j.data.eval.kind, DataKind::synthetic);
}

TEST(JobConfig, CrossFieldChecks) {
  std::string e = errorOf<ConfigError>(kValid, {"data.train.shape=[1, 8]"});
  EXPECT_NE(e.find("data.train.shape: expected [channels, height, width], got 2 values"),
            std::string::npos)
      << e;
  e = errorOf<ConfigError>(kValid, {"data.train.mean=[0.5]"});
  EXPECT_NE(e.find("data.train.std: has 0 values but mean has 1"), std::string::npos) << e;
  e = errorOf<ConfigError>(kValid, {"training.optimizer.betas=[0.9]"});
  EXPECT_NE(e.find("training.optimizer.betas: expected [beta1, beta2]"), std::string::npos) << e;
  e = errorOf<ConfigError>(kValid, {"name=a/b"});
  EXPECT_NE(e.find("name: 'a/b' may only contain"), std::string::npos) << e;
  e = errorOf<ConfigError>(kValid, {"checkpoint.when_behind=later"});
  EXPECT_NE(e.find("checkpoint.when_behind"), std::string::npos) << e;
  e = errorOf<ConfigError>(kValid, {"checkpoint.keep_last=0"});
  EXPECT_NE(e.find("checkpoint.keep_last"), std::string::npos) << e;
  e = errorOf<ConfigError>(kValid, {"distribution.zero=3", "distribution.compression=bf16"});
  EXPECT_NE(e.find("distribution.compression: is not applied by distribution.zero 3"), std::string::npos) << e;
  EXPECT_EQ(loadJobFromString(kValid, "job.yaml", {"distribution.zero=3"}).distribution.zero, 3);
  e = errorOf<ConfigError>(kValid, {"distribution.zero=4"});
  EXPECT_NE(e.find("distribution.zero"), std::string::npos) << e;
  e = errorOf<ConfigError>(kValid, {"distribution.zero=2", "distribution.compression=fp16"});
  EXPECT_NE(e.find("distribution.compression: is not applied by distribution.zero 2"), std::string::npos) << e;
  e = errorOf<ConfigError>(kValid, {"training.clip_grad_norm=-1"});
  EXPECT_NE(e.find("training.clip_grad_norm"), std::string::npos) << e;
  // Stage 1 compresses its allreduce as stage 0 does.
  EXPECT_EQ(loadJobFromString(kValid, "job.yaml", {"distribution.zero=1", "distribution.compression=fp16"})
                .distribution.zero,
            1);
}

TEST(JobConfig, ResolvedYamlRoundTrips) {
  JobConfig j = loadJobFromString(kValid, "job.yaml",
                                  {"training.optimizer.eps=1e-8", "data.train.mean=[0.25]",
                                   "data.train.std=[0.5]", "training.schedule.milestones=[1.5, 3]"});
  const std::string once = toYaml(j);
  JobConfig again = loadJobFromString(once, "resolved.yaml");
  EXPECT_EQ(toYaml(again), once);
  EXPECT_EQ(jobHash(again), jobHash(j));
  EXPECT_NE(jobHash(loadJobFromString(kValid, "job.yaml", {"training.seed=9"})), jobHash(j));
}

TEST(JobConfig, CredentialsInUrlsStayOutOfTheResolvedYaml) {
  const std::string remote = "https://acct.blob.core.windows.net/ckpt/run";
  const std::string sas = "sv=2021-08-06&sig=SECRETSIG123";
  const JobConfig j = loadJobFromString(
      kValid, "job.yaml", {"checkpoint.remote=" + remote + "?" + sas, "data.cache.dir=/tmp/a?b"});
  EXPECT_EQ(j.checkpoint.remote, remote + "?" + sas);  // in memory, storage needs it
  const std::string yaml = toYaml(j);
  EXPECT_EQ(yaml.find("SECRETSIG123"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find(remote), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("/tmp/a?b"), std::string::npos) << "a local path keeps its '?'";
  // The same job with its credential elsewhere is the same job.
  EXPECT_EQ(jobHash(j), jobHash(loadJobFromString(kValid, "job.yaml", {"checkpoint.remote=" + remote,
                                                                        "data.cache.dir=/tmp/a?b"})));

  JobConfig copy = j;
  const UrlCredentials taken = takeUrlCredentials(copy);
  EXPECT_EQ(taken, (UrlCredentials{{remote, sas}}));
  EXPECT_EQ(copy.checkpoint.remote, remote);
  // What a rank does: load the redacted job.yaml, put the credentials back.
  JobConfig rank = loadJobFromString(yaml, "job.yaml");
  restoreUrlCredentials(rank, decodeUrlCredentials(encodeUrlCredentials(taken), "test"));
  EXPECT_EQ(rank.checkpoint.remote, j.checkpoint.remote);
  EXPECT_EQ(toYaml(rank), yaml);
  try {
    decodeUrlCredentials("[\"sig=LEAKED\"]", "COHORT_URL_CREDENTIALS");
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("COHORT_URL_CREDENTIALS"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("LEAKED"), std::string::npos) << e.what();
  }
}

TEST(JobConfig, ComputeSettingsDoNotStopAResume) {
  // How a rank computes is not what it trains: a run resumes under others.
  const JobConfig j = loadJobFromString(kValid, "job.yaml");
  const JobConfig other = loadJobFromString(kValid, "job.yaml",
                                            {"compute.allocator=system", "compute.onednn=off"});
  EXPECT_EQ(other.compute.allocator, Allocator::system);
  EXPECT_EQ(other.compute.onednn, OneDnn::off);
  EXPECT_EQ(jobHash(other), jobHash(j));
  EXPECT_NE(toYaml(other), toYaml(j));
  const std::string e = errorOf<ConfigError>(kValid, {"compute.allocator=jemalloc"});
  EXPECT_NE(e.find("compute.allocator"), std::string::npos) << e;
}

TEST(JobConfig, JobFileNotFound) {
  try {
    loadJob("/nonexistent/job.yaml");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("job file not found: /nonexistent/job.yaml"),
              std::string::npos);
  }
}

TEST(JobConfig, RelativeDataPathsBecomeAbsolute) {
  test::TempDir dir;
  test::writeText(dir.file("i.gz"), "x");
  test::writeText(dir.file("l.gz"), "x");
  const std::string yaml = "name: t\ndata:\n  train:\n    kind: idx\n    images: " +
                           dir.file("i.gz") + "\n    labels: " + dir.file("l.gz") + "\n";
  JobConfig j = loadJobFromString(yaml, "job.yaml");
  EXPECT_EQ(j.data.train.images, dir.file("i.gz"));
  EXPECT_EQ(j.output.dir.front(), '/');
}

}  // namespace
}  // namespace cohort

namespace cohort {
namespace {

TEST(StepRange, ParsesARangeOrOneStep) {
  const StepRange r = parseStepRange("20-22");
  EXPECT_EQ(r.first, 20);
  EXPECT_EQ(r.last, 22);
  EXPECT_EQ(r.count(), 3);
  EXPECT_EQ(r.describe(), "20-22");
  const StepRange one = parseStepRange("20");
  EXPECT_EQ(one.first, 20);
  EXPECT_EQ(one.last, 20);
  EXPECT_EQ(one.describe(), "20");
  EXPECT_EQ(parseStepRange(" 3 - 5 ").describe(), "3-5");
  EXPECT_EQ(parseStepRange("7-7").describe(), "7");
}

TEST(StepRange, RefusesEmptyReversedAndGarbage) {
  for (const char* bad : {"", " ", "-", "abc", "0-", "-3", "0", "0-2", "22-20", "3-x", "1.5", "2-3-4", "+2"}) {
    EXPECT_THROW(parseStepRange(bad), ConfigError) << "'" << bad << "'";
  }
  try {
    parseStepRange("22-20");
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("reversed"), std::string::npos) << e.what();
  }
}

TEST(StepRange, OutputProfileIsCheckedWhereItIsWritten) {
  EXPECT_EQ(loadJobFromString(kValid, "job.yaml", {"output.profile=2-3"}).output.profile, "2-3");
  const std::string e = errorOf<ConfigError>(kValid, {"output.profile=5-2"});
  EXPECT_NE(e.find("output.profile"), std::string::npos) << e;
  EXPECT_NE(e.find("reversed"), std::string::npos) << e;
  // Watching a run changes nothing of what it trains: the same job.
  EXPECT_EQ(jobHash(loadJobFromString(kValid, "job.yaml", {"output.profile=2-3"})),
            jobHash(loadJobFromString(kValid, "job.yaml")));
}

}  // namespace
}  // namespace cohort
