#pragma once

// What the operator profiler writes (monitor/profiler.h), apart from the
// recording itself: the table's CSV, JSON and log lines, and the trace's
// text. Plain code, tested without LibTorch.

#include <cstdint>
#include <string>
#include <vector>

#include "cohort/monitor/profiler.h"

namespace cohort::monitor::detail {

// The floating-point operations of one call of a matrix product (aten::mm,
// addmm, bmm, baddbmm) from its input shapes: 2 n k m per matrix, the
// additions of addmm and baddbmm left out; < 0 for any other operator.
// (LibTorch's own count, with_flops, keeps the inputs of every operator
// alive while the profiler records: gigabytes over a few GPT steps.)
double productFlops(const std::string& name, const std::vector<std::vector<int64_t>>& shapes);

// The layout another page reads (docs/monitoring.md): {"rank", "steps":
// [first, last], "operators": [{"name", "calls", "self_us", "total_us",
// "input_shapes", "flops" (null: unknown)}]}, rows in the table's order.
std::string operatorJson(int rank, int64_t first, int64_t last, const std::vector<OperatorRow>& rows);
// name,calls,self_us,total_us,input_shapes,flops (flops empty: unknown).
std::string operatorCsv(const std::vector<OperatorRow>& rows);
// The table's first `rows` rows in fixed columns, with a header line.
std::vector<std::string> operatorLines(const std::vector<OperatorRow>& table, int rows);

// A trace event ("ph": "X") of a profiler event, JSON text: category
// user_annotation for a named range, cpu_op for an operator.
std::string traceEvent(const ProfiledEvent& e, bool range, int pid, int tid,
                       const std::string& dtypes);

// The trace file's text: a JSON object TensorBoard's PyTorch profiler plugin
// and Perfetto read, whose traceEvents are `events` (JSON texts).
std::string traceText(int rank, int worldSize, const std::vector<std::string>& events);

}  // namespace cohort::monitor::detail
