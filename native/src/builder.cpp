// The assembly of a trace's spans (reference/builder.py's build): build_spans runs named stages,
// each a function of a BuildState, in the reference's order and under its names: trace_identity,
// event_tree, volume_keep, window_iterations, trace_ids_and_roots, gpu_lanes, aggregate_sibling_runs,
// apply_budget, window_root_rule, aggregate_spans, hidden_counts, op_self_times,
// memory_span_events, op_attributes, fwdbwd_links, assemble_synthetic_roots, assemble_event_spans, order_spans,
// finish_build. The stages of their own files (tree.cpp, volume.cpp, iterations.cpp, links.cpp,
// aggregates.cpp) run from them.
// This file runs them and holds the first ones (identity, tree, volume, iterations, trace ids);
// build_budget.cpp the volume control that follows, build_assemble.cpp the assembly
// (build_state.hpp: the BuildState they share).
#include "otelprof/builder.hpp"

#include <algorithm>
#include <string>

#include "otelprof/beside.hpp"
#include "otelprof/ids.hpp"
#include "otelprof/iterations.hpp"
#include "otelprof/tree.hpp"
#include "otelprof/volume.hpp"

#include "build_state.hpp"

namespace otelprof {

namespace detail {

namespace {

// Counters, rank, run id and window id: what every id of the trace derives from.
void trace_identity(BuildState& st) {
    const Trace& trace = st.trace;
    const Options& opts = st.opts;
    const std::vector<Event>& ev = st.ev;
    const int n = st.n;
    // packed attributes take 50-70 bytes an event at full detail on the shared traces, far fewer
    // at default detail: room reserved, not touched, costs no memory until written
    st.out.attrs.reserve(static_cast<size_t>(n) * 64 + trace.memory.size() * 48 + 4096);
    int64_t* stats = st.stats;
    stats[EVENTS_TOTAL] = trace.total;
    stats[COMPLETE_EVENTS] = n;
    stats[METADATA_EVENTS] = trace.metadata_events;
    stats[IGNORED_EVENTS] = trace.ignored_events;
    stats[MEMORY_EVENTS] = static_cast<int64_t>(trace.memory.size());
    stats[FLOW_EVENTS] = static_cast<int64_t>(trace.flows.size());

    st.rank = opts.rank ? opts.rank : trace.rank;
    st.world = opts.world_size ? opts.world_size : trace.world_size;
    st.rank_s = st.rank ? std::to_string(*st.rank) : std::string();
    // one pass over the events (a large trace's are megabytes): their earliest start, and the
    // window id's fold of (start, end)
    int64_t min_start = n ? ev[0].start : 0;
    WindowFold fold;
    for (const Event& e : ev) {
        min_start = std::min(min_start, e.start);
        fold.add(e.start, e.end);
    }
    if (opts.run_id) {
        st.run_id = *opts.run_id;
    } else if (trace.trace_id) {
        st.run_id = std::string(*trace.trace_id);
    } else {
        st.run_id = "auto|" + std::string(trace.trace_name) + "|" + std::to_string(min_start);
    }
    st.min_start = min_start;
    st.split = opts.split_world_size > 0 && st.world.value_or(1) >= opts.split_world_size;
    st.out.window_id = fold.finish(trace.total);
    st.base = fnv1a64("span|" + st.run_id + "|" + st.rank_s + "|" + st.out.window_id, kSeedHi);
}

// A CPU-side event of a live step's marker that lies wholly outside the step's own interval (what
// its ProfilerStep range held before the step began or after it ended: otelprof's own work at the
// boundary) is in no recorded step: not a span, counted (reference: _outside_live_steps).
void outside_live_steps(BuildState& st) {
    const std::vector<Event>& ev = st.ev;
    const std::vector<int>& owner = st.tree.owner;
    std::vector<const LiveStep*> bounds(st.tree.steps.size(), nullptr);  // by step index
    bool any = false;
    for (int s : st.tree.steps) any |= (bounds[st.tree.step_index[s]] = st.live_interval(s)) != nullptr;
    if (!any) return;
    for (int i = 0; i < st.n; ++i) {
        const int o = owner[i];
        if (o < 0 || o == i || o >= st.n || !st.is_step(o) || ev[i].device()) continue;
        const LiveStep* ls = bounds[st.tree.step_index[o]];
        if (ls && (ev[i].end <= ls->start || ev[i].start >= ls->end)) {
            st.keep[i] = 0;
            st.reason[i] = kHiddenOutsideStep;
        }
    }
}

}  // namespace

// Steps, nesting, launches and owners (tree.cpp; reference: tree.py): what every later stage
// reads. trace_identity, which reads the events alone, runs beside the tree's CPU-side nesting.
void identity_and_tree(BuildState& st) {
    st.tree = build_tree(st.trace, st.two_threads, [&] { trace_identity(st); });
    st.stats[STEPS] = static_cast<int64_t>(st.tree.steps.size());
    st.stats[DEVICE_EVENTS_UNLINKED] = st.tree.device_events_unlinked;
}

// Which events stay spans at default detail (volume.cpp; reference: volume.keep_rule).
void volume_keep(BuildState& st) {
    st.keep.assign(static_cast<size_t>(st.n), 1);
    st.reason.assign(static_cast<size_t>(st.n), 0);
    if (!st.full) {
        st.launched = launched_device_time(st.trace, st.tree);
        st.keep = keep_rule(st.trace, st.tree, st.launched, st.opts.min_duration_ns, st.reason);
    }
    st.nearest.assign(static_cast<size_t>(st.n), kUnset);
}

// A window without steps is cut into iterations (iterations.cpp; reference: tree.iteration_owners).
void window_iterations(BuildState& st) {
    st.it_base = st.n + static_cast<int>(st.tree.steps.size()) + 1;
    if (st.tree.steps.empty() && st.n)
        st.iterations = find_iterations(st.trace, st.tree, st.keep, st.span_budget, st.it_base, st.tree.owner);
    st.n_iter = static_cast<int>(st.iterations.lo.size());
    st.stats[ITERATIONS] = st.n_iter;
}

// Each trace's id (step, detail, live step, window, iteration) and the window's root.
void trace_ids_and_roots(BuildState& st) {
    const std::vector<Event>& ev = st.ev;
    const int n = st.n;
    const bool split = st.split;
    const std::vector<int>& steps = st.tree.steps;
    const std::vector<int>& step_index = st.tree.step_index;
    const std::vector<int64_t>& step_num = st.tree.step_num;
    const std::vector<int>& owner = st.tree.owner;
    const std::vector<char>& keep = st.keep;
    const std::string& run_id = st.run_id;
    const std::string& rank_s = st.rank_s;
    st.n_total = st.trace.total;
    st.step_trace.resize(steps.size());
    st.detail_trace.resize(split ? steps.size() : 0);
    for (int s : steps) {
        st.step_trace[step_index[s]] = make_trace_id("step|" + run_id + "|" + std::to_string(step_num[s]));
        if (split) st.detail_trace[step_index[s]] = make_trace_id("detail|" + run_id + "|" + rank_s + "|" + std::to_string(step_num[s]));
    }
    // live train.step spans (capture/windows.py): by step index; not with split detail traces
    st.live_of.assign(split ? 0 : steps.size(), nullptr);
    const std::vector<LiveStep>& live_steps = st.opts.live_steps;
    if (!split && st.opts.live_match == LiveMatch::time) {
        // the markers in order of start (ties: trace order), each to the unused live step whose
        // [start, end] overlaps its own most (more than 0; ties: the first given)
        std::vector<char> used(live_steps.size(), 0);
        for (int s : steps) {
            size_t best = live_steps.size();
            int64_t most = 0;
            for (size_t j = 0; j < live_steps.size(); ++j) {
                if (used[j]) continue;
                const int64_t hi = std::min(ev[s].end, live_steps[j].end), lo = std::max(ev[s].start, live_steps[j].start);
                if (hi <= lo) continue;  // lo >= the live start >= 0: hi - lo cannot overflow
                if (hi - lo > most) {
                    best = j;
                    most = hi - lo;
                }
            }
            if (best == live_steps.size()) continue;
            used[best] = 1;
            st.live_of[step_index[s]] = &live_steps[best];
            st.step_trace[step_index[s]] = live_steps[best].trace_id;
            st.any_live = true;
        }
    } else if (!split) {
        for (const LiveStep& ls : live_steps) {
            for (int s : steps) {
                if (step_num[s] == ls.number && !st.live_of[step_index[s]]) {
                    st.live_of[step_index[s]] = &ls;
                    st.step_trace[step_index[s]] = ls.trace_id;
                    st.any_live = true;
                    break;
                }
            }
        }
    }
    if (st.any_live) outside_live_steps(st);
    st.window_trace = make_trace_id("window|" + run_id + "|" + rank_s + "|" + st.out.window_id);
    for (int k = 0; k < st.n_iter; ++k)
        st.iteration_trace.push_back(make_trace_id("iteration|" + run_id + "|" + rank_s + "|" + st.out.window_id + "|" + std::to_string(k + 1)));

    int window_root_ev = -1;
    bool has_window = false, window_owned = false;  // hidden events of the window fold into its root
    int64_t win_min = 0, win_max = 0, owned_min = 0, owned_max = 0;
    for (int i = 0; i < n; ++i) {
        if (owner[i] != -1) continue;
        if (!window_owned) {
            owned_min = ev[i].start;
            owned_max = ev[i].end;
        }
        window_owned = true;
        owned_min = std::min(owned_min, ev[i].start);
        owned_max = std::max(owned_max, ev[i].end);
        if (!keep[i]) continue;
        if (!has_window) {
            win_min = ev[i].start;
            win_max = ev[i].end;
        }
        has_window = true;
        win_min = std::min(win_min, ev[i].start);
        win_max = std::max(win_max, ev[i].end);
        if (ev[i].kind == Kind::TraceSpan && (window_root_ev < 0 || ev[i].ordinal < ev[window_root_ev].ordinal)) window_root_ev = i;
    }
    if (window_owned && !has_window) {  // only hidden events: the root spans them
        has_window = true;
        win_min = owned_min;
        win_max = owned_max;
    }
    if (st.n_iter && !has_window) {  // iteration roots link to the window root: it spans the events
        has_window = true;
        win_min = ev[0].start;
        win_max = ev[0].end;
        for (const Event& e : ev) {
            win_min = std::min(win_min, e.start);
            win_max = std::max(win_max, e.end);
        }
    }
    st.window_root_ev = window_root_ev;
    st.window_slot = n + static_cast<int>(steps.size());
    st.n_slots = static_cast<size_t>(st.it_base + st.n_iter);
    if (has_window) {
        if (window_root_ev >= 0) {
            st.window_root = window_root_ev;
        } else {
            st.window_root = st.window_slot;
            Span sp;
            sp.trace_id = st.window_trace;
            sp.span_id = st.slot_id(st.window_slot);
            sp.name = "otelprof.window";
            sp.start = win_min;
            sp.end = win_max;
            // attributes are added at assembly, once dropped counts are known
            st.synthetic.push_back(std::move(sp));
        }
    }
}

}  // namespace detail

using namespace detail;

// The stages, in order; reference/builder.py's build runs the same ones under the same names.
Built build_spans(Trace& trace, const Options& opts) {
    BuildState st(trace, opts);
    identity_and_tree(st);  // trace_identity, event_tree
    volume_keep(st);
    window_iterations(st);
    trace_ids_and_roots(st);
    gpu_lanes(st);
    aggregate_sibling_runs(st);
    apply_budget(st);
    window_root_rule(st);
    aggregate_spans(st);
    hidden_counts(st);
    // op_self_times reads the trace's events and the tree alone: on two threads, it runs beside
    // the next two
    auto span_events_and_links = [&] {
        memory_span_events(st);
        op_attributes(st);
        fwdbwd_links(st);
    };
    run_both(st.two_threads, span_events_and_links, [&] { op_self_times(st); });
    // the key_averages rows read the trace and the self times alone: on two threads, they are
    // made beside the spans' assembly, which writes only the output's spans
    auto spans = [&] {
        assemble_synthetic_roots(st);
        assemble_event_spans(st);
        order_spans(st);
        cut_values(st);
    };
    run_both(st.two_threads, spans, [&] { key_average_rows(st); });
    return finish_build(st);
}

}  // namespace otelprof
