// The assembly of a trace's spans (reference/builder.py's build): build_spans runs named stages,
// each a function of a BuildState, in the reference's order and under its names: trace_identity,
// event_tree, volume_keep, window_iterations, trace_ids_and_roots, gpu_lanes, aggregate_sibling_runs,
// apply_budget, window_root_rule, aggregate_spans, hidden_counts, op_self_times,
// memory_span_events, fwdbwd_links, assemble_synthetic_roots, assemble_event_spans, order_spans,
// finish_build. The stages of their own files (tree.cpp, volume.cpp, iterations.cpp, links.cpp,
// aggregates.cpp) run from them.
#include "otelprof/builder.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <variant>

#include "otelprof/aggregates.hpp"
#include "otelprof/beside.hpp"
#include "otelprof/ids.hpp"
#include "otelprof/iterations.hpp"
#include "otelprof/links.hpp"
#include "otelprof/names.hpp"
#include "otelprof/tree.hpp"
#include "otelprof/volume.hpp"

#include "build_common.hpp"

namespace otelprof {

using namespace detail;

namespace {

// Counters returned with every conversion (same names and order as the reference's STAT_KEYS).
enum StatKey { EVENTS_TOTAL, COMPLETE_EVENTS, METADATA_EVENTS, IGNORED_EVENTS, MEMORY_EVENTS, FLOW_EVENTS, STEPS, ITERATIONS, SPANS, SYNTHETIC_SPANS, AGGREGATE_SPANS, AGGREGATED_EVENTS, DROPPED_PYTHON, DROPPED_SHORT, MEMORY_EVENTS_DROPPED, LINKS, LINKS_DROPPED, DEVICE_EVENTS_UNLINKED, REQUESTS, VALUES_TRUNCATED, DROPPED_BUDGET, DROPPED_STEP_COPIES, DROPPED_WINDOW_ROOTS, DROPPED_OUTSIDE_STEP, kStatCount };
const char* const kStatNames[] = {"events_total", "complete_events", "metadata_events", "ignored_events", "memory_events", "flow_events", "steps", "iterations", "spans", "synthetic_spans", "aggregate_spans", "aggregated_events", "dropped_python", "dropped_short", "memory_events_dropped", "links", "links_dropped", "device_events_unlinked", "requests", "values_truncated", "dropped_budget", "dropped_step_copies", "dropped_window_roots", "dropped_outside_step"};

// Characters kept of a span name (reference: SPAN_NAME_LENGTH_LIMIT).
constexpr int64_t kSpanNameLengthLimit = 8192;

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

// The children of every event in the order of `order` (which lists each child once): those of p
// are kids[begin[p]] .. kids[begin[p + 1] - 1]. One array, not a list per event.
struct Children {
    std::vector<size_t> begin;
    std::vector<int> kids;
};

Children children_in_order(const std::vector<int>& parent, const std::vector<int>& order) {
    Children out;
    out.begin.assign(parent.size() + 1, 0);
    for (int c : order)
        if (parent[c] >= 0) ++out.begin[static_cast<size_t>(parent[c]) + 1];
    for (size_t p = 0; p < parent.size(); ++p) out.begin[p + 1] += out.begin[p];
    out.kids.resize(out.begin.back());
    std::vector<size_t> next(out.begin.begin(), out.begin.end() - 1);
    for (int c : order)
        if (parent[c] >= 0) out.kids[next[static_cast<size_t>(parent[c])]++] = c;
    return out;
}

// The first `limit` characters (code points) of UTF-8 text, or all of it (limit < 0: no limit).
std::string_view cut_chars(std::string_view text, int64_t limit) {
    if (limit < 0 || text.size() <= static_cast<uint64_t>(limit)) return text;
    int64_t chars = 0;
    for (size_t k = 0; k < text.size(); ++k)
        if ((static_cast<unsigned char>(text[k]) & 0xC0) != 0x80 && chars++ == limit) return text.substr(0, k);
    return text;
}

// Runs of two or more consecutive hidden siblings (not Python, not outside their live step) with
// one name and category, all in one trace, become one aggregate span each (reference: builder.py,
// the same stage). Returns the runs (the first member leads) and marks their members in `aggregated`.
std::vector<std::vector<int>> find_sibling_runs(const std::vector<Event>& ev, const EventTree& tree,
                                                const std::vector<char>& keep, const std::vector<uint8_t>& reason,
                                                std::vector<char>& aggregated) {
    const int n = static_cast<int>(ev.size());
    std::vector<std::vector<int>> aggs;
    const Children children = children_in_order(tree.parent, tree.sweep_order);
    std::vector<int> run;
    for (int p = 0; p < n; ++p) {
        if (!keep[p] || ev[p].device()) continue;
        run.clear();
        const int* kids = children.kids.data() + children.begin[p];
        const size_t n_kids = children.begin[p + 1] - children.begin[p];
        for (size_t idx = 0; idx <= n_kids; ++idx) {
            int c = idx < n_kids ? kids[idx] : -1;
            bool cand = c >= 0 && !keep[c] && ev[c].kind != Kind::Python && reason[c] != kHiddenOutsideStep;
            const bool same = cand && !run.empty() && tree.owner[c] == tree.owner[run[0]];  // one trace per run
            if (same && ev[c].name_id == ev[run[0]].name_id && ev[c].cat == ev[run[0]].cat) {
                run.push_back(c);
                continue;
            }
            if (run.size() >= 2) {
                for (int r : run) aggregated[r] = 1;
                aggs.push_back(run);
            }
            run.clear();
            if (cand) run.push_back(c);
        }
    }
    return aggs;
}

// Frees a vector's memory (clear() keeps it).
template <typename V>
void release(V& v) {
    V().swap(v);
}

// Span names and string attribute values cut to their limits, as the OpenTelemetry SDK's
// attribute value length limit does (in characters); returns how many were cut.
int64_t cut_strings(Built& out, int64_t attribute_value_length_limit) {
    int64_t cut = 0;
    // a string of no more bytes than the limit has no more characters: when none is longer, the
    // attributes are not read again (a million on a large trace)
    const bool cut_values = attribute_value_length_limit >= 0 &&
                            out.attrs.longest_string() > static_cast<uint64_t>(attribute_value_length_limit);
    for (Span& sp : out.spans) {
        if (const std::string_view name = cut_chars(sp.name, kSpanNameLengthLimit); name.size() != sp.name.size()) {
            sp.name = name;
            ++cut;
        }
        if (!cut_values) continue;
        out.attrs.edit(sp.attrs, [&](AttrValue& v) {
            if (v.type != AttrValue::Type::Str) return;
            const std::string_view s = cut_chars(std::string_view(v.s, v.len), attribute_value_length_limit);
            if (s.size() != v.len) {
                v.len = static_cast<uint32_t>(s.size());
                ++cut;
            }
        });
    }
    return cut;
}

// The resource: the core does not compose it (one composer for every resource otelprof sends,
// otelprof/otlp/resource.py); it hands the caller what the trace says and keeps the answer.
// Returns how many computed values the composer cut.
int64_t add_resource(Built& out, const Trace& trace, const Options& opts, std::optional<int64_t> rank,
                     std::optional<int64_t> world, std::string_view run_id) {
    ResourceFacts facts;
    facts.host_name = trace.host_name;
    facts.rank = rank;
    facts.world_size = world;
    facts.backend = trace.backend;
    facts.gpu_models = &trace.gpu_models;
    facts.run_id = run_id;
    if (!opts.compose_resource) throw std::invalid_argument("Options.compose_resource is required");
    ComposedResource composed = opts.compose_resource(facts);
    for (const auto& [key, value] : composed.attributes) {
        AttrValue v;
        if (const auto* s = std::get_if<std::string>(&value)) v = AttrValue::str(keep_string(out.strings, *s));
        else if (const auto* i = std::get_if<int64_t>(&value)) v = AttrValue::integer(*i);
        else if (const auto* d = std::get_if<double>(&value)) v = AttrValue::dbl(*d);
        else v = AttrValue::boolean(std::get<bool>(value));
        out.resource.emplace_back(keep_string(out.strings, key), v);
    }
    return composed.values_cut;
}

// Characters of a span name a trace UI's tree can show (reference: SPAN_NAME_CHARS).
constexpr int64_t kSpanNameChars = 128;

// An event's span name: a kernel's folded, any name cut to `limit` characters ("…"; reference: _shown).
std::string shown_name(Kind kind, std::string_view name, int64_t limit) {
    std::string out = kind == Kind::Kernel ? fold_kernel_name(name) : std::string(name);
    const std::string_view kept = cut_chars(out, limit - 1);
    if (kept.size() == out.size() || cut_chars(out, limit).size() == out.size()) return out;
    return std::string(kept) + "\xe2\x80\xa6";
}

// Why an event is hidden (reference: volume.HIDDEN_*), and the counter each reason adds to.
const StatKey kHiddenStat[] = {DROPPED_SHORT, DROPPED_SHORT, DROPPED_PYTHON, DROPPED_BUDGET, DROPPED_STEP_COPIES, DROPPED_WINDOW_ROOTS, DROPPED_OUTSIDE_STEP};

// Appends an attribute to `sp`, whose range must be the last one in the pool.
inline void add_attr(Attrs& pool, Span& sp, AttrKey key, AttrValue value) {
    if (sp.attrs.count == 0) sp.attrs.begin = static_cast<uint32_t>(pool.size());
    value.key = key;
    pool.push_back(value);
    ++sp.attrs.count;
}

// What the stages of build_spans share (reference: builder.py's _BuildState), filled in stage by
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
    // What a trace root adds: what its trace folded (hidden_counts), the source file.
    void add_root_attrs(Span& sp, int slot) {
        const auto [n_hidden, n_aggregated] = root_folded[static_cast<size_t>(slot)];
        if (n_hidden) add(sp, kTraceHiddenKey, AttrValue::integer(n_hidden));
        if (n_aggregated) add(sp, kTraceAggregatedKey, AttrValue::integer(n_aggregated));
        if (opts.source_file) add(sp, kSourceFileKey, AttrValue::str(*opts.source_file));
    }
};

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

// Device work whose launch is not a span (not in the trace, or hidden with no op above it) goes
// under one synthetic lane span per trace, device and stream, never straight under a root
// (parent_of). A lane is set aside for every (owner, device, stream) of device work but a step's
// device copy, in order of its first event, lane j in slot lane_base + j; it is sent when
// anything goes under it (reference: gpu_lanes).
void gpu_lanes(BuildState& st) {
    const std::vector<Event>& ev = st.ev;
    const std::vector<int>& owner = st.tree.owner;
    st.lane_base = st.it_base + st.n_iter;
    std::map<std::tuple<int, bool, int64_t, bool, int64_t>, int> index;
    for (int i = 0; i < st.n; ++i) {
        const Event& e = ev[i];
        if (!e.device() || (e.kind == Kind::GpuAnnotation && st.is_step(st.tree.parent[i]))) continue;
        const auto [it, added] = index.try_emplace({owner[i], e.pid.is_str, e.pid.value, e.tid.is_str, e.tid.value},
                                                   static_cast<int>(st.lanes.size()));
        if (added) st.lanes.push_back(BuildState::Lane{owner[i], i});
        if (st.lane_of.empty()) st.lane_of.assign(static_cast<size_t>(st.n), -1);
        st.lane_of[i] = it->second;
    }
    st.n_slots += st.lanes.size();
}

// Runs of identical hidden siblings become one aggregate span each (default detail).
void aggregate_sibling_runs(BuildState& st) {
    st.aggregated.assign(static_cast<size_t>(st.n), 0);
    if (!st.full) st.aggs = find_sibling_runs(st.ev, st.tree, st.keep, st.reason, st.aggregated);
}

// Scratch of the span budget, per event (has_child: per slot), allocated once for all traces.
struct BudgetScratch {
    std::vector<char> has_child, member;
    std::vector<int> parents, depth;
};

// Over budget, first: the leaf siblings of one name and category (two or more, consecutive or
// not) become one aggregate (reference: volume.Budget._aggregate_leaves).
void budget_aggregate_leaves(BuildState& st, const std::vector<int>& events, std::vector<int>& trace_aggs, BudgetScratch& scratch) {
    const std::vector<Event>& ev = st.ev;
    std::vector<std::vector<int>>& aggs = st.aggs;
    std::vector<char>& has_child = scratch.has_child;
    std::vector<int>& parents = scratch.parents;
    for (int i : events) {
        parents[i] = st.parent_of(i);
        if (parents[i] >= 0) has_child[static_cast<size_t>(parents[i])] = 1;
    }
    for (int a : trace_aggs) {
        const int ps = st.parent_of(aggs[static_cast<size_t>(a)][0]);
        if (ps >= 0) has_child[static_cast<size_t>(ps)] = 1;
    }
    std::vector<int> order;  // the leaves, by parent, name, category, then time
    for (int i : events)
        if (!has_child[static_cast<size_t>(i)]) order.push_back(i);
    std::sort(order.begin(), order.end(), [&](int a, int b) {
        if (parents[a] != parents[b]) return parents[a] < parents[b];
        if (ev[a].name_id != ev[b].name_id) return ev[a].name_id < ev[b].name_id;
        if (ev[a].cat != ev[b].cat) return ev[a].cat < ev[b].cat;
        return ev[a].start != ev[b].start ? ev[a].start < ev[b].start : ev[a].ordinal < ev[b].ordinal;
    });
    std::vector<int> run;
    for (size_t idx = 0; idx <= order.size(); ++idx) {
        const int c = idx < order.size() ? order[idx] : -1;
        const bool leaf = c >= 0;
        if (leaf && !run.empty() && parents[c] == parents[run[0]] && ev[c].name_id == ev[run[0]].name_id &&
            ev[c].cat == ev[run[0]].cat) {
            run.push_back(c);
            continue;
        }
        if (run.size() >= 2) {
            for (int r : run) {
                st.keep[r] = 0;
                st.aggregated[r] = 1;
            }
            trace_aggs.push_back(static_cast<int>(aggs.size()));
            aggs.push_back(run);
        }
        run.clear();
        if (leaf) run.push_back(c);
    }
    std::fill(has_child.begin(), has_child.end(), 0);
}

// Then, still over budget: the least significant spans go, by (worth, -depth, -order)
// (reference: volume.Budget._drop).
void budget_drop(BuildState& st, const std::vector<int>& kept, int64_t n_roots, const std::vector<int>& trace_aggs,
                 BudgetScratch& scratch) {
    const std::vector<Event>& ev = st.ev;
    const int n = st.n;
    std::vector<std::vector<int>>& aggs = st.aggs;
    const std::vector<int64_t>& launched = st.launched;
    std::vector<char>& member = scratch.member;
    std::vector<int>& parents = scratch.parents;
    std::vector<int>& depth = scratch.depth;
    int64_t live_aggs = 0;
    for (int a : trace_aggs) live_aggs += !aggs[static_cast<size_t>(a)].empty();
    const int64_t excess = n_roots + static_cast<int64_t>(kept.size()) + live_aggs - st.span_budget;
    if (excess <= 0) return;
    for (int i : kept) {
        member[i] = 1;
        parents[i] = st.parent_of(i);
    }
    auto depth_of = [&](int i) -> int {
        std::vector<int> walk;
        int j = i;
        while (j >= 0 && depth[j] < 0) {
            walk.push_back(j);
            const int ps = parents[j];
            j = ps >= 0 && ps < n && member[ps] ? ps : -1;
        }
        int d = j < 0 ? 0 : depth[j];
        for (auto it = walk.rbegin(); it != walk.rend(); ++it) depth[*it] = ++d;
        return depth[i];
    };
    struct Cand {
        int64_t worth;
        int neg_depth;
        int64_t neg_order;
        int who;  // event, or -1 - aggregate
    };
    std::vector<Cand> cands;
    for (int i : kept) {
        const int64_t worth = ev[i].device() ? ev[i].dur() : std::max(ev[i].dur(), launched[i]);
        cands.push_back(Cand{worth, -depth_of(i), -static_cast<int64_t>(ev[i].ordinal), i});
    }
    for (int a : trace_aggs) {
        const std::vector<int>& run_a = aggs[static_cast<size_t>(a)];
        if (run_a.empty()) continue;
        const int ps = st.parent_of(run_a[0]);
        const int d = 1 + (ps >= 0 && ps < n && member[ps] ? depth_of(ps) : 0);
        int64_t worth = 0;
        for (int r : run_a) worth += ev[r].dur();
        cands.push_back(Cand{worth, -d, -static_cast<int64_t>(ev[run_a[0]].ordinal), -1 - a});
    }
    std::sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
        if (a.worth != b.worth) return a.worth < b.worth;
        if (a.neg_depth != b.neg_depth) return a.neg_depth < b.neg_depth;
        if (a.neg_order != b.neg_order) return a.neg_order < b.neg_order;
        return a.who < b.who;
    });
    for (int64_t k = 0; k < excess; ++k) {
        const int c = cands[static_cast<size_t>(k)].who;
        if (c >= 0) {
            st.keep[c] = 0;
            st.reason[c] = kHiddenBudget;
        } else {
            for (int r : aggs[static_cast<size_t>(-1 - c)]) {
                st.aggregated[r] = 0;
                st.reason[r] = kHiddenBudget;
            }
            aggs[static_cast<size_t>(-1 - c)].clear();
        }
    }
    for (int i : kept) {
        member[i] = 0;
        depth[i] = -1;
    }
}

// The span budget per trace (reference: volume.Budget.apply): a trace over it has its repeated
// leaves aggregated, then loses its least significant spans.
void apply_budget(BuildState& st) {
    const int64_t budget = st.span_budget;
    if (budget <= 0) return;
    const int n = st.n;
    const std::vector<char>& keep = st.keep;
    const std::vector<std::vector<int>>& aggs = st.aggs;
    auto is_root = [&](int i) { return st.is_step(i) || i == st.window_root_ev; };
    std::map<TraceId, int64_t> roots;
    std::map<TraceId, std::vector<int>> members, agg_of;
    for (int i = 0; i < n; ++i) {
        if (!keep[i]) continue;
        if (is_root(i)) ++roots[st.trace_of(i)];
        else members[st.trace_of(i)].push_back(i);
    }
    for (const Span& sp : st.synthetic) ++roots[sp.trace_id];  // the synthetic window root
    for (const TraceId& it : st.iteration_trace) ++roots[it];
    // lanes in use count; a trace that is trimmed keeps room for each of its other lanes too (a
    // launching op the budget drops leaves its device work to a lane)
    std::map<TraceId, int64_t> spare;
    if (!st.lanes.empty()) {
        std::vector<char> used(st.lanes.size(), 0);
        for (int i = 0; i < n; ++i) {
            if (st.lane_of[i] < 0) continue;
            const int j = st.parent_of(i) - st.lane_base;
            if (j >= 0 && j < static_cast<int>(st.lanes.size())) used[static_cast<size_t>(j)] = 1;
        }
        for (size_t j = 0; j < st.lanes.size(); ++j) ++(used[j] ? roots : spare)[st.trace_of(st.lanes[j].first)];
        st.forget();
    }
    if (st.split)
        for (int s : st.tree.steps) ++roots[st.detail_trace[st.tree.step_index[s]]];
    for (size_t a = 0; a < aggs.size(); ++a) agg_of[st.trace_of(aggs[a][0])].push_back(static_cast<int>(a));
    BudgetScratch scratch{std::vector<char>(st.n_slots, 0), std::vector<char>(n, 0), std::vector<int>(n, -1), std::vector<int>(n, -1)};
    for (auto& [tid, events] : members) {
        std::vector<int>& trace_aggs = agg_of[tid];
        const int64_t n_roots = roots[tid];
        if (n_roots + static_cast<int64_t>(events.size() + trace_aggs.size()) <= budget) continue;
        st.forget();
        budget_aggregate_leaves(st, events, trace_aggs, scratch);
        st.forget();
        std::vector<int> kept;
        for (int i : events)
            if (keep[i]) kept.push_back(i);
        budget_drop(st, kept, n_roots + spare[tid], trace_aggs, scratch);
    }
    st.forget();
}

// A window trace that would hold its root alone, nothing folded into it, is not sent (default detail).
void window_root_rule(BuildState& st) {
    const int root = st.window_root_ev;
    if (st.full || st.n_iter != 0 || root < 0 || !st.keep[root]) return;
    const std::vector<int>& owner = st.tree.owner;
    // anything else of the window, hidden or not, keeps it: a hidden event folds into the root
    bool alone = true;
    for (int i = 0; i < st.n && alone; ++i) alone = !(owner[i] == -1 && i != root);
    if (alone) {
        st.keep[root] = 0;
        st.reason[root] = kHiddenWindowRoot;
        st.window_root = -1;
        st.forget();
    }
}

// One span per surviving aggregate, under its leader's parent; built in place in the output.
void aggregate_spans(BuildState& st) {
    const std::vector<Event>& ev = st.ev;
    const std::vector<int>& owner = st.tree.owner;
    BigVector<Span>& by_order = st.out.spans;
    // every span: kept events and aggregates (at most one per event), then the synthetic roots
    // (order_spans): the window's, one per iteration, one per step's detail trace (split)
    by_order.reserve(static_cast<size_t>(st.n) + 1 + static_cast<size_t>(st.n_iter) + 2 * st.tree.steps.size());
    std::vector<int64_t> children_cpu;  // CPU-side time of each event's CPU-side children
    if (!st.aggs.empty()) {
        children_cpu.assign(static_cast<size_t>(st.n), 0);
        for (int i = 0; i < st.n; ++i)
            if (!ev[i].device() && st.tree.parent[i] >= 0) children_cpu[st.tree.parent[i]] += ev[i].dur();
    }
    std::string label;
    for (const std::vector<int>& run : st.aggs) {
        if (run.empty()) continue;
        const Event& first = ev[run[0]];
        int64_t total = 0, self = 0, end = first.end, shortest = first.dur(), longest = first.dur();
        for (int r : run) {
            total += ev[r].dur();
            self += ev[r].dur() - children_cpu[r];
            shortest = std::min(shortest, ev[r].dur());
            longest = std::max(longest, ev[r].dur());
            end = std::max(end, ev[r].end);
        }
        Span sp;
        sp.order = first.ordinal;
        sp.trace_id = st.trace_of(run[0]);
        sp.span_id = st.sid(first.ordinal);
        const int ps = st.parent_of(run[0]);
        sp.parent_id = st.slot_id(ps);
        if (ps == owner[run[0]] && st.live_step(ps)) sp.parent_id = st.under_phase(ps, run[0], end);
        sp.has_parent = true;
        const std::string_view name = st.name_of(first);
        const std::string suffix = " \xc3\x97" + std::to_string(run.size());
        label = shown_name(first.kind, name, kSpanNameChars - static_cast<int64_t>(suffix.size()) + 1);  // "×": one character, two bytes
        const bool renamed = label != name;
        label += suffix;
        sp.name = st.keep_str(label);
        sp.start = first.start;
        sp.end = end;
        st.add(sp, kCategoryKey, AttrValue::str(first.cat));
        if (!first.device() && !first.tid.is_str) st.add(sp, kThreadIdKey, AttrValue::integer(first.tid.value));
        if (renamed) st.add(sp, first.kind == Kind::Kernel ? kKernelNameKey : kEventNameKey, AttrValue::str(name));
        st.add(sp, kAggregatedCountKey, AttrValue::integer(static_cast<int64_t>(run.size())));
        st.add(sp, kAggregatedDurationKey, AttrValue::integer(total));
        st.add(sp, kAggregatedSelfKey, AttrValue::integer(self));
        st.add(sp, kAggregatedMinKey, AttrValue::integer(shortest));
        st.add(sp, kAggregatedMaxKey, AttrValue::integer(longest));
        by_order.push_back(std::move(sp));
        st.stats[AGGREGATED_EVENTS] += static_cast<int64_t>(run.size());
    }
    st.stats[AGGREGATE_SPANS] = static_cast<int64_t>(by_order.size());
    st.n_aggregates = by_order.size();
}

// What each parent says of the spans hidden under it (reference: volume.hidden_attributes).
void hidden_counts(BuildState& st) {
    const int n = st.n;
    const std::vector<Event>& ev = st.ev;
    const std::vector<char>& keep = st.keep;
    const std::vector<char>& aggregated = st.aggregated;
    const std::vector<uint8_t>& reason = st.reason;
    int64_t* stats = st.stats;
    const size_t n_slots = st.n_slots;
    const Options& opts = st.opts;
    std::vector<uint32_t>& hidden_at = st.hidden_at;
    std::vector<std::pair<int, int>> hidden;  // (target slot, event)
    // why event i is hidden: the reason recorded, else what the keep rule saw (python, short)
    auto why_hidden = [&](int i) -> int {
        if (reason[i]) return reason[i];
        return ev[i].kind == Kind::Python ? kHiddenPython : kHiddenShort;
    };
    // what each trace root says its trace folded: hidden and aggregated events, per owner
    st.root_folded.assign(n_slots, {0, 0});
    const std::vector<int>& owner = st.tree.owner;
    for (int i = 0; i < n; ++i) {
        if (keep[i]) continue;
        if (aggregated[i]) {
            if (const int root = st.level_target(owner[i]); root >= 0) ++st.root_folded[static_cast<size_t>(root)].second;
            continue;
        }
        const int why = why_hidden(i);
        ++stats[kHiddenStat[why]];
        if (why == kHiddenWindowRoot) continue;
        const int target = st.parent_of(i);
        if (target >= 0) {
            hidden.emplace_back(target, i);
            if (const int root = st.level_target(owner[i]); root >= 0) ++st.root_folded[static_cast<size_t>(root)].first;
        }
    }
    hidden_at.assign(n_slots, 0);
    {
        auto name_of = [&](int i) { return st.name_of(ev[i]); };
        std::sort(hidden.begin(), hidden.end(), [&](const auto& a, const auto& b) {
            if (a.first != b.first) return a.first < b.first;
            return name_of(a.second) < name_of(b.second);
        });
        std::string text;
        std::vector<std::pair<int64_t, std::string_view>> counts;
        for (size_t lo = 0; lo < hidden.size();) {
            const int slot = hidden[lo].first;
            size_t hi = lo;
            unsigned why = 0;
            counts.clear();
            BuildState::Hidden h{};
            while (hi < hidden.size() && hidden[hi].first == slot) {
                const int i = hidden[hi].second;
                why |= 1u << why_hidden(i);
                int64_t* held = h.folded[fold_class(ev[i].kind)];
                ++held[0];
                held[1] += ev[i].dur();
                if (counts.empty() || counts.back().second != name_of(i)) counts.emplace_back(0, name_of(i));
                ++counts.back().first;
                ++hi;
            }
            const size_t shown = std::min<size_t>(counts.size(), 3);
            std::partial_sort(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(shown), counts.end(),
                              [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
            const int64_t total = static_cast<int64_t>(hi - lo);
            text = std::to_string(total) + " hidden (";
            bool sep = false;
            auto reason_text = [&](const std::string& t) {
                if (sep) text += ", ";
                text += t;
                sep = true;
            };
            if (why >> kHiddenShort & 1) {
                const int64_t m = opts.min_duration_ns;
                reason_text(m % 1000 == 0 ? "shorter than " + std::to_string(m / 1000) + " \xc2\xb5s"
                                          : "shorter than " + std::to_string(m) + " ns");
            }
            if (why >> kHiddenPython & 1) reason_text("python functions");
            if (why >> kHiddenBudget & 1) reason_text("over the " + std::to_string(opts.span_budget) + "-span budget");
            if (why >> kHiddenStepCopy & 1) reason_text("device copy of the step");
            if (why >> kHiddenOutsideStep & 1) reason_text("outside the live step");
            text += "): ";
            int64_t listed = 0;
            for (size_t k = 0; k < shown; ++k) {
                if (k) text += ", ";
                text += cut_chars(counts[k].second, 64);
                text += " \xc3\x97" + std::to_string(counts[k].first);
                listed += counts[k].first;
            }
            if (total > listed) text += " and " + std::to_string(total - listed) + " more";
            h.count = total;
            h.text = st.keep_str(text);
            st.hidden.push_back(h);
            hidden_at[static_cast<size_t>(slot)] = static_cast<uint32_t>(st.hidden.size());
            lo = hi;
        }
    }
}

// key_averages' tree: self CPU and device time (aggregates.cpp; reference: tree.self_times).
void op_self_times(BuildState& st) { st.self = self_times(st.trace, st.tree.parent); }

// Memory events become span events of the span that holds them; step memory peaks.
void memory_span_events(BuildState& st) {
    int64_t* stats = st.stats;
    const size_t n_slots = st.n_slots;
    const Trace& trace = st.trace;
    Attrs& pool = st.out.attrs;
    const std::vector<int>& steps = st.tree.steps;
    const std::vector<int>& step_index = st.tree.step_index;
    const std::vector<int>& owner = st.tree.owner;
    const std::vector<int>& probe_owner = st.tree.probe_owner;
    std::vector<int64_t>& cpu_peak = st.cpu_peak;
    std::vector<int64_t>& acc_peak = st.acc_peak;
    SparseLists<SpanEvent>& span_events = st.span_events;
    const int n_mem = static_cast<int>(st.trace.memory.size());
    span_events = SparseLists<SpanEvent>(n_slots);
    cpu_peak.assign(steps.size(), -1);
    acc_peak.assign(steps.size(), -1);
    static const int total_allocated = memory_index("Total Allocated"), device_type = memory_index("Device Type");
    static const int device_id = memory_index("Device Id"), addr = memory_index("Addr");
    // device names, kept once each (a trace has a few devices and thousands of memory events)
    struct Device {
        int64_t type;
        bool has_id;
        int64_t id;
        std::string_view name;
    };
    std::vector<Device> devices;
    auto device = [&](int64_t type, bool has_id, int64_t id) {
        for (const Device& d : devices)
            if (d.type == type && d.has_id == has_id && d.id == id) return d.name;
        devices.push_back(Device{type, has_id, id, st.keep_str(device_name(type, has_id, id))});
        return devices.back().name;
    };
    for (int k = 0; k < n_mem; ++k) {
        const Instant& m = trace.memory[k];
        int s = st.step_at(m.ts);
        int64_t total;
        if (s >= 0 && m.memory_int(total_allocated, total)) {
            int64_t dtype = 0;
            bool accel = m.memory_int(device_type, dtype) && dtype != 0;
            int64_t& peak = (accel ? acc_peak : cpu_peak)[step_index[s]];
            peak = std::max(peak, total);
        }
        int o = probe_owner[k];
        int target = -1;
        if (o >= 0) {
            int kk = st.nearest_kept(o);
            target = kk >= 0 ? st.parent_span(kk) : st.level_target(owner[o]);
        }
        if (target < 0) target = st.level_target(s);
        if (target < 0) {
            ++stats[MEMORY_EVENTS_DROPPED];
            continue;
        }
        SpanEvent event{m.ts, m.ordinal, AttrRange{static_cast<uint32_t>(pool.size()), 0}};
        auto push = [&](AttrKey key, AttrValue attr) {
            attr.key = key;
            pool.push_back(attr);
            ++event.attrs.count;
        };
        for (int a = 0; a < kMemoryAttributeCount; ++a) {
            int64_t v;
            const bool has = m.memory_int(a, v);
            if (a == addr) {  // the device by name before the address, the address in hex (reference: _memory_attributes)
                int64_t dtype, did;
                if (m.memory_int(device_type, dtype)) {
                    const bool has_id = m.memory_int(device_id, did);
                    if (const std::string_view dev = device(dtype, has_id, has_id ? did : 0); !dev.empty())
                        push(kMemoryDeviceKey, AttrValue::str(dev));
                }
                if (has) push(memory_key(a), AttrValue::str(st.keep_str(hex_address(v))));
                continue;
            }
            if (has) push(memory_key(a), AttrValue::integer(v));
        }
        span_events.at(static_cast<size_t>(target)).push_back(event);
    }
}

// Forward -> backward links (links.cpp; reference: tree.fwdbwd_pairs): an op that is not a span
// is stood for by what holds it (its aggregate, else the op span it folds into; not a step or
// window root); a link that would join a span to itself goes.
void fwdbwd_links(BuildState& st) {
    const int n = st.n;
    const std::vector<char>& keep = st.keep;
    int64_t* stats = st.stats;
    const Trace& trace = st.trace;
    SparseLists<SpanLink>& links = st.links;
    const EventTree& tree = st.tree;
    const std::vector<std::pair<int, int>> pairs = fwdbwd_pairs(trace, tree);
    links = SparseLists<SpanLink>(st.n_slots);
    std::vector<int> leader;  // by event: the aggregate's first member, or -1
    if (!pairs.empty()) {
        leader.assign(static_cast<size_t>(n), -1);
        for (const std::vector<int>& run : st.aggs)
            for (int r : run) leader[r] = run[0];
    }
    auto held_by = [&](int x) {  // the slot of the span that stands for event x, or -1
        if (keep[x]) return x;
        if (leader[x] >= 0) return leader[x];
        if (st.reason[x] == kHiddenWindowRoot) return -1;
        const int t = st.parent_of(x);  // an op span: not a step, the window root or a lane
        return t >= 0 && t < n && !st.is_step(t) && t != st.window_root_ev ? t : -1;
    };
    for (const auto& [fw, bw] : pairs) {
        const int source = held_by(bw), to = held_by(fw);
        if (source < 0 || to < 0 || source == to) {
            ++stats[LINKS_DROPPED];
            continue;
        }
        auto& bucket = links.at(static_cast<size_t>(source));
        SpanLink target{st.trace_of(fw), st.slot_id(to), "fwdbwd"};
        bool dup = std::any_of(bucket.begin(), bucket.end(),
                               [&](const SpanLink& l) { return l.trace_id == target.trace_id && l.span_id == target.span_id; });
        if (dup) {
            ++stats[LINKS_DROPPED];
            continue;
        }
        bucket.push_back(target);
    }
    // no later stage reads memory events or flows: they go before the spans are assembled
    release(st.trace.memory);
    release(st.trace.flows);
    release(st.tree.fwd_flows);
    release(st.tree.probe_owner);
}

// The synthetic roots (the window's, the iterations', the detail roots) with their attributes,
// hidden counts, span events and limits.
void assemble_synthetic_roots(BuildState& st) {
    const std::vector<Event>& ev = st.ev;
    const std::vector<int>& steps = st.tree.steps;
    const std::vector<int>& step_index = st.tree.step_index;
    const std::vector<int64_t>& step_num = st.tree.step_num;
    const bool split = st.split;
    const std::optional<int64_t>& rank = st.rank;
    std::vector<Span>& synthetic = st.synthetic;
    const int n_iter = st.n_iter;
    const int it_base = st.it_base;
    const int window_slot = st.window_slot;
    const int window_root = st.window_root;
    const std::vector<int64_t>& it_lo = st.iterations.lo;
    const std::vector<int64_t>& it_hi = st.iterations.hi;
    const char* it_source = st.iterations.source;
    const std::vector<TraceId>& iteration_trace = st.iteration_trace;
    const TraceId& window_trace = st.window_trace;
    const std::vector<TraceId>& detail_trace = st.detail_trace;
    const std::vector<TraceId>& step_trace = st.step_trace;
    // a synthetic root's fwdbwd links (of the hidden ops folded into it) follow its own
    auto take_links = [&](int slot) {
        if (auto* found = st.links.find(static_cast<size_t>(slot))) {
            st.span_links.insert(st.span_links.end(), found->begin(), found->end());
            release(*found);
        }
    };
    for (Span& sp : synthetic) {  // the window root, when synthetic
        st.add(sp, kCategoryKey, AttrValue::str("otelprof"));
        st.add_hidden(sp, window_slot);
        st.add_root_attrs(sp, window_slot);
        st.add(sp, kSyntheticKey, AttrValue::boolean(true));
        take_links(window_slot);
        st.finish_span(sp, window_slot);
    }
    const bool parts = it_source && std::string_view(it_source) == "span_budget";  // parts of the window, not iterations
    std::string name;
    for (int k = 0; k < n_iter; ++k) {
        Span sp;
        const int64_t lo = it_lo[static_cast<size_t>(k)], hi = it_hi[static_cast<size_t>(k)];
        sp.trace_id = iteration_trace[static_cast<size_t>(k)];
        sp.span_id = st.slot_id(it_base + k);
        if (parts) {
            name = "window part " + std::to_string(k + 1) + "/" + std::to_string(n_iter) + " (";
            append_millis(name, lo - st.min_start);
            name += "\xe2\x80\x93";  // an en dash
            append_millis(name, hi - st.min_start);
            name += " ms)";
        } else {
            name = "Iteration#" + std::to_string(k + 1);
        }
        sp.name = st.keep_str(name);
        sp.start = lo;
        sp.end = hi;
        st.add(sp, kCategoryKey, AttrValue::str("otelprof"));
        if (parts) {
            st.add(sp, kWindowPartKey, AttrValue::integer(k + 1));
            st.add(sp, kWindowPartsKey, AttrValue::integer(n_iter));
        } else {
            st.add(sp, kIterationKey, AttrValue::integer(k + 1));
            st.add(sp, kIterationSourceKey, AttrValue::str(it_source));
        }
        st.add_hidden(sp, it_base + k);
        st.add_root_attrs(sp, it_base + k);
        st.add(sp, kSyntheticKey, AttrValue::boolean(true));
        st.span_links.push_back(SpanLink{window_trace, st.slot_id(window_root), "window"});
        take_links(it_base + k);
        st.finish_span(sp, it_base + k);
        synthetic.push_back(std::move(sp));
    }
    if (split) {
        for (int s : steps) {
            Span sp;
            sp.trace_id = detail_trace[step_index[s]];
            sp.span_id = st.slot_id(st.detail_root(s));
            sp.name = st.name_of(ev[s]);
            sp.start = ev[s].start;
            sp.end = ev[s].end;
            st.add(sp, kCategoryKey, AttrValue::str("otelprof"));
            st.add(sp, kStepKey, AttrValue::integer(step_num[s]));
            if (rank) st.add(sp, kRankKey, AttrValue::integer(*rank));
            st.add_hidden(sp, st.detail_root(s));
            st.add_root_attrs(sp, st.detail_root(s));
            st.add(sp, kSyntheticKey, AttrValue::boolean(true));
            st.span_links.push_back(SpanLink{step_trace[step_index[s]], st.sid(ev[s].ordinal), "step"});
            take_links(st.detail_root(s));
            st.finish_span(sp, st.detail_root(s));
            synthetic.push_back(std::move(sp));
        }
    }
    // the GPU lanes that anything went under, spanning it
    for (int i = 0; i < st.n && !st.lanes.empty(); ++i) {
        if (st.lane_of[i] < 0) continue;  // kept, aggregated or folded: all of it under its parent (lane or op)
        const int j = st.parent_of(i) - st.lane_base;
        if (j < 0 || j >= static_cast<int>(st.lanes.size())) continue;
        BuildState::Lane& lane = st.lanes[static_cast<size_t>(j)];
        lane.start = lane.used ? std::min(lane.start, ev[i].start) : ev[i].start;
        lane.end = lane.used ? std::max(lane.end, ev[i].end) : ev[i].end;
        lane.used = true;
    }
    for (size_t j = 0; j < st.lanes.size(); ++j) {
        const BuildState::Lane& lane = st.lanes[j];
        if (!lane.used) continue;
        const Event& e = ev[lane.first];
        const int slot = st.lane_base + static_cast<int>(j);
        Span sp;
        sp.trace_id = st.trace_of(lane.first);
        sp.span_id = st.slot_id(slot);
        sp.parent_id = st.slot_id(st.level_target(lane.owner));
        sp.has_parent = true;
        auto ident = [&](const Ident& id) {
            return id.is_str ? std::string(st.trace.ident_texts[static_cast<size_t>(id.value)]) : std::to_string(id.value);
        };
        // (old traces' tid says "stream 7" itself)
        const std::string tid = ident(e.tid);
        const bool says_stream = e.tid.is_str && tid.rfind("stream ", 0) == 0;
        sp.name = st.keep_str("gpu " + ident(e.pid) + " \xc2\xb7 " + (says_stream ? tid : "stream " + tid));
        sp.start = lane.start;
        sp.end = lane.end;
        st.add(sp, kCategoryKey, AttrValue::str("otelprof"));
        if (!e.pid.is_str) st.add(sp, arg_key(arg_index("device")), AttrValue::integer(e.pid.value));
        if (!e.tid.is_str) st.add(sp, arg_key(arg_index("stream")), AttrValue::integer(e.tid.value));
        st.add_hidden(sp, slot);
        st.add(sp, kSyntheticKey, AttrValue::boolean(true));
        st.finish_span(sp, slot);
        synthetic.push_back(std::move(sp));
    }
}

// A python_function event's frame, `path(line): function` as Kineto names it, as the code.*
// attributes (reference: _code_attributes): split at the first "): ", the line 1-9 ASCII digits
// after the last "(" before it, path and function non-empty; any other name adds none.
inline void add_code_attributes(BuildState& st, Span& sp, std::string_view name) {
    const size_t sep = name.find("): ");
    if (sep == std::string_view::npos || sep + 3 == name.size()) return;
    const size_t open = name.rfind('(', sep);
    if (open == std::string_view::npos || open == 0) return;
    const std::string_view digits = name.substr(open + 1, sep - open - 1);
    if (digits.empty() || digits.size() > 9) return;
    int64_t line = 0;
    for (const char c : digits) {
        if (c < '0' || c > '9') return;
        line = line * 10 + (c - '0');
    }
    st.add(sp, kCodeFunctionKey, AttrValue::str(name.substr(sep + 3)));
    st.add(sp, kCodeFilePathKey, AttrValue::str(name.substr(0, open)));
    st.add(sp, kCodeLineKey, AttrValue::integer(line));
}

// An event's args as attributes: those the reader digested (reader.cpp event_args).
inline void add_arg_attributes(BuildState& st, Span& sp, const Event& e) {
    st.trace.args.visit(e.args, [&](const AttrValue& v) { st.add(sp, v.key, v); });
}

// A ProfilerStep span's own attributes: step number, memory peak, what a trace list shows, the
// live window's trigger (reference: _step_attributes).
inline void add_step_attributes(BuildState& st, Span& sp, int i, std::string& rendered) {
    const int64_t step = st.tree.step_num[i];
    st.add(sp, kStepKey, AttrValue::integer(step));
    const int k = st.tree.step_index[i];
    int64_t peak = st.acc_peak[k] >= 0 ? st.acc_peak[k] : st.cpu_peak[k];
    if (peak >= 0) st.add(sp, kPeakAllocatedKey, AttrValue::integer(peak));
    // what a trace list shows (reference/builder.py step_list_attrs)
    rendered = "{\"step\": " + std::to_string(step) + '}';
    st.add(sp, kInputValueKey, AttrValue::str(st.keep_str(rendered)));
    st.add(sp, kInputMimeTypeKey, AttrValue::str("application/json"));
    rendered = "{\"step_ms\": ";
    const auto [start, end] = st.marker_times(i);
    append_millis(rendered, end - start);
    rendered += '}';
    st.add(sp, kOutputValueKey, AttrValue::str(st.keep_str(rendered)));
    st.add(sp, kOutputMimeTypeKey, AttrValue::str("application/json"));
    if (const LiveStep* ls = st.live_step(i); ls && !ls->trigger.empty())
        st.add(sp, kWindowTriggerKey, AttrValue::str(st.keep_str(ls->trigger)));
}

// Every kept event's span: attributes, parent, links, span events and limits; then their order
// by ordinal, aggregates merged in.
void assemble_event_spans(BuildState& st) {
    const int n = st.n;
    const std::vector<Event>& ev = st.ev;
    const std::vector<char>& keep = st.keep;
    int64_t* stats = st.stats;
    const std::vector<Name>& names = st.trace.names;
    const std::vector<int>& step_index = st.tree.step_index;
    const std::vector<int>& parent = st.tree.parent;
    const std::vector<int>& owner = st.tree.owner;
    const bool split = st.split;
    const int window_root_ev = st.window_root_ev;
    const std::vector<TraceId>& detail_trace = st.detail_trace;
    const std::vector<char>& in_a = st.self.in_aggregate;
    const std::vector<int64_t>& child_dur = st.self.child_dur;
    const std::vector<int64_t>& self_dev = st.self.self_device;
    SparseLists<SpanLink>& links = st.links;
    BigVector<Span>& by_order = st.out.spans;
    const size_t n_aggregates = st.n_aggregates;
    std::vector<uint32_t>& by_order_idx = st.by_order_idx;
    std::vector<std::string_view> shown_names(names.size());  // folded or cut names, by name id
    std::string rendered;  // scratch
    size_t a = 0;
    for (const std::vector<int>& run : st.aggs) {  // the aggregates' links (their leader's slot)
        if (run.empty()) continue;
        Span& sp = by_order[a++];
        const int leader = run[0];
        if (auto* found = links.find(static_cast<size_t>(leader))) {
            st.span_links.swap(*found);
            release(*found);
        }
        st.finish_span(sp, leader);
    }
    for (int i = 0; i < n; ++i) {
        if (!keep[i]) continue;
        const Event& e = ev[i];
        Span& sp = by_order.emplace_back();  // built in place
        sp.order = e.ordinal;
        st.add(sp, kCategoryKey, AttrValue::str(e.cat));
        if (!e.device() && !e.tid.is_str) st.add(sp, kThreadIdKey, AttrValue::integer(e.tid.value));
        std::string_view name = st.name_of(e);
        if (e.kind == Kind::Kernel || name.size() > static_cast<size_t>(kSpanNameChars)) {  // once per name
            std::string_view& shown = shown_names[e.name_id];
            if (!shown.data()) shown = st.keep_str(shown_name(e.kind, name, kSpanNameChars));
            if (shown != name) {
                st.add(sp, e.kind == Kind::Kernel ? kKernelNameKey : kEventNameKey, AttrValue::str(name));
                name = shown;
            }
        }
        if (e.kind == Kind::Python) add_code_attributes(st, sp, st.name_of(e));
        add_arg_attributes(st, sp, e);
        if (in_a[i]) {
            st.add(sp, kSelfCpuKey, AttrValue::integer(e.dur() - child_dur[i]));
            st.add(sp, kSelfDeviceKey, AttrValue::integer(self_dev[i]));
        }
        if (st.is_step(i)) add_step_attributes(st, sp, i, rendered);
        st.add_hidden(sp, i);
        if (st.is_step(i) || i == window_root_ev) st.add_root_attrs(sp, i);
        int parent_slot = -1;
        if (!st.lane_of.empty() && st.lane_of[i] >= 0) {
            parent_slot = st.parent_of(i);
        } else if (!st.is_step(i) && i != window_root_ev) {
            int k = parent[i] >= 0 ? st.nearest_kept(parent[i]) : -1;
            if (k >= 0 && owner[k] != owner[i]) k = -1;  // a parent in the window, i in an iteration
            parent_slot = st.parent_span(k);
            if (parent_slot < 0) parent_slot = st.level_target(owner[i]);
        }
        sp.trace_id = st.trace_of(i);
        sp.span_id = st.sid(e.ordinal);
        if (parent_slot >= 0) {
            sp.parent_id = st.slot_id(parent_slot);
            sp.has_parent = true;
            if (parent_slot == owner[i] && st.live_step(owner[i])) sp.parent_id = st.under_phase(owner[i], i, e.end);
        } else if (const LiveStep* ls = st.is_step(i) ? st.live_step(i) : nullptr) {
            sp.parent_id = ls->span_id;
            sp.has_parent = true;
        }
        sp.name = name;
        std::tie(sp.start, sp.end) = st.is_step(i) ? st.marker_times(i) : std::make_pair(e.start, e.end);
        if (auto* found = links.find(static_cast<size_t>(i))) {
            st.span_links.swap(*found);
            release(*found);
        }
        if (split && st.is_step(i)) st.span_links.push_back(SpanLink{detail_trace[step_index[i]], st.slot_id(st.detail_root(i)), "rank_detail"});
        st.finish_span(sp, i);
    }
    // by_order holds the aggregates, then kept events (already in ordinal order): sort indices, not spans
    by_order_idx.resize(by_order.size());
    for (uint32_t k = 0; k < by_order_idx.size(); ++k) by_order_idx[k] = k;
    {
        auto by_ordinal = [&](uint32_t a, uint32_t b) { return by_order[a].order < by_order[b].order; };
        auto mid = by_order_idx.begin() + static_cast<std::ptrdiff_t>(n_aggregates);
        std::sort(by_order_idx.begin(), mid, by_ordinal);
        std::inplace_merge(by_order_idx.begin(), mid, by_order_idx.end(), by_ordinal);
    }
    stats[LINKS] = st.fwdbwd_links;
}

// Traces in step order, then iterations, then the window; roots first in each.
void order_spans(BuildState& st) {
    int64_t* stats = st.stats;
    const std::vector<int>& steps = st.tree.steps;
    const std::vector<int>& step_index = st.tree.step_index;
    const bool split = st.split;
    std::vector<Span>& synthetic = st.synthetic;
    const std::vector<TraceId>& iteration_trace = st.iteration_trace;
    const TraceId& window_trace = st.window_trace;
    const std::vector<TraceId>& detail_trace = st.detail_trace;
    const std::vector<TraceId>& step_trace = st.step_trace;
    BigVector<Span>& by_order = st.out.spans;
    std::vector<uint32_t>& by_order_idx = st.by_order_idx;
    Built& out = st.out;
    {
        struct TidHash {
            size_t operator()(const TraceId& t) const {
                uint64_t v;
                std::memcpy(&v, t.data(), 8);
                return static_cast<size_t>(v);
            }
        };
        // out.spans = by_order then synthetic (unsorted); out.order lists them trace by trace
        const uint32_t n_syn = static_cast<uint32_t>(synthetic.size());
        const uint32_t n_events = static_cast<uint32_t>(by_order.size());
        for (Span& sp : synthetic) out.spans.push_back(std::move(sp));
        // trace slots in output order: each step's trace (then its detail trace), then the window
        std::unordered_map<TraceId, size_t, TidHash> slot_of;
        size_t n_slots = 0;
        for (int s : steps) {
            slot_of.emplace(step_trace[step_index[s]], n_slots++);
            if (split) slot_of.emplace(detail_trace[step_index[s]], n_slots++);
        }
        for (const TraceId& t : iteration_trace) slot_of.emplace(t, n_slots++);
        slot_of.emplace(window_trace, n_slots++);
        // each slot's roots, then the rest: sorted as each span is read once (spans are read in
        // ordinal order, not where they lie: reading them again per slot cost ~1 ms on df_index)
        std::vector<std::vector<uint32_t>> roots(n_slots), rest(n_slots);
        const TraceId* last_trace = nullptr;
        size_t last_slot = 0;
        auto add = [&](uint32_t k) {
            const Span& sp = out.spans[k];
            if (!last_trace || *last_trace != sp.trace_id) {  // spans of one trace come in runs
                last_slot = slot_of.at(sp.trace_id);
                last_trace = &sp.trace_id;
            }
            (sp.has_parent ? rest : roots)[last_slot].push_back(k);
        };
        for (uint32_t k = 0; k < n_syn; ++k) add(n_events + k);
        for (uint32_t k : by_order_idx) add(k);
        out.order.reserve(out.spans.size());
        for (size_t slot = 0; slot < n_slots; ++slot) {
            out.order.insert(out.order.end(), roots[slot].begin(), roots[slot].end());
            out.order.insert(out.order.end(), rest[slot].begin(), rest[slot].end());
        }
        stats[SYNTHETIC_SPANS] = n_syn;
    }
    stats[SPANS] = static_cast<int64_t>(out.order.size());
}

// Length limits: span names and string attribute values (reference: _cut_strings).
void cut_values(BuildState& st) { st.stats[VALUES_TRUNCATED] += cut_strings(st.out, st.opts.attribute_value_length_limit); }

// key_averages rows (aggregates.cpp; reference: builder._aggregate_ops): from the trace and the
// self times alone.
void key_average_rows(BuildState& st) {
    st.out.ops = aggregate_ops(st.trace, st.self, st.tree.sweep_order, st.opts.group_by_input_shapes);
}

// The resource and the stats: what is left once spans are in order.
Built finish_build(BuildState& st) {
    int64_t* stats = st.stats;
    // resource: composed by the caller (otelprof/otlp/resource.py), from what the trace says
    stats[VALUES_TRUNCATED] += add_resource(st.out, st.trace, st.opts, st.rank, st.world, st.run_id);
    for (int k = 0; k < kStatCount; ++k) st.out.stats.emplace_back(kStatNames[k], stats[k]);
    return std::move(st.out);
}

}  // namespace

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
