#pragma once

// The C interface of cohort's SentencePiece module (src/data/spm/module.cc,
// built as libcohort_spm.so), which data/tokenizer.cc loads with dlopen.
//
// Why a module of its own: Debian's libsentencepiece carries a copy of
// protobuf-lite (an older one) and exports its symbols, and LibTorch loads
// the system's libprotobuf. Linked into one program, whichever is found
// first serves both, and the other crashes (at start-up, or in the first
// SentencePiece call). Loaded with RTLD_LOCAL | RTLD_DEEPBIND, the module
// and libsentencepiece resolve their symbols among themselves first, and
// none of theirs joins the program's.
//
// Memory never crosses the boundary: results come back through callbacks
// into buffers the module owns for the call, errors into the caller's
// buffer; each call returns 0 on success.

#include <cstddef>

extern "C" {

typedef void (*cohort_spm_bytes)(void* ctx, const char* data, size_t n);
typedef void (*cohort_spm_ids)(void* ctx, const int* ids, size_t n);
// The next line of the training text: 1 with it in *line / *n, 0 at the end.
typedef int (*cohort_spm_lines)(void* ctx, const char** line, size_t* n);

// A model from its serialized bytes; null (and a message in err) when it
// does not load.
typedef void* (*cohort_spm_load_fn)(const char* model, size_t n, char* err, size_t errSize);
typedef void (*cohort_spm_free_fn)(void* model);
typedef int (*cohort_spm_size_fn)(void* model);
// The id of `piece`, or -1 when it is not in the vocabulary.
typedef int (*cohort_spm_piece_fn)(void* model, const char* piece, size_t n);
typedef int (*cohort_spm_encode_fn)(void* model, const char* text, size_t n, cohort_spm_ids out, void* ctx,
                                    char* err, size_t errSize);
typedef int (*cohort_spm_decode_fn)(void* model, const int* ids, size_t n, cohort_spm_bytes out, void* ctx,
                                    char* err, size_t errSize);
// Trains with the trainer's flags (names without "--") on the lines.
typedef int (*cohort_spm_train_fn)(const char* const* keys, const char* const* values, size_t args,
                                   cohort_spm_lines lines, void* linesCtx, cohort_spm_bytes model, void* modelCtx,
                                   char* err, size_t errSize);
}
