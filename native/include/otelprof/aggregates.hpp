// Per-op aggregates (torch's key_averages() rows), mirrors reference tree.self_times and
// builder._aggregate_ops.
#pragma once

#include <cstdint>
#include <vector>

#include "otelprof/json.hpp"
#include "otelprof/spans.hpp"
#include "otelprof/trace.hpp"

namespace otelprof {

struct SelfTimes {
    std::vector<char> in_aggregate;  // per event: an op or annotation of the key_averages tree
    std::vector<int> parent;         // nearest ancestor in that tree, -1: none
    std::vector<int> children;       // its children in that tree
    std::vector<int64_t> child_dur;  // their CPU time
    std::vector<int64_t> self_device;  // device time it launched, not through a child
};

// `parent`: the event tree's (tree.hpp).
SelfTimes self_times(const Trace& trace, const std::vector<int>& parent);

std::vector<OpRow> aggregate_ops(const Trace& trace, const SelfTimes& self,
                                 const std::vector<int>& sweep_order, bool group_by_input_shapes);

}  // namespace otelprof
