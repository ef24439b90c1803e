// Events -> span tree, links, span events, per-op aggregates (mirrors reference/builder.py).
#pragma once

#include "otelprof/spans.hpp"
#include "otelprof/trace.hpp"

namespace otelprof {

Built build_spans(const Document& doc, const Trace& trace, const Options& opts);

}  // namespace otelprof
