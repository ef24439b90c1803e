// One call from JSON bytes to OTLP requests, per-op rows and counters. Pure C++: no Python here.
#pragma once

#include <functional>
#include <memory>
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
    // wall time of parse / read / build / free (what encoding does not need) / encode, for
    // benchmarks; parse_tail: the second parser's share of the parse (Options::threads), or 0
    Stats phase_ns;
    std::string window_id;
};

class Document;
class TraceReader;

// Throws TraceError for input that is not a readable trace.
ConvertOutput convert_trace(std::string_view json, const Options& options);

// The rest of a conversion once `doc` has been parsed with `reader` as its sink (`parse_ns`:
// how long that took, reported as the "parse" phase). `text_read`, when given, is called once
// nothing refers to the JSON text any more (the trace is read), to free it before the build.
ConvertOutput convert_parsed(std::unique_ptr<TraceReader> reader, std::unique_ptr<Document> doc, const Options& options,
                             int64_t parse_ns, const std::function<void()>& text_read = {});

}  // namespace otelprof
