// One call from JSON bytes to OTLP requests, per-op rows and counters. Pure C++: no Python here.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "otelprof/encoder.hpp"
#include "otelprof/spans.hpp"

namespace otelprof {

struct ConvertOutput {
    std::vector<Request> requests;
    std::vector<OpRow> ops;
    Stats stats;
    Stats phase_ns;  // wall time of parse / read / build / free (what encoding does not need) / encode, for benchmarks
    std::string window_id;
};

// Throws TraceError for input that is not a readable trace.
ConvertOutput convert_trace(std::string_view json, const Options& options);

}  // namespace otelprof
