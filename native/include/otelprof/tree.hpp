// The event tree of a trace (mirrors reference/tree.py): steps, CPU nesting per thread, device
// events under their launch, and each event's owning step. Built once; the later stages read it.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "otelprof/json.hpp"
#include "otelprof/trace.hpp"

namespace otelprof {

struct EventTree {
    std::vector<int64_t> step_num;  // per event: N of ProfilerStep#N when it is a step, else -1
    std::vector<int> steps;         // the step events, by start
    std::vector<int> step_index;    // per event: its index in steps, else -1
    std::vector<int64_t> step_starts, step_ends;  // of steps, in steps' order
    std::vector<int> parent;        // per event: enclosing CPU event, or launching one; -1: none
    std::vector<int> probe_owner;   // memory events, then fwdbwd flows: the CPU event around each
    std::vector<int> sweep_order;   // CPU-side events, thread by thread, parents before children
    std::vector<const Flow*> fwd_flows;  // the fwdbwd flow ends, in file order
    std::vector<int> owner;         // per event: its step, or -1
    int64_t device_events_unlinked = 0;

    bool is_step(int i) const { return i >= 0 && i < static_cast<int>(step_num.size()) && step_num[i] >= 0; }
    // The step whose interval holds `ts`, or -1.
    int step_at(int64_t ts) const;
};

// With two_threads, the CPU side's nesting runs beside the device side's and the steps', then
// `also` (work of the caller's that writes nothing the tree does), on a second thread.
EventTree build_tree(const Trace& trace, bool two_threads = false, const std::function<void()>& also = {});

}  // namespace otelprof
