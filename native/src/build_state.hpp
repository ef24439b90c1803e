// What build_spans's stages share (builder.cpp, build_budget.cpp, build_assemble.cpp): the
// BuildState they fill in, the helpers more than one of them calls, and the stages themselves.
// Internal to those three files; tree.cpp and the other stages' own files use build_common.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "otelprof/aggregates.hpp"
#include "otelprof/builder.hpp"
#include "otelprof/ids.hpp"
#include "otelprof/iterations.hpp"
#include "otelprof/names.hpp"
#include "otelprof/tree.hpp"

#include "build_common.hpp"

namespace otelprof::detail {

// Counters returned with every conversion (same names and order as the reference's STAT_KEYS).
enum StatKey { EVENTS_TOTAL, COMPLETE_EVENTS, METADATA_EVENTS, IGNORED_EVENTS, MEMORY_EVENTS, FLOW_EVENTS, STEPS, ITERATIONS, SPANS, SYNTHETIC_SPANS, AGGREGATE_SPANS, AGGREGATED_EVENTS, DROPPED_PYTHON, DROPPED_SHORT, MEMORY_EVENTS_DROPPED, LINKS, LINKS_DROPPED, DEVICE_EVENTS_UNLINKED, REQUESTS, VALUES_TRUNCATED, DROPPED_BUDGET, DROPPED_STEP_COPIES, DROPPED_WINDOW_ROOTS, DROPPED_OUTSIDE_STEP, OP_ATTRIBUTES_JOINED, OP_ATTRIBUTES_UNPLACED, OP_ATTRIBUTES_UNMATCHED, OP_ATTRIBUTES_MISSING, kStatCount };

// Per-slot lists where few slots have any: an index per slot, the lists allocated on demand.
template <typename T>
class SparseLists {
  public:
    SparseLists() = default;
    explicit SparseLists(size_t slots) : index_(slots, kNone) {}
    std::vector<T>& at(size_t slot) {
        uint32_t& k = index_[slot];
        if (k == kNone) {
            k = static_cast<uint32_t>(lists_.size());
            lists_.emplace_back();
        }
        return lists_[k];
    }
    std::vector<T>* find(size_t slot) { return index_[slot] == kNone ? nullptr : &lists_[index_[slot]]; }

  private:
    static constexpr uint32_t kNone = UINT32_MAX;
    std::vector<uint32_t> index_;
    std::vector<std::vector<T>> lists_;
};

// The first `limit` characters (code points) of UTF-8 text, or all of it (limit < 0: no limit).
inline std::string_view cut_chars(std::string_view text, int64_t limit) {
    if (limit < 0 || text.size() <= static_cast<uint64_t>(limit)) return text;
    int64_t chars = 0;
    for (size_t k = 0; k < text.size(); ++k)
        if ((static_cast<unsigned char>(text[k]) & 0xC0) != 0x80 && chars++ == limit) return text.substr(0, k);
    return text;
}

// Frees a vector's memory (clear() keeps it).
template <typename V>
void release(V& v) {
    V().swap(v);
}

// Characters of a span name a trace UI's tree can show (reference: SPAN_NAME_CHARS).
constexpr int64_t kSpanNameChars = 128;

// An event's span name: a kernel's folded, any name cut to `limit` characters ("…"; reference: _shown).
inline std::string shown_name(Kind kind, std::string_view name, int64_t limit) {
    std::string out = kind == Kind::Kernel ? fold_kernel_name(name) : std::string(name);
    const std::string_view kept = cut_chars(out, limit - 1);
    if (kept.size() == out.size() || cut_chars(out, limit).size() == out.size()) return out;
    return std::string(kept) + "\xe2\x80\xa6";
}

// Appends an attribute to `sp`, whose range must be the last one in the pool.
inline void add_attr(Attrs& pool, Span& sp, AttrKey key, AttrValue value) {
    if (sp.attrs.count == 0) sp.attrs.begin = static_cast<uint32_t>(pool.size());
    value.key = key;
    pool.push_back(value);
    ++sp.attrs.count;
}

// What the stages of build_spans share (reference: _state.py's _BuildState), filled in stage by
// stage; the small questions every stage asks (whose trace, which parent) are its methods.
struct BuildState {
    BuildState(Trace& t, const Options& o)
        : trace(t), opts(o), ev(t.events), n(static_cast<int>(t.events.size())), full(o.full),
          span_budget(o.full ? 0 : o.span_budget), two_threads(o.parallel(t.events.size())) {
        out.strings = std::move(t.strings);  // what the trace's strings and arg attributes point at
    }

    Trace& trace;  // its memory events and flows are freed once read (fwdbwd_links)
    const Options& opts;
    const std::vector<Event>& ev;
    const int n;
    const bool full;
    // spans per trace, none at full detail (reference: trace_span_budget): the budget's stages
    // read what volume_keep computes at default detail only
    const int64_t span_budget;
    const bool two_threads;  // stages that split their work run it on two threads
    Built out;
    int64_t stats[kStatCount] = {};
    // trace_identity
    std::optional<int64_t> rank, world;
    std::string rank_s, run_id;
    bool split = false;
    uint64_t base = 0;
    // event_tree
    EventTree tree;
    // volume_keep
    std::vector<char> keep;
    std::vector<uint8_t> reason;  // why hidden, beyond kind or length (kHidden*)
    std::vector<int64_t> launched;  // device time launched from each CPU-side subtree
    std::vector<int> nearest;       // nearest_kept's memo
    std::vector<int> chain;         // scratch: a walk up the tree
    // window_iterations: iteration k's owner is its root's slot, it_base + k
    int it_base = 0;
    Iterations iterations;
    int n_iter = 0;
    // trace_ids_and_roots
    uint32_t n_total = 0;
    std::vector<TraceId> step_trace, detail_trace;  // by step index
    std::vector<const LiveStep*> live_of;           // live train.step spans, by step index
    bool any_live = false;
    TraceId window_trace{};
    std::vector<TraceId> iteration_trace;
    int window_root_ev = -1, window_root = -1, window_slot = 0;
    size_t n_slots = 0;
    std::vector<Span> synthetic;
    int64_t min_start = 0;  // the earliest event's start (window parts' names)
    // gpu_lanes: device work whose launch is not in the trace, by (owner, device, stream)
    struct Lane {
        int owner, first;  // the first event: its device and stream
        int64_t start = 0, end = 0;  // of what went under it (assemble_synthetic_roots)
        bool used = false;
    };
    std::vector<Lane> lanes;
    std::vector<int> lane_of;  // by event: its lane, or -1 (empty: no lanes)
    int lane_base = 0;         // lane j's slot
    // aggregate_sibling_runs, apply_budget
    std::vector<char> aggregated;
    std::vector<std::vector<int>> aggs;  // members of each aggregate, the first leads; empty: dropped
    // aggregate_spans
    size_t n_aggregates = 0;
    // hidden_counts
    struct Hidden {
        int64_t count;
        std::string_view text;
        int64_t folded[kFoldClasses][2];  // per class: events, summed duration
    };
    std::vector<std::pair<int64_t, int64_t>> root_folded;  // by slot: the owner's hidden, aggregated events
    std::vector<uint32_t> hidden_at;  // by slot: index in hidden + 1, or 0 (few slots hide any)
    std::vector<Hidden> hidden;
    // op_self_times
    SelfTimes self;
    // memory_span_events
    SparseLists<SpanEvent> span_events;
    std::vector<int64_t> cpu_peak, acc_peak;
    // each device's largest "Total Allocated" over the trace: the slot of the span holding that
    // memory event, the bytes, the device's name (a slot holds one: the first device's)
    struct MemoryPeak {
        int slot;
        int64_t bytes;
        std::string_view device;
    };
    std::vector<MemoryPeak> memory_peaks;
    // op_attributes: by event, Options::op_attributes' list for its record function id (empty:
    // none), and the AttrKey of each of their keys (extra keys from key_count() on)
    std::vector<const std::vector<std::pair<std::string, ResourceAttrValue>>*> op_attrs;
    std::unordered_map<std::string_view, AttrKey> extra_key_of;
    // fwdbwd_links
    SparseLists<SpanLink> links;
    std::vector<SpanLink> span_links;  // the links of the span being assembled (finish_span)
    // assemble_synthetic_roots, assemble_event_spans
    int64_t fwdbwd_links = 0;  // fwdbwd links sent
    std::vector<uint32_t> by_order_idx;  // out.spans by ordinal: aggregates merged into kept events

    std::string_view keep_str(std::string_view s) { return keep_string(out.strings, s); }
    std::string_view name_of(const Event& e) const { return trace.name(e); }
    void add(Span& sp, AttrKey key, AttrValue value) { add_attr(out.attrs, sp, key, value); }
    SpanId sid(uint64_t ordinal) const { return make_span_id(base, ordinal); }
    bool is_step(int i) const { return tree.is_step(i); }
    int step_at(int64_t t) const { return tree.step_at(t); }

    int nearest_kept(int i) {
        chain.clear();
        int j = i;
        while (j >= 0 && nearest[j] == kUnset && !keep[j]) {
            chain.push_back(j);
            j = tree.parent[j];
        }
        int result = j < 0 ? -1 : (keep[j] ? j : nearest[j]);
        if (j >= 0) nearest[j] = result;
        for (int c : chain) nearest[c] = result;
        return result;
    }
    void forget() { std::fill(nearest.begin(), nearest.end(), kUnset); }

    const LiveStep* live_step(int s) const { return any_live && is_step(s) ? live_of[tree.step_index[s]] : nullptr; }
    const TraceId& trace_of(int i) const {
        int o = tree.owner[i];
        if (o < 0) return window_trace;
        if (o >= it_base) return iteration_trace[static_cast<size_t>(o - it_base)];
        return (i == o || !split) ? step_trace[tree.step_index[o]] : detail_trace[tree.step_index[o]];
    }
    // Spans that can receive children, drops, memory events or links are "slots": event i is
    // slot i, step k's detail root slot n + k, the synthetic window root slot n + steps.size(),
    // iteration k's root slot it_base + k; slot n + j has span id sid(n_total + j). -1 means "none".
    SpanId slot_id(int slot) const { return slot < n ? sid(ev[slot].ordinal) : sid(n_total + static_cast<uint64_t>(slot - n)); }
    int detail_root(int s) const { return n + tree.step_index[s]; }
    int level_target(int o) const {
        if (o < 0) return window_root;
        if (o >= it_base) return o;
        return split ? detail_root(o) : o;
    }
    int parent_span(int k) const { return k >= 0 && !(split && is_step(k)) ? k : -1; }
    // a CPU span [ev[i].start, end) directly under live step s's ProfilerStep: the phase it
    // overlaps most (the first such); overlapping none (the loss, between the forward and the
    // backward), the phase that began last at or before its start (ties: the first), else the
    // first to begin after it; the ProfilerStep when the step has no phases
    SpanId under_phase(int s, int i, int64_t end) const {
        SpanId best = sid(ev[s].ordinal);
        if (ev[i].device()) return best;
        const int64_t begin = ev[i].start;
        int64_t most = 0;
        const LivePhase* before = nullptr;  // the phase that began last at or before begin
        const LivePhase* after = nullptr;   // the first to begin after it
        for (const LivePhase& phase : live_step(s)->phases) {
            const int64_t hi = std::min(end, phase.end), lo = std::max(begin, phase.start);
            // lo >= phase.start >= 0: hi - lo cannot overflow
            if (hi > lo && hi - lo > most) {
                best = phase.span_id;
                most = hi - lo;
            }
            if (phase.start <= begin) {
                if (!before || phase.start > before->start) before = &phase;
            } else if (!after || phase.start < after->start) {
                after = &phase;
            }
        }
        if (most == 0 && (before || after)) return (before ? before : after)->span_id;
        return best;
    }
    // The [start, end] of step marker s's live step when it overlaps the marker (by more than
    // 0 ns; none given, or on another clock: nullptr).
    const LiveStep* live_interval(int s) const {
        const LiveStep* ls = live_step(s);
        if (!ls || std::min(ev[s].end, ls->end) - std::max(ev[s].start, ls->start) <= 0) return nullptr;
        return ls;
    }
    // Step marker s's span times, cut to its live step's interval: a ProfilerStep never outlives
    // its train.step.
    std::pair<int64_t, int64_t> marker_times(int s) const {
        const LiveStep* ls = live_interval(s);
        if (!ls) return {ev[s].start, ev[s].end};
        return {std::max(ev[s].start, ls->start), std::min(ev[s].end, ls->end)};
    }
    // Slot of the parent of a non-root event i (or of an aggregate that i leads).
    int parent_of(int i) {
        const std::vector<int>& owner = tree.owner;
        int k = tree.parent[i] >= 0 ? nearest_kept(tree.parent[i]) : -1;
        if (k >= 0 && owner[k] != owner[i]) k = -1;  // a parent in the window, i in an iteration
        if (!lane_of.empty() && lane_of[i] >= 0 && (k < 0 || is_step(k) || k == window_root_ev))
            return lane_base + lane_of[i];  // device work with no op above it
        int ps = parent_span(k);
        return ps >= 0 ? ps : level_target(owner[i]);
    }
    // Attaches the memory events of `slot` and the links in span_links (taken) to `sp`, in the
    // pools of the output, and applies the event and link limits.
    void finish_span(Span& sp, int slot) {
        const auto event_limit = static_cast<size_t>(opts.event_limit);
        const auto link_limit = static_cast<size_t>(opts.link_limit);
        if (auto* found = span_events.find(static_cast<size_t>(slot))) {
            auto& evs = *found;
            std::sort(evs.begin(), evs.end(), [](const SpanEvent& a, const SpanEvent& b) {
                return a.ts != b.ts ? a.ts < b.ts : a.ordinal < b.ordinal;
            });
            if (event_limit && evs.size() > event_limit) {
                sp.dropped_events = static_cast<uint32_t>(evs.size() - event_limit);
                stats[MEMORY_EVENTS_DROPPED] += sp.dropped_events;
                evs.resize(event_limit);
            }
            sp.events = PoolRange{static_cast<uint32_t>(out.events.size()), static_cast<uint32_t>(evs.size())};
            out.events.insert(out.events.end(), evs.begin(), evs.end());
            release(evs);
        }
        if (link_limit && span_links.size() > link_limit) {
            sp.dropped_links = static_cast<uint32_t>(span_links.size() - link_limit);
            stats[LINKS_DROPPED] += sp.dropped_links;
            span_links.resize(link_limit);
        }
        for (const SpanLink& l : span_links) fwdbwd_links += std::string_view(l.kind) == "fwdbwd";
        sp.links = PoolRange{static_cast<uint32_t>(out.links.size()), static_cast<uint32_t>(span_links.size())};
        out.links.insert(out.links.end(), span_links.begin(), span_links.end());
        span_links.clear();
    }
    void add_hidden(Span& sp, int slot) {
        if (const uint32_t at = hidden_at[static_cast<size_t>(slot)]) {
            const Hidden& h = hidden[at - 1];
            add(sp, kHiddenSpansKey, AttrValue::integer(h.count));
            add(sp, kHiddenKey, AttrValue::str(h.text));
            for (int c = 0; c < kFoldClasses; ++c) {
                if (!h.folded[c][0]) continue;
                add(sp, static_cast<AttrKey>(kFoldedFirstKey + 2 * c), AttrValue::integer(h.folded[c][0]));
                add(sp, static_cast<AttrKey>(kFoldedFirstKey + 2 * c + 1), AttrValue::integer(h.folded[c][1]));
            }
        }
    }
    // What a trace root adds: what its trace folded (hidden_counts), the source file, the execution trace.
    void add_root_attrs(Span& sp, int slot) {
        const auto [n_hidden, n_aggregated] = root_folded[static_cast<size_t>(slot)];
        if (n_hidden) add(sp, kTraceHiddenKey, AttrValue::integer(n_hidden));
        if (n_aggregated) add(sp, kTraceAggregatedKey, AttrValue::integer(n_aggregated));
        if (opts.source_file) add(sp, kSourceFileKey, AttrValue::str(*opts.source_file));
        if (opts.execution_trace_file) add(sp, kExecutionTraceFileKey, AttrValue::str(*opts.execution_trace_file));
    }
};

// The stages, in build_spans's order (reference/builder.py's build runs the same ones).
// builder.cpp: trace_identity and event_tree (one stage: they run beside each other), volume_keep,
// window_iterations, trace_ids_and_roots.
void identity_and_tree(BuildState& st);
void volume_keep(BuildState& st);
void window_iterations(BuildState& st);
void trace_ids_and_roots(BuildState& st);
// build_budget.cpp: what becomes a span, an aggregate or a count in the span above.
void gpu_lanes(BuildState& st);
void aggregate_sibling_runs(BuildState& st);
void apply_budget(BuildState& st);
void window_root_rule(BuildState& st);
void aggregate_spans(BuildState& st);
void hidden_counts(BuildState& st);
// build_assemble.cpp: span events, links, the spans themselves, their order, the result.
void op_self_times(BuildState& st);
void memory_span_events(BuildState& st);
// build_op_attrs.cpp: Options::op_attributes joined by record function id; the peak marks.
void op_attributes(BuildState& st);
void add_op_attributes(BuildState& st, Span& sp, int i);
void fwdbwd_links(BuildState& st);
void assemble_synthetic_roots(BuildState& st);
void assemble_event_spans(BuildState& st);
void order_spans(BuildState& st);
void cut_values(BuildState& st);
void key_average_rows(BuildState& st);
Built finish_build(BuildState& st);

}  // namespace otelprof::detail
