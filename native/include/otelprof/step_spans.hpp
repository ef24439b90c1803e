// Live step spans (otelprof/capture/spans/step_spans.py) -> ExportTraceServiceRequest bytes: one span
// per training step with a child per phase interval, ids as the converter makes them (a step's
// trace id is that of ProfilerStep#N of the run), so a profiled step's operator spans share it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "otelprof/encoder.hpp"
#include "otelprof/spans.hpp"

namespace otelprof {

struct StepPhase {
    std::string name;  // data, forward, backward, optimizer
    int64_t start = 0, end = 0;
    std::string module;  // a forward's root module class ("": unknown, no attribute)
};

// A step's memory peaks (capture/memory/peaks.py reads them at its end; nullopt: not read)
// and the out-of-memory errors caught during it (0: none, no attribute).
struct StepMemory {
    std::optional<int64_t> allocated, reserved, resident;  // bytes
    int64_t ooms = 0;
};

struct StepRecord {
    std::string name;  // train.step, or a step_scope()'s name
    int64_t number = 0, start = 0, end = 0;
    uint64_t ordinal = 0;  // the step span's id ordinal; its phases take the ones that follow
    std::optional<TraceId> trace_id;  // the application's current span's; else the step's own
    std::optional<SpanId> parent_id;
    std::optional<int64_t> samples, tokens;
    int64_t dropped_phases = 0;
    int64_t micro_batches = 0;  // DataLoader batches in the step (0: none, no attribute)
    bool skipped = false;       // its optimizer update was skipped (false: no attribute)
    std::string window;  // to a profiling window: recorded or warmup (+ ":<trigger>"), after ("": none)
    std::vector<StepPhase> phases;
    StepMemory memory;
};

using ResourceValue = std::variant<std::string, int64_t, double, bool>;

class StepSpanEncoder {
  public:
    // `trace_prefix`: "step|<run id>|", the converter's step trace-id key before the number;
    // `span_base`: ids.span_base(run id, "live|<rank>").
    StepSpanEncoder(std::vector<std::pair<std::string, ResourceValue>> resource, std::string scope_version,
                    std::string trace_prefix, uint64_t span_base);
    std::vector<Request> encode(const std::vector<StepRecord>& steps, size_t max_bytes) const;

  private:
    std::vector<std::pair<std::string, ResourceValue>> resource_;
    std::string scope_version_, trace_prefix_;
    uint64_t span_base_;
};

}  // namespace otelprof
