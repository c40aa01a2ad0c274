#include "cohort/data/dataset_manifest.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cohort/core/error.h"
#include "core/detail/json_int.h"

namespace cohort::data {

int64_t DatasetManifest::records() const {
  int64_t n = 0;
  for (const auto& s : shards) n += s.records;
  return n;
}

int64_t DatasetManifest::bytes() const {
  int64_t n = 0;
  for (const auto& s : shards) n += s.bytes;
  return n;
}

std::string datasetManifestJson(const DatasetManifest& m) {
  nlohmann::ordered_json j;
  j["format"] = "cohort-shards";
  j["format_version"] = m.formatVersion;
  j["name"] = m.name;
  j["encoding"] = m.encoding;
  if (!m.rawShape.empty()) j["raw_shape"] = m.rawShape;
  if (m.encoding == "tokens") {
    j["tokenizer"] = m.tokenizer;
    j["vocab_size"] = m.vocabSize;
    j["token_bytes"] = m.tokenBytes;
    if (!m.tokenizerModel.empty()) {
      j["tokenizer_model"] = m.tokenizerModel;
      j["tokenizer_checksum"] = m.tokenizerChecksum;
    }
    if (m.textBytes > 0) j["text_bytes"] = m.textBytes;
  }
  j["classes"] = m.classes;
  j["records"] = m.records();
  j["bytes"] = m.bytes();
  j["source"] = m.source;
  j["created"] = m.created;
  if (!m.encryptionKeyId.empty()) j["encryption"] = {{"key_id", m.encryptionKeyId}};
  nlohmann::ordered_json shards = nlohmann::ordered_json::array();
  for (const auto& s : m.shards) {
    shards.push_back({{"name", s.name}, {"records", s.records}, {"bytes", s.bytes},
                      {"checksum", s.checksum}});
  }
  j["shards"] = shards;
  return j.dump(2) + "\n";
}

DatasetManifest parseDatasetManifest(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw DataError(fmt::format("{}: not valid JSON: {}", where, e.what()));
  }
  DatasetManifest m;
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(key)) throw DataError(fmt::format("{}: missing '{}'", where, key));
    return j.at(key);
  };
  try {
    if (field("format").get<std::string>() != "cohort-shards") {
      throw DataError(fmt::format("{}: not a cohort dataset manifest", where));
    }
    m.formatVersion = jsonInt<int>(field("format_version"));
    if (m.formatVersion != kDatasetFormatVersion) {
      throw DataError(fmt::format("{}: dataset format version {} (this build reads {})", where,
                                  m.formatVersion, kDatasetFormatVersion));
    }
    m.name = j.value("name", "");
    m.encoding = field("encoding").get<std::string>();
    if (m.encoding != "image" && m.encoding != "raw" && m.encoding != "tokens") {
      throw DataError(fmt::format("{}: unknown encoding '{}' (image | raw | tokens)", where, m.encoding));
    }
    if (m.encoding == "tokens") {
      m.tokenizer = field("tokenizer").get<std::string>();
      m.vocabSize = jsonInt<int64_t>(field("vocab_size"));
      m.tokenBytes = j.contains("token_bytes") ? jsonInt<int>(j.at("token_bytes")) : 2;
      if (m.tokenBytes != 2 && m.tokenBytes != 4) {
        throw DataError(fmt::format("{}: token_bytes {}: tokens are 2 (uint16) or 4 (uint32) bytes", where,
                                    m.tokenBytes));
      }
      const int64_t most = m.tokenBytes == 2 ? 65536 : int64_t{1} << 31;
      if (m.vocabSize < 1 || m.vocabSize > most) {
        throw DataError(fmt::format("{}: vocab_size {} is not in [1, {}] (tokens are uint{})", where, m.vocabSize,
                                    most, 8 * m.tokenBytes));
      }
      if (j.contains("tokenizer_model")) {
        m.tokenizerModel = j.at("tokenizer_model").get<std::string>();
        m.tokenizerChecksum = field("tokenizer_checksum").get<std::string>();
        if (m.tokenizerModel.empty() || m.tokenizerModel.find('/') != std::string::npos ||
            m.tokenizerModel.find("..") != std::string::npos) {
          throw DataError(fmt::format("{}: tokenizer_model '{}' is not a file name in the dataset", where,
                                      m.tokenizerModel));
        }
      }
      if ((m.tokenizer == "sentencepiece" || m.tokenizer == "huggingface") && m.tokenizerModel.empty()) {
        throw DataError(fmt::format("{}: tokenizer {} without its tokenizer_model", where, m.tokenizer));
      }
      m.textBytes = j.contains("text_bytes") ? jsonInt<int64_t>(j.at("text_bytes")) : 0;
      if (m.textBytes < 0) throw DataError(fmt::format("{}: text_bytes {} is negative", where, m.textBytes));
    }
    if (j.contains("raw_shape")) m.rawShape = jsonInts<int64_t>(j.at("raw_shape"));
    if (m.encoding == "raw" && (m.rawShape.size() != 3 || m.rawShape[0] <= 0 ||
                                m.rawShape[1] <= 0 || m.rawShape[2] <= 0)) {
      throw DataError(fmt::format("{}: encoding raw needs raw_shape [channels, height, width]", where));
    }
    m.classes = field("classes").get<std::vector<std::string>>();
    m.source = j.value("source", "");
    m.created = j.value("created", "");
    if (j.contains("encryption")) {
      m.encryptionKeyId = j.at("encryption").at("key_id").get<std::string>();
      if (m.encryptionKeyId.size() != 32 ||
          m.encryptionKeyId.find_first_not_of("0123456789abcdef") != std::string::npos) {
        throw DataError(fmt::format("{}: encryption.key_id is not a key id (32 hex digits)", where));
      }
    }
    for (const auto& s : field("shards")) {
      ShardInfo info;
      info.name = s.at("name").get<std::string>();
      info.records = jsonInt<int64_t>(s.at("records"));
      info.bytes = jsonInt<int64_t>(s.at("bytes"));
      info.checksum = s.at("checksum").get<std::string>();
      if (info.name.empty() || info.name.find("..") != std::string::npos || info.name[0] == '/' ||
          info.records < 0 || info.bytes <= 0) {
        throw DataError(fmt::format("{}: shard entry '{}' is invalid", where, info.name));
      }
      m.shards.push_back(std::move(info));
    }
    if (j.contains("records") && jsonInt<int64_t>(j.at("records")) != m.records()) {
      throw DataError(fmt::format("{}: 'records' is {} but the shards hold {}", where,
                                  jsonInt<int64_t>(j.at("records")), m.records()));
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: {}", where, e.what()));
  }
  return m;
}

}  // namespace cohort::data
