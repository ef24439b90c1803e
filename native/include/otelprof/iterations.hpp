// Iterations of a window without steps (mirrors reference/builder.py's iterations stage and
// tree.iteration_owners).
#pragma once

#include <cstdint>
#include <vector>

#include "otelprof/trace.hpp"
#include "otelprof/tree.hpp"

namespace otelprof {

struct Iterations {
    std::vector<int64_t> lo, hi;  // iteration k's interval, widened to what it owns
    const char* source = nullptr;  // "optimizer_step" or "span_budget"; nullptr: none found
};

// For a window with no steps. When iterations are found, `owner` (the tree's) is rewritten:
// events owned by iteration k get it_base + k, others -1.
Iterations find_iterations(const Trace& trace, const EventTree& tree, const std::vector<char>& keep,
                           int64_t span_budget, int it_base, std::vector<int>& owner);

}  // namespace otelprof
