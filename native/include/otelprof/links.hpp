// Forward -> backward pairs of CPU ops (mirrors reference/tree.py fwdbwd_pairs); builder.cpp
// turns the pairs whose ops both stay spans into "fwdbwd" span links.
#pragma once

#include <utility>
#include <vector>

#include "otelprof/json.hpp"
#include "otelprof/trace.hpp"
#include "otelprof/tree.hpp"

namespace otelprof {

// (forward event, backward event) index pairs, in the reference's order.
std::vector<std::pair<int, int>> fwdbwd_pairs(const Trace& trace, const EventTree& tree);

}  // namespace otelprof
