// cohort's SentencePiece module: the C interface of data/detail/spm_api.h
// over Debian's libsentencepiece. Built as a shared module of its own and
// loaded by data/tokenizer.cc (see spm_api.h for why).

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/detail/spm_api.h"

namespace {

void fail(const std::string& message, char* err, size_t errSize) {
  if (errSize == 0) return;
  const size_t n = std::min(message.size(), errSize - 1);
  std::memcpy(err, message.data(), n);
  err[n] = '\0';
}

// Runs `call` (returning the library's status): 0 when it succeeds, 1 with
// the status or exception in `err` otherwise. No exception leaves the module.
template <class F>
int guarded(char* err, size_t errSize, F&& call) {
  try {
    const sentencepiece::util::Status status = call();
    if (status.ok()) return 0;
    fail(status.ToString(), err, errSize);
  } catch (const std::exception& e) {
    fail(e.what(), err, errSize);
  }
  return 1;
}

class Lines final : public sentencepiece::SentenceIterator {
 public:
  Lines(cohort_spm_lines next, void* ctx) : next_(next), ctx_(ctx) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    const char* p = nullptr;
    size_t n = 0;
    done_ = next_(ctx_, &p, &n) == 0;
    if (!done_) line_.assign(p, n);
  }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  cohort_spm_lines next_;
  void* ctx_;
  std::string line_;
  bool done_ = false;
};

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* cohort_spm_load(const char* model, size_t n, char* err,
                                                             size_t errSize) {
  try {
    auto* sp = new sentencepiece::SentencePieceProcessor();
    const auto status = sp->LoadFromSerializedProto(std::string_view(model, n));
    if (status.ok()) return sp;
    fail(status.ToString(), err, errSize);
    delete sp;
  } catch (const std::exception& e) {
    fail(e.what(), err, errSize);
  }
  return nullptr;
}

__attribute__((visibility("default"))) void cohort_spm_free(void* model) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(model);
}

__attribute__((visibility("default"))) int cohort_spm_size(void* model) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(model)->GetPieceSize();
}

__attribute__((visibility("default"))) int cohort_spm_piece(void* model, const char* piece, size_t n) {
  const auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(model);
  const int id = sp->PieceToId(std::string_view(piece, n));
  return sp->IsUnknown(id) && sp->IdToPiece(id) != std::string_view(piece, n) ? -1 : id;
}

__attribute__((visibility("default"))) int cohort_spm_encode(void* model, const char* text, size_t n,
                                                             cohort_spm_ids out, void* ctx, char* err,
                                                             size_t errSize) {
  return guarded(err, errSize, [&] {
    std::vector<int> ids;
    const auto status =
        static_cast<sentencepiece::SentencePieceProcessor*>(model)->Encode(std::string_view(text, n), &ids);
    if (status.ok()) out(ctx, ids.data(), ids.size());
    return status;
  });
}

__attribute__((visibility("default"))) int cohort_spm_decode(void* model, const int* ids, size_t n,
                                                             cohort_spm_bytes out, void* ctx, char* err,
                                                             size_t errSize) {
  return guarded(err, errSize, [&] {
    std::string text;
    const auto status =
        static_cast<sentencepiece::SentencePieceProcessor*>(model)->Decode(std::vector<int>(ids, ids + n), &text);
    if (status.ok()) out(ctx, text.data(), text.size());
    return status;
  });
}

__attribute__((visibility("default"))) int cohort_spm_train(const char* const* keys, const char* const* values,
                                                            size_t args, cohort_spm_lines lines, void* linesCtx,
                                                            cohort_spm_bytes model, void* modelCtx, char* err,
                                                            size_t errSize) {
  return guarded(err, errSize, [&] {
    std::unordered_map<std::string, std::string> flags;
    for (size_t i = 0; i < args; ++i) flags[keys[i]] = values[i];
    Lines text(lines, linesCtx);
    std::string serialized;
    const auto status = sentencepiece::SentencePieceTrainer::Train(flags, &text, &serialized);
    if (status.ok()) model(modelCtx, serialized.data(), serialized.size());
    return status;
  });
}

}  // extern "C"
