// Events -> span tree, links, span events, per-op aggregates (mirrors reference/builder.py).
#pragma once

#include <string_view>

#include "otelprof/spans.hpp"
#include "otelprof/trace.hpp"

namespace otelprof {

// The result's strings are views into the JSON text the trace was read from, into static tables
// or into Built::strings (which takes over Trace::strings), so that the trace can be freed before
// the spans are encoded. The trace's memory events and flows are freed once read (its events stay).
Built build_spans(Trace& trace, const Options& opts);

}  // namespace otelprof
