// The files of a `cohort score` run beside OUT (serve/detail/score_run.h).

#include "serve/detail/score_run.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cohort/core/checksum.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"

namespace cohort::serve::detail {

namespace fs = std::filesystem;

nlohmann::json ScoreRecord::toJson() const {
  nlohmann::json p = nlohmann::json::array();
  for (const auto& [b, e] : parts) p.push_back({b, e});
  return {{"model", model}, {"model_fingerprint", modelFingerprint}, {"data", data},
          {"data_fingerprint", dataFingerprint}, {"samples", samples}, {"tokens", tokens},
          {"top_k", topK}, {"procs", procs}, {"batch_size", batchSize}, {"parts", p}};
}

ScoreRecord ScoreRecord::fromJson(const nlohmann::json& j, const std::string& origin) {
  ScoreRecord r;
  try {
    r.model = j.at("model").get<std::string>();
    r.modelFingerprint = j.at("model_fingerprint").get<std::string>();
    r.data = j.at("data").get<std::string>();
    r.dataFingerprint = j.at("data_fingerprint").get<std::string>();
    r.samples = j.at("samples").get<int64_t>();
    r.tokens = j.at("tokens").get<bool>();
    r.topK = j.at("top_k").get<int64_t>();
    r.procs = j.at("procs").get<int>();
    r.batchSize = j.at("batch_size").get<int64_t>();
    for (const auto& p : j.at("parts")) r.parts.emplace_back(p.at(0).get<int64_t>(), p.at(1).get<int64_t>());
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: not a record of cohort score: {}", origin, e.what()));
  }
  if (r.batchSize < 1) {
    throw DataError(fmt::format("{}: batch_size {}, expected >= 1", origin, r.batchSize));
  }
  if (static_cast<int>(r.parts.size()) != r.procs) {
    throw DataError(fmt::format("{}: {} parts for {} procs", origin, r.parts.size(), r.procs));
  }
  return r;
}

std::vector<std::string> ScoreRecord::differences(const ScoreRecord& before) const {
  std::vector<std::string> d;
  if (model != before.model) d.push_back(fmt::format("the model was {}, now {}", before.model, model));
  else if (modelFingerprint != before.modelFingerprint) d.push_back(fmt::format("the weights of {} changed", model));
  if (data != before.data) d.push_back(fmt::format("the data was {}, now {}", before.data, data));
  else if (dataFingerprint != before.dataFingerprint) d.push_back(fmt::format("the data at {} changed", data));
  if (samples != before.samples) d.push_back(fmt::format("{} samples, now {}", before.samples, samples));
  if (topK != before.topK) d.push_back(fmt::format("--top-k was {}, now {}", before.topK, topK));
  if (procs != before.procs) d.push_back(fmt::format("--procs was {}, now {}", before.procs, procs));
  if (batchSize != before.batchSize) {
    d.push_back(fmt::format("--batch-size was {}, now {}", before.batchSize, batchSize));
  }
  // The parts follow from the above; a record whose parts do not is not ours.
  if (d.empty() && parts != before.parts) d.push_back("the ranks' parts differ");
  return d;
}

std::vector<std::pair<int64_t, int64_t>> splitParts(int64_t samples, int64_t batchSize, int procs) {
  const int64_t batches = (samples + batchSize - 1) / batchSize;
  std::vector<std::pair<int64_t, int64_t>> parts;
  for (int r = 0; r < procs; ++r) {
    const int64_t b = batches * r / procs, e = batches * (r + 1) / procs;
    parts.emplace_back(std::min(samples, b * batchSize), std::min(samples, e * batchSize));
  }
  return parts;
}

ScoreRecord readRecord(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw DataError(fmt::format("{}: cannot read", path));
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: not JSON: {}", path, e.what()));
  }
  return ScoreRecord::fromJson(j, path);
}

namespace {

std::string fingerprintOf(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path manifest = fs::path(path) / "manifest.json";
    return fs::is_regular_file(manifest, ec) ? checksumFile(manifest.string()) : path;
  }
  return fs::is_regular_file(path, ec) ? checksumFile(path) : path;
}

}  // namespace

std::string modelFingerprint(const std::string& model, const std::string& weights) {
  // A LoRA run's weights come from two places, "BASE + ADAPTERS": both count.
  const std::string all = weights.empty() ? model : weights;
  const std::string sep = " + ";
  std::string out;
  for (size_t start = 0;;) {
    const size_t at = all.find(sep, start);
    out += (out.empty() ? "" : "+") + fingerprintOf(all.substr(start, at == std::string::npos ? at : at - start));
    if (at == std::string::npos) break;
    start = at + sep.size();
  }
  return out;
}

namespace {

// True when `j` (a parsed line; discarded when it is not JSON) is a
// prediction for sample `index`.
bool isLineFor(const nlohmann::json& j, int64_t index) {
  return !j.is_discarded() && j.is_object() && j.contains("index") && j["index"].is_number_integer() &&
         j["index"].get<int64_t>() == index;
}
bool isLineFor(const std::string& line, int64_t index) {
  return isLineFor(nlohmann::json::parse(line, nullptr, false), index);
}

}  // namespace

void writeAll(int fd, const std::string& bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw IoError(fmt::format("cannot write {}: {}", path, std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
}

int64_t keptLines(const std::string& path, int64_t begin, int64_t count) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
  int64_t kept = 0;
  uint64_t goodBytes = 0;
  std::string line;
  while (kept < count && std::getline(in, line)) {
    if (in.eof() || !isLineFor(line, begin + kept)) break;  // torn (no newline) or not ours
    ++kept;
    goodBytes += line.size() + 1;
  }
  in.close();
  if (fs::file_size(path, ec) != goodBytes) fs::resize_file(path, goodBytes, ec);
  if (ec) throw IoError(fmt::format("cannot cut the torn end of {}: {}", path, ec.message()));
  return kept;
}

int64_t mergeParts(const ScorePaths& paths, const ScoreRecord& record) {
  AtomicFile out(paths.out);  // complete or absent
  int64_t errors = 0;
  std::string buffer;
  for (int r = 0; r < record.procs; ++r) {
    const auto [begin, end] = record.parts[static_cast<size_t>(r)];
    std::ifstream in(paths.part(r), std::ios::binary);
    if (!in && begin < end) throw DataError(fmt::format("{}: missing", paths.part(r)));
    int64_t index = begin;
    std::string line;
    while (index < end && std::getline(in, line) && !in.eof()) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (!isLineFor(j, index)) break;
      errors += j.contains("error") ? 1 : 0;
      buffer += line;
      buffer += '\n';
      ++index;
      if (buffer.size() >= (1u << 20)) {
        out.write(buffer.data(), buffer.size());
        buffer.clear();
      }
    }
    if (index != end) {
      throw DataError(fmt::format("{}: holds {} of the {} predictions of rank {} (samples {} to {})",
                                  paths.part(r), index - begin, end - begin, r, begin, end - 1));
    }
  }
  out.write(buffer.data(), buffer.size());
  out.commit();
  return errors;
}

}  // namespace cohort::serve::detail
