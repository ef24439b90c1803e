#include <string>
#include <unordered_map>

#include "otelprof/trace.hpp"

namespace otelprof {

namespace {

constexpr std::string_view kMemoryEventName = "[memory]";

// The event members the reader looks at.
enum EventField { PH, NAME, CAT, PID, TID, TS, DUR, ARGS, ID, kFieldCount };
constexpr std::string_view kFieldKeys[kFieldCount] = {"ph", "name", "cat", "pid", "tid", "ts", "dur", "args", "id"};

class Reader {
  public:
    Reader(const Document& doc, Trace& trace) : doc_(doc), trace_(trace) {}

    // pid/tid/flow id (mirrors `norm_ident`).
    template <typename Where>
    Ident ident(const JNode* n, Where&& where) {
        if (!n || n->type == JType::Null) return intern("");
        if (n->type == JType::Str) {
            int64_t v;
            if (canonical_int(n->str(), v)) return Ident{false, v};
            return intern(n->str());
        }
        if (n->type == JType::Int) return Ident{false, n->i};
        throw TraceError(where() + ": expected an integer or string, got " + type_name(n));
    }

    template <typename Where>
    std::string_view opt_str(const JNode* n, Where&& where) {
        if (!n || n->type == JType::Null) return {};
        if (n->type == JType::Str) return n->str();
        throw TraceError(where() + ": expected a string, got " + type_name(n));
    }

  private:
    const Document& doc_;
    Trace& trace_;
    std::unordered_map<std::string_view, int64_t> strings_;

    Ident intern(std::string_view s) {
        auto it = strings_.emplace(s, static_cast<int64_t>(strings_.size())).first;
        return Ident{true, it->second};
    }

    static bool canonical_int(std::string_view s, int64_t& out) {
        size_t i = 0;
        bool neg = false;
        if (i < s.size() && s[i] == '-') {
            neg = true;
            ++i;
        }
        if (i >= s.size()) return false;
        if (s[i] == '0' && i + 1 != s.size()) return false;
        unsigned __int128 acc = 0;
        for (; i < s.size(); ++i) {
            if (s[i] < '0' || s[i] > '9') return false;
            acc = acc * 10 + static_cast<unsigned>(s[i] - '0');
            if (acc > (static_cast<unsigned __int128>(1) << 64)) return false;
        }
        if (neg ? acc > (static_cast<unsigned __int128>(1) << 63) : acc > static_cast<unsigned __int128>(INT64_MAX)) return false;
        out = neg ? static_cast<int64_t>(0 - static_cast<uint64_t>(acc)) : static_cast<int64_t>(acc);
        return true;
    }
};

void read_metadata(const Document& doc, const JNode& root, Trace& trace, std::optional<int64_t> base_override) {
    const JNode* base = doc.get(root, "baseTimeNanoseconds");
    if (!base_override && base && base->type != JType::Null) {
        if (base->type != JType::Int || base->i < 0)
            throw TraceError("baseTimeNanoseconds: expected a non-negative integer");
        trace.base_ns = base->i;
    }
    const JNode* dist = doc.get(root, "distributedInfo");
    if (dist && dist->type == JType::Obj) {
        int64_t v;
        if (as_int64(doc.get(*dist, "rank"), v) && v >= 0) trace.rank = v;
        if (as_int64(doc.get(*dist, "world_size"), v) && v > 0) trace.world_size = v;
        const JNode* backend = doc.get(*dist, "backend");
        if (backend && backend->type == JType::Str && backend->len) trace.backend = std::string(backend->str());
    }
    const JNode* props = doc.get(root, "deviceProperties");
    if (props && props->type == JType::Arr) {
        for (const JNode* prop = doc.first(*props); prop; prop = doc.next(prop)) {
            const JNode* name = doc.get(*prop, "name");
            if (name && name->type == JType::Str) trace.gpu_models.push_back(name->str());
        }
    }
    const JNode* v = doc.get(root, "trace_id");
    if (v && v->type == JType::Str && v->len) trace.trace_id = v->str();
    v = doc.get(root, "traceName");
    if (v && v->type == JType::Str && v->len) trace.trace_name = v->str();
    v = doc.get(root, "host_name");
    if (v && v->type == JType::Str && v->len) trace.host_name = v->str();
}

}  // namespace

Trace read_trace(const Document& doc, std::optional<int64_t> base_override) {
    Trace trace;
    const JNode& root = doc.root();
    const JNode* events = nullptr;
    if (root.type == JType::Arr) {
        events = &root;
    } else if (root.type == JType::Obj) {
        events = doc.get(root, "traceEvents");
        if (!events) throw TraceError("not a Kineto trace: no 'traceEvents' array");
        if (events->type != JType::Arr)
            throw TraceError(std::string("traceEvents: expected an array, got ") + type_name(events));
        read_metadata(doc, root, trace, base_override);
    } else {
        throw TraceError(std::string("not a Kineto trace: top level is ") + type_name(&root) + ", not an object");
    }
    if (base_override) trace.base_ns = *base_override;
    trace.total = events->len;
    trace.events.reserve(events->len);
    Reader reader(doc, trace);
    const int64_t base = trace.base_ns;
    const std::vector<int> field_of = key_table(doc, kFieldCount, [](int f) { return kFieldKeys[f]; });
    uint32_t ordinal = 0;
    for (const JNode* raw_ptr = doc.first(*events); raw_ptr; raw_ptr = doc.next(raw_ptr), ++ordinal) {
        const JNode& raw = *raw_ptr;
        auto where = [&]() { return "traceEvents[" + std::to_string(ordinal) + "]"; };
        if (raw.type != JType::Obj) throw TraceError(where() + ": expected an object, got " + type_name(&raw));
        // One pass over the members (last duplicate wins, as in a Python dict).
        const JNode* field[kFieldCount] = {};
        for (const JNode* m = doc.first(raw); m; m = doc.next(m))
            if (int f = field_of[m->key]; f >= 0) field[f] = m;
        const JNode *ph_node = field[PH], *name_node = field[NAME], *cat_node = field[CAT], *pid_node = field[PID],
                    *tid_node = field[TID], *ts = field[TS], *dur_node = field[DUR], *args = field[ARGS], *id_node = field[ID];
        if (!ph_node || ph_node->type != JType::Str)
            throw TraceError(where() + ".ph: expected a string, got " + type_name(ph_node));
        std::string_view ph = ph_node->str();
        if (ph == "M") {
            ++trace.metadata_events;
            continue;
        }
        if (!(ph == "X" || ph == "i" || ph == "I" || ph == "s" || ph == "f" || ph == "t")) {
            ++trace.ignored_events;
            continue;
        }
        std::string_view name = reader.opt_str(name_node, [&] { return where() + ".name"; });
        std::string_view cat = reader.opt_str(cat_node, [&] { return where() + ".cat"; });
        Ident pid = reader.ident(pid_node, [&] { return where() + ".pid"; });
        Ident tid = reader.ident(tid_node, [&] { return where() + ".tid"; });
        if (!ts) throw TraceError(where() + ": missing 'ts'");
        __int128 start = static_cast<__int128>(base) + micros_to_ns(*ts, "ts", ordinal);
        if (start < 0 || start > INT64_MAX)
            throw TraceError(where() + ".ts: timestamp is outside 0..2^63-1");
        if (args && args->type == JType::Null) args = nullptr;
        if (args && args->type != JType::Obj)
            throw TraceError(where() + ".args: expected an object, got " + type_name(args));
        if (ph == "X") {
            if (!dur_node) throw TraceError(where() + ": complete event without 'dur'");
            int64_t dur = micros_to_ns(*dur_node, "dur", ordinal);
            if (dur < 0) throw TraceError(where() + ".dur: negative duration");
            if (start + dur > INT64_MAX) throw TraceError(where() + ".dur: end time is outside 0..2^63-1");
            Event e;
            e.start = static_cast<int64_t>(start);
            e.end = static_cast<int64_t>(start + dur);
            e.ordinal = ordinal;
            e.kind = category_kind(cat);
            e.cat = cat;
            e.name = name;
            e.pid = pid;
            e.tid = tid;
            e.args = args;
            trace.events.push_back(e);
        } else if (ph == "i" || ph == "I") {
            if (name == kMemoryEventName) {
                trace.memory.push_back(Instant{ordinal, pid, tid, static_cast<int64_t>(start), args});
            } else {
                ++trace.ignored_events;
            }
        } else {
            bool fwdbwd = cat == "fwdbwd";
            if (fwdbwd || is_correlation_flow(cat)) {
                Ident id = reader.ident(id_node, [&] { return where() + ".id"; });
                trace.flows.push_back(Flow{ordinal, fwdbwd, ph[0], id, pid, tid, static_cast<int64_t>(start)});
            } else {
                ++trace.ignored_events;
            }
        }
    }
    return trace;
}

}  // namespace otelprof
