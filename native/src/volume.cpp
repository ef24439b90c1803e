// Volume control at default detail (mirrors reference/volume.py): a trace at full detail has
// ~100k spans, most of them too short to matter; these rules decide which stay.
#include "otelprof/volume.hpp"

#include "otelprof/schema.hpp"

#include "build_common.hpp"

namespace otelprof {

using namespace detail;

// What each CPU op launched counts as its worth at default detail: a 2 us op that launched 5 ms
// of kernels stays. Children first, so each subtree's total reaches its root.
std::vector<int64_t> launched_device_time(const Trace& trace, const EventTree& tree) {
    const std::vector<Event>& ev = trace.events;
    const std::vector<int>& parent = tree.parent;
    const int n = static_cast<int>(ev.size());
    std::vector<int64_t> launched(n, 0);
    for (int d = 0; d < n; ++d)
        if (is_device_time(ev[d].kind) && parent[d] >= 0) launched[parent[d]] += ev[d].dur();
    for (auto it = tree.sweep_order.rbegin(); it != tree.sweep_order.rend(); ++it)  // children first
        if (parent[*it] >= 0) launched[parent[*it]] += launched[*it];
    return launched;
}

// An op stays when its CPU time or the device time of what it launched passes the threshold, and
// the op that launched a kept kernel stays when nothing between the launch and the trace root
// would (a kernel is never left without an operator name above it). The device copy of a step
// (a GPU annotation under its ProfilerStep#N) goes: the step span already says it.
std::vector<char> keep_rule(const Trace& trace, const EventTree& tree, const std::vector<int64_t>& launched,
                            int64_t min_ns, std::vector<uint8_t>& reason) {
    const std::vector<Event>& ev = trace.events;
    const std::vector<int>& parent = tree.parent;
    const int n = static_cast<int>(ev.size());
    std::vector<char> keep(n, 1);
    for (int i = 0; i < n; ++i) {
        const Event& e = ev[i];
        keep[i] = e.device() || tree.is_step(i) ||
                  (e.kind != Kind::Python && (e.kind == Kind::TraceSpan || e.dur() >= min_ns ||
                                              (e.kind != Kind::Runtime && launched[i] >= min_ns)));
    }
    const std::vector<char> base = keep;
    for (int d = 0; d < n; ++d) {
        if (!is_device_time(ev[d].kind) || parent[d] < 0) continue;
        int j = parent[d], op = -1;
        while (j >= 0 && !(base[j] && ev[j].kind != Kind::Runtime)) {
            const Kind k = ev[j].kind;
            if (op < 0 && k != Kind::Runtime && k != Kind::Python && k != Kind::TraceSpan) op = j;
            j = parent[j];
        }
        // (no op encloses the launch: the kernel goes to its GPU lane, build_budget.cpp gpu_lanes)
        if (op >= 0 && (j < 0 || tree.is_step(j) || ev[j].kind == Kind::TraceSpan)) keep[op] = 1;
    }
    for (int i = 0; i < n; ++i) {
        if (ev[i].kind == Kind::GpuAnnotation && tree.is_step(parent[i])) {
            keep[i] = 0;
            reason[i] = kHiddenStepCopy;
        }
    }
    return keep;
}

}  // namespace otelprof
