// Volume control at default detail (mirrors reference/volume.py launched_device_time and
// keep_rule): which events stay spans before the span budget (build_budget.cpp) runs.
#pragma once

#include <cstdint>
#include <vector>

#include "otelprof/trace.hpp"
#include "otelprof/tree.hpp"

namespace otelprof {

// Device time launched from each CPU-side subtree (kernels, copies, sets under their launch).
std::vector<int64_t> launched_device_time(const Trace& trace, const EventTree& tree);

// Per event, whether it stays; `reason` (sized to the events) gets why a kept-by-kind event goes.
std::vector<char> keep_rule(const Trace& trace, const EventTree& tree, const std::vector<int64_t>& launched,
                            int64_t min_ns, std::vector<uint8_t>& reason);

}  // namespace otelprof
