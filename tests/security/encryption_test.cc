// Encryption at rest: the sealed-file format (round trips at every chunk
// boundary, fresh nonces, and refusal of every kind of tampering: a flipped
// byte, swapped chunks, a changed header, truncation, extension, a file moved
// to another checkpoint, a wrong or missing key), keys that never leak, and
// checkpoints of a real job sealed, resumed, and skipped when tampered with.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/ckpt/tensor_file.h"
#include "cohort/core/checksum.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/security/keys.h"
#include "cohort/security/sealed.h"
#include "util/jobs.h"
#include "util/runs.h"
#include "util/errors.h"

namespace cohort::security {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

const std::string kHex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const std::string kOtherHex = "ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

std::string bytes(size_t n, unsigned seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 7) >> 3);
  return s;
}

// Seals `plain` at `path` with a small chunk size, as a writer streams it.
void sealTo(const std::string& path, const Key& key, const std::string& plain, uint32_t chunk) {
  Sealer s(key, sealedLabel(path), plain.size(), chunk);
  std::string out = s.header(), c;
  uint64_t offset = 0;
  for (uint64_t i = 0; i < s.chunks(); ++i) {
    s.seal(i, plain.data() + offset, c);
    out += c;
    offset += s.plainLength(i);
  }
  ASSERT_EQ(out.size(), s.sealedBytes());
  fs::create_directories(fs::path(path).parent_path());
  test::writeText(path, out);
}

struct Ring {
  Keyring ring{parseKey(kHex, "test key"), std::nullopt};
};

TEST(Sealed, RoundTripsAtEveryChunkBoundary) {
  TempDir dir;
  Ring r;
  for (size_t n : {0, 1, 99, 100, 101, 350}) {
    const std::string path = dir.file("step-1/f" + std::to_string(n));
    const std::string plain = bytes(n, 1);
    sealTo(path, r.ring.current, plain, 100);
    EXPECT_TRUE(isSealedFile(path));
    EXPECT_EQ(readSealedFile(path, &r.ring), plain) << n;
    EXPECT_NO_THROW(verifySealedFile(path, &r.ring));
    // The ciphertext does not hold the plaintext.
    if (n >= 99) {
      EXPECT_EQ(test::readText(path).find(plain.substr(0, 64)), std::string::npos);
    }
  }
}

TEST(Sealed, NoncesAreFresh) {
  Ring r;
  // The same chunk twice in one file, and the same file twice: all differ.
  const std::string plain = bytes(100, 2) + bytes(100, 2);
  const std::string a = sealBytes(r.ring.current, "x/y", plain.data(), plain.size());
  const std::string b = sealBytes(r.ring.current, "x/y", plain.data(), plain.size());
  EXPECT_NE(a, b);
  Sealer s(r.ring.current, "x/y", plain.size(), 100);
  std::string c0, c1;
  s.seal(0, plain.data(), c0);
  s.seal(1, plain.data() + 100, c1);
  EXPECT_NE(c0, c1);
  EXPECT_NE(c0.substr(0, 12), c1.substr(0, 12));
}

TEST(Sealed, EveryKindOfTamperingIsRefusedNamingTheFile) {
  TempDir dir;
  Ring r;
  const std::string path = dir.file("step-3/model.bin");
  const std::string plain = bytes(300, 3);
  sealTo(path, r.ring.current, plain, 100);
  const std::string good = test::readText(path);
  const size_t header = kSealedHeaderBytes, sealedChunk = 12 + 100 + 16;
  auto expectRefused = [&](const std::string& image, const std::string& what, const std::string& why) {
    test::writeText(path, image);
    const std::string e = test::errorOf<DataError>([&] { readSealedFile(path, &r.ring); });
    EXPECT_NE(e.find(path), std::string::npos) << why << ": " << e;
    EXPECT_NE(e.find(what), std::string::npos) << why << ": " << e;
    EXPECT_NE(test::errorOf<DataError>([&] { verifySealedFile(path, &r.ring); }), "NO ERROR") << why;
  };
  std::string flipped = good;
  flipped[header + sealedChunk + 40] ^= 1;
  expectRefused(flipped, "chunk 1 of 3 fails authentication", "a flipped ciphertext byte");
  std::string swapped = good;
  std::swap_ranges(swapped.begin() + header, swapped.begin() + header + sealedChunk,
                   swapped.begin() + header + sealedChunk);
  expectRefused(swapped, "chunk 0 of 3 fails authentication", "two chunks swapped");
  std::string header2 = good;
  header2[40] ^= 1;  // the file id
  expectRefused(header2, "fails authentication", "a changed header");
  expectRefused(good.substr(0, good.size() - 1), "truncated", "one byte cut");
  expectRefused(good.substr(0, header + 2 * sealedChunk), "truncated", "the last chunk cut");
  expectRefused(good + "x", "extended", "a byte appended");
  // The last chunk cut and the header's size made to match: the new last
  // chunk was not sealed as the last.
  std::string shortened = good.substr(0, header + 2 * sealedChunk);
  shortened[16] = static_cast<char>(200);  // 300 -> 200 bytes (little-endian)
  shortened[17] = 0;
  expectRefused(shortened, "chunk 0 of 2 fails authentication", "a truncation with a forged size");

  // A file moved to another checkpoint (its label) does not open there.
  test::writeText(path, good);
  EXPECT_EQ(readSealedFile(path, &r.ring), plain);
  fs::create_directories(dir.file("step-6"));
  fs::copy_file(path, dir.file("step-6/model.bin"));
  EXPECT_NE(test::errorOf<DataError>([&] { readSealedFile(dir.file("step-6/model.bin"), &r.ring); })
                .find("sealed as another file"),
            std::string::npos);

  // Another key: named by id, never by value. No key: a ConfigError.
  Keyring other{parseKey(kOtherHex, "other"), std::nullopt};
  const std::string e = test::errorOf<DataError>([&] { readSealedFile(path, &other); });
  EXPECT_NE(e.find(r.ring.current.id), std::string::npos) << e;
  EXPECT_EQ(e.find(kHex), std::string::npos) << e;
  EXPECT_NE(test::errorOf<ConfigError>([&] { readSealedFile(path, nullptr); }).find("is encrypted"),
            std::string::npos);
  // A rotated-out key still opens what it sealed.
  Keyring rotated{parseKey(kOtherHex, "new"), r.ring.current};
  EXPECT_EQ(readSealedFile(path, &rotated), plain);
}

// A file streamed chunk by chunk (a shard), read back at random offsets.
TEST(Sealed, StreamedFilesReadAtAnyOffsetAndRefuseTampering) {
  Ring r;
  const uint32_t chunk = 100;
  const std::string plain = bytes(350, 5);
  StreamSealer s(r.ring.current, "shard-00001.cohort", chunk);
  std::string file = s.header(), c;
  for (uint64_t i = 0; i * chunk < plain.size(); ++i) {
    const size_t n = std::min<size_t>(chunk, plain.size() - i * chunk);
    s.seal(i, plain.data() + i * chunk, n, (i + 1) * chunk >= plain.size(), c);
    file += c;
  }
  file.replace(0, kSealedHeaderBytes, s.finalHeader(plain.size()));
  auto reader = [&](const std::string& f, const std::string& label) {
    return SealedReader([f](uint64_t o, uint64_t n) { return f.substr(o, n); }, f.size(), label,
                        &r.ring, "ds/" + label);
  };
  const SealedReader ok = reader(file, "shard-00001.cohort");
  EXPECT_EQ(ok.plainBytes(), plain.size());
  for (uint64_t off : {0, 1, 99, 100, 101, 250, 349}) {
    for (uint64_t len : {0, 1, 50, 100, 101}) {
      if (off + len > plain.size()) continue;
      EXPECT_EQ(ok.read(off, len), plain.substr(off, len)) << off << "+" << len;
    }
  }
  EXPECT_NE(test::errorOf<DataError>([&] { ok.read(300, 51); }).find("past its end"), std::string::npos);
  // A flipped byte in chunk 1: reads of it fail naming the file; chunk 0 still reads.
  std::string flipped = file;
  flipped[kSealedHeaderBytes + (chunk + 28) + 40] ^= 1;
  const SealedReader bad = reader(flipped, "shard-00001.cohort");
  EXPECT_NE(test::errorOf<DataError>([&] { bad.read(150, 10); }).find("ds/shard-00001.cohort: chunk 1 of 4 fails authentication"),
            std::string::npos);
  EXPECT_EQ(bad.read(0, 100), plain.substr(0, 100));
  // Another shard's name; a cut at a chunk boundary with the size forged.
  EXPECT_NE(test::errorOf<DataError>([&] { reader(file, "shard-00002.cohort").read(0, 10); }),
            "NO ERROR");
  std::string cut = file.substr(0, kSealedHeaderBytes + 3 * (chunk + 28));
  cut.replace(0, kSealedHeaderBytes, s.finalHeader(300));
  EXPECT_NE(test::errorOf<DataError>([&] { reader(cut, "shard-00001.cohort").read(250, 10); })
                .find("chunk 2 of 3 fails authentication"),
            std::string::npos);
}

TEST(Keys, MalformedOrExposedKeysAreRefusedWithoutBeingQuoted) {
  TempDir dir;
  const std::string almost = kHex.substr(0, 63) + "g";
  std::string e = test::errorOf<ConfigError>([&] { parseKey(almost, "key file k"); });
  EXPECT_NE(e.find("key file k"), std::string::npos) << e;
  EXPECT_EQ(e.find(almost.substr(0, 20)), std::string::npos) << e;
  EXPECT_NE(test::errorOf<ConfigError>([&] { parseKey(kHex + "00", "k"); }), "NO ERROR");
  EXPECT_EQ(parseKey(" " + kHex + "\n", "k").bytes[31], 0x1f);

  const std::string file = dir.file("key");
  test::writeText(file, kHex + "\n");
  ::chmod(file.c_str(), 0644);
  e = test::errorOf<ConfigError>([&] { readKeyFile(file); });
  EXPECT_NE(e.find("chmod 600 " + file), std::string::npos) << e;
  ::chmod(file.c_str(), 0600);
  const Key k = readKeyFile(file);
  EXPECT_EQ(k.id, parseKey(kHex, "x").id);
  EXPECT_EQ(k.id.size(), 32u);
  EXPECT_EQ(k.id.find(kHex.substr(0, 8)), std::string::npos);

  EXPECT_FALSE(loadKeyring({}).has_value());
  EXPECT_NE(test::errorOf<ConfigError>([&] { loadKeyring({file, "SOME_VAR", ""}); }), "NO ERROR");
  ::setenv("COHORT_TEST_KEY", kHex.c_str(), 1);
  EXPECT_EQ(loadKeyring({"", "COHORT_TEST_KEY", ""})->current.id, k.id);
  ::unsetenv("COHORT_TEST_KEY");
  EXPECT_NE(test::errorOf<ConfigError>([&] { loadKeyring({"", "COHORT_TEST_KEY", ""}); }).find("COHORT_TEST_KEY"),
            std::string::npos);
}

// Large files pass through the writer's two 8 MiB buffers (sealing one while
// the other is written, direct I/O for whole blocks, the tail through the
// page cache): every size around those boundaries reads back whole.
TEST(SealedCheckpointFiles, LargeImagesCrossTheWritersBuffers) {
  TempDir dir;
  Ring r;
  fs::create_directories(dir.file("step-2"));
  for (uint64_t size : {uint64_t{8} << 20, (uint64_t{8} << 20) + 1, (uint64_t{20} << 20) + 4095,
                        (uint64_t{4} << 20) * 5}) {
    const std::string image = bytes(size, static_cast<unsigned>(size % 251));
    const std::string path = dir.file("step-2/optimizer.bin");
    const ckpt::WrittenFile w = ckpt::writeFileImage(path, image.data(), size, nullptr, &r.ring.current);
    EXPECT_EQ(w.size, fs::file_size(path)) << size;
    EXPECT_EQ(w.checksum, checksumFile(path)) << size;
    EXPECT_TRUE(readSealedFile(path, &r.ring) == image) << size;
  }
}

TEST(SealedCheckpointFiles, TensorFilesAndModelsRoundTripAndFailVerification) {
  TempDir dir;
  Ring r;
  const at::Tensor t = torch::arange(5000, torch::kFloat32);
  ckpt::TensorRecord rec{"w", c10::ScalarType::Float, {5000}, t.data_ptr(), 5000 * 4};
  const auto layout = ckpt::layoutTensorFile({rec}, nlohmann::json::object(), 4096);
  std::string image(layout.size, '\0');
  std::memcpy(image.data(), layout.header.data(), layout.header.size());
  std::memcpy(image.data() + layout.offsets[0], t.data_ptr(), 5000 * 4);
  fs::create_directories(dir.file("step-1"));
  const std::string path = dir.file("step-1/model.bin");
  const ckpt::WrittenFile w = ckpt::writeFileImage(path, image.data(), image.size(), nullptr, &r.ring.current);
  EXPECT_EQ(w.size, fs::file_size(path));
  EXPECT_EQ(w.checksum, checksumFile(path));
  EXPECT_EQ(test::readText(path).find("cohort-tensors"), std::string::npos);

  installKeyring(std::nullopt);
  EXPECT_NE(test::errorOf<ConfigError>([&] { ckpt::readTensorFile(path); }).find(r.ring.current.id),
            std::string::npos);
  installKeyring(r.ring);
  EXPECT_TRUE(torch::equal(ckpt::readTensorFile(path).tensors.at(0).second, t));

  const std::string model = dir.file("model/final.pt");
  fs::create_directories(dir.file("model"));
  ckpt::saveStateDict({{"w", t}}, model, &r.ring.current);
  EXPECT_TRUE(isSealedFile(model));
  EXPECT_TRUE(torch::equal(ckpt::readStateDict(model).at(0).second, t));
  installKeyring(std::nullopt);
}

// The tiny job of tests/ckpt/recovery_test.cc: 2 ranks, a checkpoint every
// 3 steps, BatchNorm and dropout.
std::vector<std::string> jobArgs(const std::string& job, const std::string& runDir,
                                 std::vector<std::string> more = {}) {
  std::vector<std::string> args{"run", job, "--procs", "2", "--run-dir", runDir};
  for (const char* kv : {"model.batch_norm=true", "model.dropout=0.25", "data.train.size=192",
                         "training.epochs=3", "checkpoint.every_steps=3",
                         "checkpoint.when_behind=wait", "checkpoint.keep_last=3"}) {
    args.push_back("--set");
    args.push_back(kv);
  }
  for (auto& m : more) args.push_back(std::move(m));
  return args;
}

TEST(EncryptedRun, CheckpointsAreSealedResumeSkipsATamperedOneAndTheModelMatches) {
  TempDir dir;
  const std::string job = dir.file("job.yaml"), key = dir.file("cohort.key");
  test::writeText(job, test::tinyJobYaml("sealed"));
  test::writeText(key, kHex + "\n");
  ::chmod(key.c_str(), 0600);
  const auto plain = test::cohort(jobArgs(job, dir.file("plain")));
  ASSERT_EQ(plain.exitCode, 0) << plain.describe();

  const std::string runDir = dir.file("sealed");
  const std::vector<std::string> sealed = {"--set", "security.encryption.key_file=" + key};
  auto withKey = [&](std::vector<std::string> more) {
    more.insert(more.end(), sealed.begin(), sealed.end());
    return more;
  };
  auto first = test::cohort(jobArgs(job, runDir, withKey({"--set", "training.max_steps=12"})));
  ASSERT_EQ(first.exitCode, 0) << first.describe();
  const std::string step12 = runDir + "/checkpoints/step-12";
  for (const auto& e : fs::directory_iterator(step12)) {
    if (e.path().extension() == ".bin") {
      EXPECT_TRUE(isSealedFile(e.path())) << e.path();
    }
  }
  const auto manifest = nlohmann::json::parse(test::readText(step12 + "/manifest.json"));
  EXPECT_EQ(manifest["extra"]["encryption"]["key_id"], parseKey(kHex, "k").id) << manifest.dump(2);
  for (const auto& text : {test::readText(runDir + "/job.yaml"), first.out + first.err,
                           test::readText(runDir + "/logs/rank-0.log"), manifest.dump()}) {
    EXPECT_EQ(text.find(kHex), std::string::npos);
  }
  // Verification with and without the key: the checksum covers what is on disk.
  EXPECT_EQ(test::cohort({"ckpt", "verify", runDir}).exitCode, 0);
  EXPECT_EQ(test::cohort({"ckpt", "verify", runDir, "--key-file", key}).exitCode, 0);
  // inspect shows the manifest without the key, the tensors with it.
  const auto inspectNoKey = test::cohort({"ckpt", "inspect", step12, "--tensors"});
  EXPECT_EQ(inspectNoKey.exitCode, 0) << inspectNoKey.describe();
  EXPECT_NE(inspectNoKey.out.find("model.bin is encrypted (key id " + parseKey(kHex, "k").id),
            std::string::npos)
      << inspectNoKey.describe();
  const auto inspect = test::cohort({"ckpt", "inspect", step12, "--tensors", "--key-file", key});
  EXPECT_EQ(inspect.exitCode, 0) << inspect.describe();
  EXPECT_EQ(inspect.out.find("unreadable"), std::string::npos) << inspect.describe();
  EXPECT_NE(inspect.out.find("float32"), std::string::npos) << inspect.describe();

  // decrypt writes the plain file: a tensor file, private to the user.
  const std::string plainCopy = dir.file("model-plain.bin");
  const auto decrypt = test::cohort({"ckpt", "decrypt", step12 + "/model.bin", plainCopy, "--key-file", key});
  ASSERT_EQ(decrypt.exitCode, 0) << decrypt.describe();
  EXPECT_EQ(test::readText(plainCopy).substr(0, 8), "COHORTTN");
  EXPECT_EQ(fs::status(plainCopy).permissions() & (fs::perms::group_all | fs::perms::others_all),
            fs::perms::none);

  // Tampered with, and its manifest made to agree: only the cipher notices.
  const std::string victim = step12 + "/model.bin";
  {
    std::fstream io(victim, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(200);
    io.put('\x5a');
  }
  auto m = nlohmann::json::parse(test::readText(step12 + "/manifest.json"));
  for (auto& f : m["files"]) {
    if (f["name"] == "model.bin") f["checksum"] = checksumFile(victim);
  }
  writeFileAtomic(step12 + "/manifest.json", m.dump(2));
  EXPECT_EQ(test::cohort({"ckpt", "verify", runDir}).exitCode, 0) << "checksums alone pass";
  const auto verify = test::cohort({"ckpt", "verify", runDir, "--key-file", key});
  EXPECT_EQ(verify.exitCode, 1) << verify.describe();
  EXPECT_NE(verify.out.find("CORRUPT " + step12 + ": " + victim + ": chunk 0 of"), std::string::npos)
      << verify.out;

  // The rerun resumes from step 9 and ends where the plain run ended.
  auto second = test::cohort(jobArgs(job, runDir, withKey({})));
  ASSERT_EQ(second.exitCode, 0) << second.describe();
  const std::string log = test::readText(runDir + "/logs/rank-0.log");
  EXPECT_NE(log.find("skipping invalid checkpoint " + step12 + ": " + victim), std::string::npos) << log;
  EXPECT_NE(log.find("resumed from " + runDir + "/checkpoints/step-9: step 9"), std::string::npos) << log;
  EXPECT_EQ(test::maxDifference(ckpt::readStateDict(dir.file("plain") + "/model/final.pt"),
                                ckpt::readStateDict(runDir + "/model/final.pt")),
            0.0);
  // Without its key the run refuses to start, naming what to give.
  auto noKey = test::cohort(jobArgs(job, runDir, {"--set", "training.epochs=4"}));
  EXPECT_NE(noKey.exitCode, 0) << noKey.describe();
}

}  // namespace
}  // namespace cohort::security
