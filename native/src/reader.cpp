#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>

#include "otelprof/trace.hpp"

namespace otelprof {

namespace {

constexpr std::string_view kMemoryEventName = "[memory]";
// arg_of_'s mark for "Record function id": no attribute, the key Options::op_attributes joins on
constexpr int8_t kRecordIdArg = 100;
static_assert(kArgAttributeCount < kRecordIdArg, "kRecordIdArg is no kArgAttributes index");

// The event members the reader looks at.
enum EventField { PH, NAME, CAT, PID, TID, TS, DUR, ARGS, ID, kFieldCount };
constexpr std::string_view kFieldKeys[kFieldCount] = {"ph", "name", "cat", "pid", "tid", "ts", "dur", "args", "id"};

bool canonical_int(std::string_view s, int64_t& out) {
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

template <typename Where>
const JNode* opt_str(const JNode* n, Where&& where) {
    if (!n || n->type == JType::Null) return nullptr;
    if (n->type == JType::Str) return n;
    throw TraceError(where() + ": expected a string, got " + type_name(n));
}

// `str`'s text copied into the trace's strings: the trace refers to neither the document nor the
// JSON text, which can go as soon as the trace is read.
std::string_view kept(const JNode& str, Trace& trace) { return keep_string(trace.strings, str.str()); }

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
            if (name && name->type == JType::Str) trace.gpu_models.push_back(kept(*name, trace));
        }
    }
    const JNode* v = doc.get(root, "trace_id");
    if (v && v->type == JType::Str && v->len) trace.trace_id = kept(*v, trace);
    v = doc.get(root, "traceName");
    if (v && v->type == JType::Str && v->len) trace.trace_name = kept(*v, trace);
    v = doc.get(root, "host_name");
    if (v && v->type == JType::Str && v->len) trace.host_name = kept(*v, trace);
}

}  // namespace

int64_t micros_to_ns(const JNode& n, const char* field, uint32_t ordinal) {
    auto where = [&] { return "traceEvents[" + std::to_string(ordinal) + "]." + field; };
    if (!n.is_number()) throw TraceError(where() + ": expected a number, got " + type_name(&n));
    if (n.type == JType::Int) {
        __int128 v = static_cast<__int128>(n.i) * 1000;
        if (v > INT64_MAX || v < INT64_MIN) throw TraceError(where() + ": " + std::to_string(n.i) + " microseconds is out of range");
        return static_cast<int64_t>(v);
    }
    // digits D and exponent E with value = D * 10^E
    const char* p = n.s;
    const char* e = n.s + n.len;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        ++p;
    }
    std::string digits;
    int64_t exp10 = 0;
    for (; p < e && *p >= '0' && *p <= '9'; ++p) digits.push_back(*p);
    if (p < e && *p == '.') {
        for (++p; p < e && *p >= '0' && *p <= '9'; ++p) {
            digits.push_back(*p);
            --exp10;
        }
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        ++p;
        bool eneg = false;
        if (*p == '+' || *p == '-') eneg = (*p++ == '-');
        int64_t x = 0;
        for (; p < e; ++p) x = std::min<int64_t>(x * 10 + (*p - '0'), 1000000000LL);
        exp10 += eneg ? -x : x;
    }
    size_t lead = digits.find_first_not_of('0');
    if (lead == std::string::npos) return 0;
    digits.erase(0, lead);
    int64_t adjusted = static_cast<int64_t>(digits.size()) - 1 + exp10;
    if (adjusted > 15) throw TraceError(where() + ": " + std::string(n.s, n.len) + " microseconds is out of range");
    if (adjusted < -30) return 0;
    int64_t shift = exp10 + 3;  // value * 1000 = D * 10^shift
    __int128 v = 0;
    if (shift >= 0) {
        for (char c : digits) v = v * 10 + (c - '0');
        for (int64_t k = 0; k < shift; ++k) v *= 10;
    } else {
        int64_t keep = static_cast<int64_t>(digits.size()) + shift;
        for (int64_t k = 0; k < keep; ++k) v = v * 10 + (digits[static_cast<size_t>(k)] - '0');
        char first_dropped = keep >= 0 ? digits[static_cast<size_t>(keep)] : '0';
        if (first_dropped >= '5') v += 1;
    }
    if (neg) v = -v;
    if (v > INT64_MAX || v < INT64_MIN) throw TraceError(where() + ": " + std::string(n.s, n.len) + " microseconds is out of range");
    return static_cast<int64_t>(v);
}

namespace {
// micros_to_ns, with integers that cannot overflow inline (the common case)
inline int64_t micros_ns(const JNode& n, const char* field, uint32_t ordinal) {
    if (n.type == JType::Int && n.i <= INT64_MAX / 1000 && n.i >= INT64_MIN / 1000) return n.i * 1000;
    return micros_to_ns(n, field, ordinal);
}
}  // namespace

TraceReader::TraceReader(std::optional<int64_t> base_override, size_t json_size)
    : base_override_(base_override), json_size_(json_size), base_(base_override.value_or(0)), name_seed_(random_seed()) {}

struct TraceReader::Tail {
    size_t from = 0;  // where it starts: a text offset
    std::atomic<bool> stop{false};
    std::unique_ptr<TraceReader> reader;
    std::unique_ptr<Document> doc;
    size_t end = 0;   // the offset of the events' ']'
    bool ok = false;  // read to there without an error
    int64_t ns = 0;   // how long that took
    std::thread thread;
};

TraceReader::~TraceReader() { stop_tail(); }

size_t TraceReader::handoff(size_t array_at) {
    if (tail_) return tail_->from;  // (a duplicate "traceEvents": it may start in this one)
    const std::string_view json = split_json_;
    split_json_ = {};  // one second parser per conversion
    if (json.empty() || array_at >= json.size()) return SIZE_MAX;
    const size_t from = Document::element_near(json, array_at + (json.size() - array_at) / 2);
    if (from == SIZE_MAX) return SIZE_MAX;
    auto tail = std::make_unique<Tail>();
    tail->from = from;
    tail->reader = std::make_unique<TraceReader>(base_override_, json.size() - from);
    Tail* t = tail.get();
    try {
        t->thread = std::thread([t, json] {
            try {
                const auto start = std::chrono::steady_clock::now();
                t->doc = Document::parse_elements(json, t->from, *t->reader, t->stop, t->end);
                t->ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
                t->ok = true;
            } catch (...) {  // any error: the document's parser reads this part itself
            }
        });
    } catch (const std::system_error&) {
        return SIZE_MAX;  // no thread to be had: one parser reads it all
    }
    tail_ = std::move(tail);
    return from;
}

void TraceReader::stop_tail() {
    if (!tail_) return;
    tail_->stop = true;
    tail_->thread.join();
    tail_.reset();
}

size_t TraceReader::resume(size_t at) {
    if (!tail_ || at != tail_->from) {
        stop_tail();  // the second parser did not start at one of these events: its work goes
        return at;
    }
    tail_->thread.join();
    std::unique_ptr<Tail> tail = std::move(tail_);
    if (!tail->ok) return at;
    take(*tail->reader);
    taken_docs_.push_back(std::move(tail->doc));
    taken_ns_ = tail->ns;
    return tail->end;
}

// Ids are given in the order names and strings are first seen: `tail`'s, looked up or added here
// in the order it gave them, are those a single parser reading on would have given.
void TraceReader::take(TraceReader& tail) {
    Trace& t = tail.trace_;
    std::vector<uint32_t> names(t.names.size());
    for (size_t k = 0; k < t.names.size(); ++k) names[k] = hashed_name_id(t.names[k].text);
    std::vector<std::string_view> texts(tail.strings_.size());
    for (const auto& [text, value] : tail.strings_) texts[static_cast<size_t>(value)] = text;
    std::vector<int64_t> idents(texts.size());
    for (size_t k = 0; k < texts.size(); ++k) idents[k] = intern(texts[k]).value;
    auto ident = [&](Ident i) {
        if (i.is_str) i.value = idents[static_cast<size_t>(i.value)];
        return i;
    };
    const uint32_t ordinal = total_, args = trace_.args.size();
    trace_.args.append(t.args);
    trace_.events.reserve(trace_.events.size() + t.events.size());
    for (Event e : t.events) {
        e.ordinal += ordinal;
        e.name_id = names[e.name_id];
        e.pid = ident(e.pid);
        e.tid = ident(e.tid);
        e.args.begin += args;
        trace_.events.push_back(e);
    }
    for (Instant m : t.memory) {
        m.ordinal += ordinal;
        m.pid = ident(m.pid);
        m.tid = ident(m.tid);
        trace_.memory.push_back(m);
    }
    for (const auto& [o, id] : t.record_ids) trace_.record_ids.emplace_back(o + ordinal, id);
    for (Flow f : t.flows) {
        f.ordinal += ordinal;
        f.id = ident(f.id);
        f.pid = ident(f.pid);
        f.tid = ident(f.tid);
        trace_.flows.push_back(f);
    }
    // the views of its events (categories, args) are into these chunks, which never reallocate
    for (std::string& chunk : t.strings) trace_.strings.push_back(std::move(chunk));
    trace_.metadata_events += t.metadata_events;
    trace_.ignored_events += t.ignored_events;
    total_ += tail.total_;
    failed_ = failed_ || tail.failed_;
    latest_ = std::max(latest_, tail.latest_);
}

uint32_t TraceReader::name_id(std::string_view name) {
    // Traces repeat few names: a direct-mapped cache on the name's length and ends is tried before
    // hashing the whole name. One entry per line, so crafted names cost a hash, never a long probe.
    uint64_t head = 0, tail = 0;
    if (!name.empty()) std::memcpy(&head, name.data(), std::min<size_t>(8, name.size()));
    if (name.size() > 8) std::memcpy(&tail, name.data() + name.size() - 8, 8);
    uint64_t line = (head * 0x9E3779B97F4A7C15ULL) ^ (tail * 0xC2B2AE3D27D4EB4FULL) ^ name.size();
    uint32_t& cached = name_cache_[(line ^ (line >> 29)) % kNameCacheSize];
    if (cached && same(trace_.names[cached - 1].text, name)) return cached - 1;
    const uint32_t id = hashed_name_id(name);
    cached = id + 1;
    return id;
}

uint32_t TraceReader::hashed_name_id(std::string_view name) {
    const uint64_t hash = hash_text(name, name_seed_);
    if (name_slots_.empty()) name_slots_.assign(1024, 0);
    const size_t mask = name_slots_.size() - 1;
    size_t at = hash & mask;
    for (; name_slots_[at]; at = (at + 1) & mask) {
        const uint32_t id = name_slots_[at] - 1;
        if (name_hashes_[id] == hash && same(trace_.names[id].text, name)) return id;
    }
    const uint32_t id = add_name(name, hash);
    name_slots_[at] = id + 1;
    if (trace_.names.size() * 2 > name_slots_.size()) {  // keep the load under a half
        std::vector<uint32_t> grown(name_slots_.size() * 2, 0);
        for (uint32_t k = 0; k < trace_.names.size(); ++k) {
            size_t to = name_hashes_[k] & (grown.size() - 1);
            while (grown[to]) to = (to + 1) & (grown.size() - 1);
            grown[to] = k + 1;
        }
        name_slots_ = std::move(grown);
    }
    if (name.substr(0, 13) == "ProfilerStep#") trace_.names[id].row = hashed_name_id("ProfilerStep*");
    return id;
}

uint32_t TraceReader::add_name(std::string_view name, uint64_t hash) {
    const auto id = static_cast<uint32_t>(trace_.names.size());
    Name n;
    n.text = keep_string(trace_.strings, name);  // the text and the table's keys are views of this copy
    n.filtered = is_filtered_name(name);
    step_number(name, n.step);
    n.row = id;
    trace_.names.push_back(n);
    name_hashes_.push_back(hash);
    return id;
}

// pid/tid/flow id (mirrors `norm_ident`).
template <typename Where>
Ident TraceReader::ident(const JNode* n, Where&& where) {
    if (!n || n->type == JType::Null) return intern("");
    if (n->type == JType::Str) {
        int64_t v;
        if (canonical_int(n->str(), v)) return Ident{false, v};
        return intern(n->str());
    }
    if (n->type == JType::Int) return Ident{false, n->i};
    throw TraceError(where() + ": expected an integer or string, got " + type_name(n));
}

Ident TraceReader::intern(std::string_view s) {
    auto [it, added] = strings_.emplace(s, static_cast<int64_t>(strings_.size()));
    if (added) trace_.ident_texts.push_back(keep_string(trace_.strings, s));
    return Ident{true, it->second};
}

void TraceReader::learn_fields(const Document& doc) {
    const size_t known = field_of_.size();
    field_of_.resize(doc.key_count(), -1);
    arg_of_.resize(doc.key_count(), -1);
    memory_of_.resize(doc.key_count(), -1);
    // the first of equal names in a table wins (kArgAttributes has none)
    auto index_in = [](std::string_view key, int count, auto name_of) {
        for (int k = 0; k < count; ++k)
            if (key == name_of(k)) return static_cast<int8_t>(k);
        return int8_t{-1};
    };
    for (size_t k = known; k < field_of_.size(); ++k) {
        const std::string_view key = doc.key_name(static_cast<KeyId>(k));
        field_of_[k] = index_in(key, kFieldCount, [](int f) { return kFieldKeys[f]; });
        arg_of_[k] = key == "Record function id" ? kRecordIdArg
                                                 : index_in(key, kArgAttributeCount, [](int a) { return kArgAttributes[a].key; });
        memory_of_[k] = index_in(key, kMemoryAttributeCount, [](int a) { return kMemoryAttributes[a][0]; });
    }
}

// Text kept once however often it repeats (a "Call stack" or "Module Hierarchy" recurs with
// every call of its op): the trace holds one copy, where views into the JSON text held none.
std::string_view TraceReader::interned(std::string_view text) {
    auto [it, added] = texts_.try_emplace(text);
    if (added) it->second = keep_string(trace_.strings, text);
    return it->second;
}

std::string_view TraceReader::other_category(std::string_view cat) {
    if (cat.size() == last_category_.first.size() && same(cat, last_category_.first)) return last_category_.second;
    last_category_ = {cat, interned(cat)};
    return last_category_.second;
}

// The attributes a span gets from its event's args, in one pass over them: the table decides
// order and aliases (the first key present wins; build_assemble.cpp copies them; reference:
// _arg_attributes); and the ids the tree and links match on (reference: tree.py's arg lookups).
void TraceReader::event_args(const Document& doc, const JNode& args, Event& e) {
    const JNode* found[kArgAttributeCount];
    uint64_t present = 0;  // bit a: found[a] is set (the last duplicate wins, as in a dict)
    const int8_t* arg_of = arg_of_.data();
    const JNode* m = doc.first(args);
    const JNode* record_id = nullptr;
    for (uint32_t k = 0; k < args.len; ++k, m = doc.after(m))
        if (const int a = arg_of[m->key]; a == kRecordIdArg) {
            record_id = m;
        } else if (a >= 0) {
            found[a] = m;
            present |= uint64_t{1} << a;
        }
    if (int64_t id; record_id && as_int64(record_id, id)) trace_.record_ids.emplace_back(e.ordinal, id);
    if (!present) return;
    static const int external_id = arg_index("External id"), correlation = arg_index("correlation");
    static const int sequence = arg_index("Sequence number"), fwd_thread = arg_index("Fwd thread id");
    const int link = e.kind == Kind::Annotation || e.kind == Kind::GpuAnnotation ? external_id : correlation;
    if (present >> link & 1 && as_int64(found[link], e.link_id)) e.arg_flags |= kHasLinkId;
    if (present >> sequence & 1) {
        e.arg_flags |= kHasSequence;
        if (as_int64(found[sequence], e.seq)) e.arg_flags |= kSequenceInt;
    }
    if (present >> fwd_thread & 1) {
        int64_t tid;
        if (!as_int64(found[fwd_thread], tid)) e.arg_flags |= kFwdThreadOther;
        else if (tid != 0) e.arg_flags |= kFwdThreadSet;
    }
    Attrs& pool = trace_.args;
    e.args.begin = pool.size();
    std::string_view last_attr;
    for (uint64_t rest = present; rest; rest &= rest - 1) {
        const int a = __builtin_ctzll(rest);
        const ArgAttribute& spec = kArgAttributes[a];
        const JNode* v = found[a];
        if (spec.attr == last_attr) continue;
        AttrValue attr;
        switch (spec.type) {
            case ArgType::Int:
                if (!as_int64(v, attr.i)) continue;
                attr.type = AttrValue::Type::Int;
                break;
            case ArgType::Double:
                if (!as_double(v, attr.d)) continue;
                attr.type = AttrValue::Type::Double;
                break;
            case ArgType::String:
                if (v->type != JType::Str || !v->len) continue;
                attr = AttrValue::str(interned(v->str()));
                break;
            case ArgType::Json:
                rendered_.clear();
                render_json(doc, *v, rendered_);
                attr = AttrValue::str(keep_string(trace_.strings, rendered_));
                break;
        }
        attr.key = arg_key(a);
        pool.push_back(attr);
        ++e.args.count;
        last_attr = spec.attr;
    }
}

void TraceReader::memory_args(const Document& doc, const JNode& args, Instant& mem) {
    const int8_t* memory_of = memory_of_.data();
    const JNode* m = doc.first(args);
    for (uint32_t k = 0; k < args.len; ++k, m = doc.after(m))
        if (const int a = memory_of[m->key]; a >= 0) {  // the last duplicate wins
            if (as_int64(m, mem.memory[a])) mem.memory_present |= static_cast<uint8_t>(1u << a);
            else mem.memory_present &= static_cast<uint8_t>(~(1u << a));
        }
}

void TraceReader::event(const Document& doc, const JNode& raw, uint32_t ordinal) {
    auto where = [&]() { return "traceEvents[" + std::to_string(ordinal) + "]"; };
    if (raw.type != JType::Obj) throw TraceError(where() + ": expected an object, got " + type_name(&raw));
    // One pass over the members (last duplicate wins, as in a Python dict).
    if (field_of_.size() < doc.key_count()) learn_fields(doc);  // keys first seen since the last event
    const int8_t* field_of = field_of_.data();
    const JNode* fields[kFieldCount] = {};
    const JNode* m = doc.first(raw);
    for (uint32_t k = 0; k < raw.len; ++k, m = doc.after(m))
        if (const int f = field_of[m->key]; f >= 0) fields[f] = m;
    const JNode *ph_node = fields[PH], *ts = fields[TS], *dur_node = fields[DUR], *args = fields[ARGS];
    if (!ph_node || ph_node->type != JType::Str)
        throw TraceError(where() + ".ph: expected a string, got " + type_name(ph_node));
    std::string_view ph = ph_node->str();
    if (ph == "M") {
        ++trace_.metadata_events;
        return;
    }
    if (!(ph == "X" || ph == "i" || ph == "I" || ph == "s" || ph == "f" || ph == "t")) {
        ++trace_.ignored_events;
        return;
    }
    const JNode* name_node = opt_str(fields[NAME], [&] { return where() + ".name"; });
    const JNode* cat_node = opt_str(fields[CAT], [&] { return where() + ".cat"; });
    const std::string_view name = name_node ? name_node->str() : std::string_view();
    std::string_view cat = cat_node ? cat_node->str() : std::string_view();
    Ident pid = ident(fields[PID], [&] { return where() + ".pid"; });
    Ident tid = ident(fields[TID], [&] { return where() + ".tid"; });
    if (!ts) throw TraceError(where() + ": missing 'ts'");
    __int128 start = static_cast<__int128>(base_) + micros_ns(*ts, "ts", ordinal);
    if (start < 0 || start > INT64_MAX) throw TraceError(where() + ".ts: timestamp is outside 0..2^63-1");
    if (args && args->type == JType::Null) args = nullptr;
    if (args && args->type != JType::Obj) throw TraceError(where() + ".args: expected an object, got " + type_name(args));
    latest_ = std::max(latest_, static_cast<int64_t>(start));
    if (ph == "X") {
        if (!dur_node) throw TraceError(where() + ": complete event without 'dur'");
        int64_t dur = micros_ns(*dur_node, "dur", ordinal);
        if (dur < 0) throw TraceError(where() + ".dur: negative duration");
        if (start + dur > INT64_MAX) throw TraceError(where() + ".dur: end time is outside 0..2^63-1");
        Event e;
        e.start = static_cast<int64_t>(start);
        e.end = static_cast<int64_t>(start + dur);
        e.ordinal = ordinal;
        e.name_id = name_id(name);
        e.kind = classify_category(cat);  // a known category's text becomes the table's
        e.cat = cat_node && cat.data() == cat_node->s ? other_category(cat) : cat;
        e.pid = pid;
        e.tid = tid;
        if (args) event_args(doc, *args, e);
        trace_.events.push_back(e);
        latest_ = std::max(latest_, e.end);
        return;
    }
    if (ph == "i" || ph == "I") {
        if (name == kMemoryEventName) {
            Instant mem{ordinal, 0, pid, tid, static_cast<int64_t>(start), {}};
            if (args) memory_args(doc, *args, mem);
            trace_.memory.push_back(mem);
            return;
        }
        ++trace_.ignored_events;
        return;
    }
    bool fwdbwd = cat == "fwdbwd";
    if (fwdbwd || is_correlation_flow(cat)) {
        Ident id = ident(fields[ID], [&] { return where() + ".id"; });
        trace_.flows.push_back(Flow{ordinal, fwdbwd, ph[0], id, pid, tid, static_cast<int64_t>(start)});
    } else {
        ++trace_.ignored_events;
    }
}

Trace TraceReader::read(const Document& doc) {
    const JNode& root = doc.root();
    const JNode* events = nullptr;
    if (root.type == JType::Arr) {
        events = &root;
    } else if (root.type == JType::Obj) {
        events = doc.get(root, "traceEvents");
        if (!events) throw TraceError("not a Kineto trace: no 'traceEvents' array");
        if (events->type != JType::Arr)
            throw TraceError(std::string("traceEvents: expected an array, got ") + type_name(events));
        read_metadata(doc, root, trace_, base_override_);
    } else {
        throw TraceError(std::string("not a Kineto trace: top level is ") + type_name(&root) + ", not an object");
    }
    if (base_override_) trace_.base_ns = *base_override_;
    base_ = trace_.base_ns;
    trace_.total = events->len;
    trace_.events.reserve(events->len);
    uint32_t ordinal = 0;
    for (const JNode* raw = doc.first(*events); raw; raw = doc.next(raw), ++ordinal) event(doc, *raw, ordinal);
    return std::move(trace_);
}

void TraceReader::begin(uint32_t array) {
    // a duplicate "traceEvents" replaces the earlier one (the last wins, as in a Python dict)
    trace_ = Trace();
    // Kineto spends a few hundred bytes of JSON on a complete event: room for one per 256 bytes
    // grows the array rarely, and the pages past its end are never touched
    trace_.events.reserve(json_size_ / 256);
    advise_huge_pages(trace_.events.data(), trace_.events.capacity() * sizeof(Event));
    // flow and memory events: fewer, and smaller (no growing by copies for most traces)
    trace_.flows.reserve(json_size_ / 512);
    trace_.memory.reserve(json_size_ / 1024);
    strings_.clear();
    texts_.clear();
    last_category_ = {};
    name_slots_.clear();
    name_hashes_.clear();
    name_cache_.fill(0);
    streamed_ = array;
    total_ = 0;
    failed_ = false;
    latest_ = 0;
}

void TraceReader::element(const Document& doc, uint32_t at) {
    const uint32_t ordinal = total_++;
    if (failed_) return;
    try {
        event(doc, doc.node(at), ordinal);  // nothing of it stays in the document: its args are digested
    } catch (const TraceError&) {
        failed_ = true;  // read again from the whole document, for the error the reference gives
    }
}

Trace TraceReader::finish(std::unique_ptr<Document>& doc, std::string_view json) {
    stop_tail();  // (still running only where the events ended before it started)
    const JNode& root = doc->root();
    // Without a streamed array, or when the last "traceEvents" is not it, the document is whole
    // where the reader looks.
    if (streamed_ == kNoNode || doc->get(root, "traceEvents") != &doc->node(streamed_)) return read(*doc);
    read_metadata(*doc, root, trace_, base_override_);
    if (base_override_) trace_.base_ns = *base_override_;
    // Events were read with base_ as the time base: shift them to the trace's.
    const int64_t shift = trace_.base_ns - base_;
    if (!failed_ && static_cast<__int128>(latest_) + shift <= INT64_MAX) {
        trace_.total = total_;
        if (shift) {
            for (Event& e : trace_.events) e.start += shift, e.end += shift;
            for (Instant& m : trace_.memory) m.ts += shift;
            for (Flow& f : trace_.flows) f.ts += shift;
        }
        return std::move(trace_);
    }
    // An event failed (perhaps only for want of the trace's time base): the whole document
    // gives the reference's verdict and message.
    doc.reset();
    doc = std::make_unique<Document>(json);
    TraceReader again(base_override_);
    return again.read(*doc);
}

Trace read_trace(const Document& doc, std::optional<int64_t> base_override) { return TraceReader(base_override).read(doc); }

}  // namespace otelprof
