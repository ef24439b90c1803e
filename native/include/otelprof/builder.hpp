// Events -> span tree, links, span events, per-op aggregates (mirrors reference/builder.py).
#pragma once

#include <string_view>

#include "otelprof/spans.hpp"
#include "otelprof/trace.hpp"

namespace otelprof {

// `json`: the text `doc` was parsed from. The result's strings are views into it, into static
// tables or into Built::strings, never into `doc` (its decoded strings are copied), so that the
// document and the trace can be freed before the spans are encoded. The trace's memory events and
// flows are freed once read (its events stay).
Built build_spans(const Document& doc, Trace& trace, const Options& opts, std::string_view json);

}  // namespace otelprof
