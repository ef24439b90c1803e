// build_spans's assembly (build_state.hpp; reference/_assemble.py's stages of the same names):
// op_self_times, memory_span_events, fwdbwd_links, assemble_synthetic_roots, assemble_event_spans,
// order_spans, finish_build.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <variant>
#include <vector>

#include "otelprof/aggregates.hpp"
#include "otelprof/links.hpp"
#include "otelprof/names.hpp"

#include "build_state.hpp"

namespace otelprof::detail {

namespace {

const char* const kStatNames[] = {"events_total", "complete_events", "metadata_events", "ignored_events", "memory_events", "flow_events", "steps", "iterations", "spans", "synthetic_spans", "aggregate_spans", "aggregated_events", "dropped_python", "dropped_short", "memory_events_dropped", "links", "links_dropped", "device_events_unlinked", "requests", "values_truncated", "dropped_budget", "dropped_step_copies", "dropped_window_roots", "dropped_outside_step", "op_attributes_joined", "op_attributes_unplaced", "op_attributes_unmatched", "op_attributes_missing"};

// Characters kept of a span name (reference: SPAN_NAME_LENGTH_LIMIT).
constexpr int64_t kSpanNameLengthLimit = 8192;

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
    // what a trace list shows (reference/_assemble.py step_list_attrs)
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

}  // namespace

// key_averages' tree: self CPU and device time (aggregates.cpp; reference: tree.self_times).
void op_self_times(BuildState& st) { st.self = self_times(st.trace, st.tree.parent); }

// Memory events become span events of the span that holds them; step memory peaks; each
// device's peak over the trace (the first event of the largest total) and the span holding it.
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
    std::vector<BuildState::MemoryPeak>& peaks = st.memory_peaks;  // the device's, in order first seen
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
        if (int64_t dtype, did, total; m.memory_int(total_allocated, total) && m.memory_int(device_type, dtype)) {
            const bool has_id = m.memory_int(device_id, did);
            if (const std::string_view dev = device(dtype, has_id, has_id ? did : 0); !dev.empty()) {
                auto at = std::find_if(peaks.begin(), peaks.end(), [&](const auto& p) { return p.device == dev; });
                if (at == peaks.end()) peaks.push_back(BuildState::MemoryPeak{target, total, dev});
                else if (total > at->bytes) *at = BuildState::MemoryPeak{target, total, dev};
            }
        }
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
        add_op_attributes(st, sp, i);
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

}  // namespace otelprof::detail
