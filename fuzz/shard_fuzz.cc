// Shard files (src/data/shard.cc): the footer and index, and the records,
// read both ways the readers do: through the index (random access, as
// ShardDataset) and in order from the start (scanShard, as `cohort data
// verify`).
//
// Input: one shard file. Reads past its end throw DataError, as ShardSource's.

#include <fmt/format.h>

#include "cohort/data/shard.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cohort;
  const std::string file = fuzz::asString(data, size);
  const std::string name = "fuzz.shard";
  const auto fileBytes = static_cast<int64_t>(file.size());
  data::ReadAt read = [&](int64_t offset, int64_t length) {
    fuzz::require(offset >= 0 && length >= 0,
                  fmt::format("read of {} bytes at offset {}", length, offset));
    if (offset > fileBytes || length > fileBytes - offset) {
      throw DataError(fmt::format("{}: read of {} bytes at offset {} is past its end ({} bytes)",
                                  name, length, offset, fileBytes));
    }
    return file.substr(static_cast<size_t>(offset), static_cast<size_t>(length));
  };

  data::ShardIndex index;
  if (fuzz::expectInputError(name, [&] { index = data::readShardIndex(read, fileBytes, name); })) {
    for (size_t r = 0; r < index.size(); ++r) {
      const int64_t at = index.begin(r);
      fuzz::require(at >= data::kShardHeaderBytes && index.end(r) > at && index.end(r) <= fileBytes,
                    fmt::format("record {} spans [{}, {}) in a {}-byte file", r, at, index.end(r),
                                fileBytes));
      fuzz::expectInputError(name, [&] {
        const data::Record rec = data::parseRecord(read(at, index.end(r) - at), at, name);
        fuzz::require(static_cast<int64_t>(rec.key.size()) <= data::kMaxKeyBytes, "key too long");
      });
    }
  }
  int64_t records = 0;
  fuzz::expectInputError(name, [&] {
    data::scanShard(read, fileBytes, name, [&](const data::Record&, int64_t) { ++records; });
  });
  return 0;
}
