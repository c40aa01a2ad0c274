#pragma once

// A language model served split across local ranks (`cohort serve --procs
// N`, openSplitPredictor in serve/model.h): what the front process (which
// speaks HTTP and holds no weights) and the rank processes share.
//
// The group is Gloo's over the N ranks and the front, which is member N.
// Every call is one command the front sends to every rank (tag kTagCommand):
// a header [op, rows, longest, frees] and then, unless the op is stop, a
// body of int64: the rows' cache ids [rows], their token counts [rows], the
// cache ids to drop [frees], the tokens [rows, longest] (each row's first
// count tokens; the rest is padding). Rank 0 embeds the tokens; each rank
// sends its result to the next (kTagActivations), float32 [rows, longest,
// n_embd]; the last sends the logits to the front (kTagLogits): forward's
// [rows, longest, vocab], decode's [rows, vocab]. Split over a tensor group
// instead (--tensor, forward only), every rank embeds the tokens and sends
// the front its columns of the logits [rows, longest, vocab / N], the
// blocks' sums going over the ranks' own group. A rank that fails exits;
// its peers' and the front's waits then fail as its connections close.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cohort/serve/model.h"
#include "cohort/serve/server.h"

namespace cohort::serve::detail {

enum class SplitOp : int64_t { forward = 1, decode = 2, stop = 3 };

inline constexpr int kTagCommand = 0;
inline constexpr int kTagActivations = 1;
inline constexpr int kTagLogits = 2;

// The group's own timeout: how long a rank waits for the front's next
// command (the server may idle for days). The front bounds its own waits
// by SplitOptions::timeout; a peer's end closes its connections, which
// fails the waits on it at once.
inline constexpr std::chrono::milliseconds kSplitIdle = std::chrono::hours(24 * 30);

struct SplitCommand {
  SplitOp op = SplitOp::stop;
  std::vector<int64_t> ids, counts, frees;
  at::Tensor tokens;  // [rows, longest] int64
};

// The header and the body of `c` (the body undefined for stop).
std::pair<at::Tensor, at::Tensor> packCommand(const SplitCommand& c);
// The body's size in elements for `header`; throws DataError for a header
// that is not one.
int64_t commandBodySize(const at::Tensor& header);
SplitCommand unpackCommand(const at::Tensor& header, const at::Tensor& body);

// Blocks [first, end) of each of `procs` stages of a model of `blocks`
// blocks: consecutive, as even as can be (parallel::balanceStages at equal
// costs).
std::vector<std::pair<int64_t, int64_t>> stageBlocks(int64_t blocks, int procs);

// The store keys a rank sets once its stage is loaded.
std::string splitReadyKey(int rank);

// `cohort serve MODEL --procs N --split-rank r --split-store PORT`: rank r
// loads its stage, joins the group and answers the front's commands until
// stop. Returns 0 after stop, 1 after a failure (logged).
int runSplitRank(const ServeOptions& options);

// Throws DataError unless `input` is what `info` takes (the contract in
// serve/model.h).
void checkInput(const at::Tensor& input, const ModelInfo& info);

}  // namespace cohort::serve::detail
