// The span model's output: spans ready to encode, per-op aggregates, counters.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

#include "otelprof/hugepages.hpp"
#include "otelprof/resource.hpp"

namespace otelprof {

using TraceId = std::array<uint8_t, 16>;
using SpanId = std::array<uint8_t, 8>;

// Keys of span and span-event attributes, numbered: the fixed keys below, then the attributes of
// kArgAttributes (arg_key), then those of kMemoryAttributes (memory_key). See key_name.
using AttrKey = uint16_t;
enum FixedKey : AttrKey {
    kCategoryKey, kThreadIdKey, kAggregatedCountKey, kAggregatedDurationKey, kHiddenSpansKey, kHiddenKey, kSyntheticKey,
    kStepKey, kRankKey, kSelfCpuKey, kSelfDeviceKey, kPeakAllocatedKey,
    // live step spans (step_spans.hpp)
    kStepSourceKey, kStepSamplesKey, kStepTokensKey, kDroppedPhasesKey, kPhaseKey, kStepMicroBatchesKey,
    kStepWindowKey, kPhaseModuleKey,
    // iteration roots (a window without steps)
    kIterationKey, kIterationSourceKey,
    // readable names (names.hpp)
    kKernelNameKey, kMemoryDeviceKey,
    // what a trace list shows (OpenInference's input/output; MLflow's request/response previews)
    kWindowTriggerKey, kInputValueKey, kInputMimeTypeKey, kOutputValueKey, kOutputMimeTypeKey, kFixedKeyCount
};
constexpr AttrKey arg_key(int arg_attribute) { return static_cast<AttrKey>(kFixedKeyCount + arg_attribute); }
AttrKey memory_key(int memory_attribute);
std::string_view key_name(AttrKey key);
size_t key_count();

// Strings are views: into the JSON text (never the parsed document), static tables, or Built::strings.
// 16 bytes: the string's pointer shares the union (a million of these per large trace); string
// lengths fit in 32 bits, as inputs are under 4 GiB. A span or span-event attribute (in an
// Attrs pool) keeps its key in the padding.
struct AttrValue {
    enum class Type : uint8_t { Str, Int, Double, Bool } type = Type::Str;
    AttrKey key = 0;
    uint32_t len = 0;  // Str only
    union {
        const char* s = "";
        int64_t i;
        double d;
    };
    static AttrValue str(std::string_view v) { AttrValue a; a.type = Type::Str; a.s = v.data(); a.len = static_cast<uint32_t>(v.size()); return a; }
    static AttrValue integer(int64_t v) { AttrValue a; a.type = Type::Int; a.i = v; return a; }
    static AttrValue dbl(double v) { AttrValue a; a.type = Type::Double; a.d = v; return a; }
    static AttrValue boolean(bool v) { AttrValue a; a.type = Type::Bool; a.i = v ? 1 : 0; return a; }
};

static_assert(sizeof(AttrValue) == 16, "a large trace has a million attributes");

// Nanoseconds as milliseconds with three decimals, truncated ("97.310"; negative: "0.000"), as
// reference/builder.py millis writes them: the trace-list JSON of step spans.
inline void append_millis(std::string& out, int64_t ns) {
    if (ns < 0) ns = 0;
    out += std::to_string(ns / 1000000);
    out += '.';
    const std::string frac = std::to_string(ns % 1000000 / 1000);
    out.append(3 - frac.size(), '0');
    out += frac;
}

// A span's attributes, span events or links: a contiguous range of one of Built's pools
// (Built::attrs, events, links), not a vector per span.
struct AttrRange {
    uint32_t begin = 0, count = 0;
};
using PoolRange = AttrRange;

// Span and span-event attributes, packed (a million per large trace, mostly small integers and
// string views: 4 to 5 bytes each on average instead of 16). An attribute is a header byte (type in
// the top two bits, then the key, or 63 and the key in the next two bytes), then its value: Int a
// zigzag varint, Double 8 bytes, Bool 1 byte, Str its pointer (8 bytes) and length (4). A range of
// them (AttrRange) starts at a byte offset (size()) and counts attributes.
class Attrs {
  public:
    Attrs() = default;
    Attrs(Attrs&& o) noexcept
        : data_(std::move(o.data_)), len_(std::exchange(o.len_, 0)), cap_(std::exchange(o.cap_, 0)),
          longest_(std::exchange(o.longest_, 0)) {}
    Attrs& operator=(Attrs&& o) noexcept {
        data_ = std::move(o.data_);
        len_ = std::exchange(o.len_, 0);
        cap_ = std::exchange(o.cap_, 0);
        longest_ = std::exchange(o.longest_, 0);
        return *this;
    }
    // Where the next attribute starts.
    uint32_t size() const { return static_cast<uint32_t>(len_); }
    // The length (bytes) of the longest string pushed.
    uint32_t longest_string() const { return longest_; }
    void reserve(size_t bytes) {
        if (bytes > cap_) grow(bytes);
    }
    __attribute__((always_inline)) void push_back(const AttrValue& v) {
        if (len_ + kMaxRecord > cap_) grow(std::max(cap_ * 2, len_ + kMaxRecord + 4096));
        uint8_t* p = data_.get() + len_;
        const uint8_t type = static_cast<uint8_t>(v.type) << 6;
        if (v.key < kKeyEscape) {
            *p++ = static_cast<uint8_t>(type | v.key);
        } else {
            *p++ = static_cast<uint8_t>(type | kKeyEscape);
            std::memcpy(p, &v.key, 2);
            p += 2;
        }
        switch (v.type) {
            case AttrValue::Type::Str:
                std::memcpy(p, &v.s, 8);
                std::memcpy(p + 8, &v.len, 4);
                p += 12;
                longest_ = std::max(longest_, v.len);
                break;
            case AttrValue::Type::Int: {
                uint64_t z = (static_cast<uint64_t>(v.i) << 1) ^ static_cast<uint64_t>(v.i >> 63);
                while (z >= 0x80) {
                    *p++ = static_cast<uint8_t>(z | 0x80);
                    z >>= 7;
                }
                *p++ = static_cast<uint8_t>(z);
                break;
            }
            case AttrValue::Type::Double:
                std::memcpy(p, &v.d, 8);
                p += 8;
                break;
            case AttrValue::Type::Bool: *p++ = v.i ? 1 : 0; break;
        }
        len_ = static_cast<size_t>(p - data_.get());
    }
    // f(const AttrValue&) for each attribute of `r`, in order.
    template <typename F>
    void visit(AttrRange r, F&& f) const {
        const uint8_t* p = data_.get() + r.begin;
        AttrValue v;
        for (uint32_t k = 0; k < r.count; ++k) {
            p = decode(p, v);
            f(static_cast<const AttrValue&>(v));
        }
    }
    // f(AttrValue&) for each attribute of `r`, in order; f may shorten a string (len), nothing else.
    template <typename F>
    void edit(AttrRange r, F&& f) {
        uint8_t* p = data_.get() + r.begin;
        AttrValue v;
        for (uint32_t k = 0; k < r.count; ++k) {
            uint8_t* next = const_cast<uint8_t*>(decode(p, v));
            const uint32_t len = v.len;
            f(v);
            if (v.type == AttrValue::Type::Str && v.len != len) std::memcpy(next - 4, &v.len, 4);
            p = next;
        }
    }

  private:
    static constexpr uint8_t kKeyEscape = 63;
    static constexpr size_t kMaxRecord = 3 + 12;
    struct Free {
        void operator()(uint8_t* p) const { std::free(p); }
    };
    std::unique_ptr<uint8_t, Free> data_;
    size_t len_ = 0, cap_ = 0;
    uint32_t longest_ = 0;

    void grow(size_t cap) {
        // ranges start at 32-bit offsets: more would wrap (a trace far beyond the inputs read)
        if (cap > UINT32_MAX) {
            if (len_ + kMaxRecord > UINT32_MAX) throw std::length_error("span attributes over 4 GiB");
            cap = UINT32_MAX;
        }
        auto* grown = static_cast<uint8_t*>(std::realloc(data_.get(), cap));
        if (!grown) throw std::bad_alloc();
        data_.release();
        data_.reset(grown);
        cap_ = cap;
    }
    static const uint8_t* decode(const uint8_t* p, AttrValue& v) {
        const uint8_t head = *p++;
        v.type = static_cast<AttrValue::Type>(head >> 6);
        v.key = head & kKeyEscape;
        if (v.key == kKeyEscape) {
            std::memcpy(&v.key, p, 2);
            p += 2;
        }
        switch (v.type) {
            case AttrValue::Type::Str:
                std::memcpy(&v.s, p, 8);
                std::memcpy(&v.len, p + 8, 4);
                return p + 12;
            case AttrValue::Type::Int: {
                uint64_t z = 0;
                for (int shift = 0;; shift += 7) {
                    const uint8_t b = *p++;
                    z |= static_cast<uint64_t>(b & 0x7F) << shift;
                    if (b < 0x80) break;
                }
                v.i = static_cast<int64_t>((z >> 1) ^ (~(z & 1) + 1));
                return p;
            }
            case AttrValue::Type::Double: std::memcpy(&v.d, p, 8); return p + 8;
            case AttrValue::Type::Bool: v.i = *p; return p + 1;
        }
        return p;
    }
};
using ResourceAttr = std::pair<std::string_view, AttrValue>;

struct SpanEvent {
    int64_t ts;
    uint32_t ordinal;
    AttrRange attrs;  // in Built::attrs
};

struct SpanLink {
    TraceId trace_id;
    SpanId span_id;
    const char* kind;  // otelprof.link.kind
};

// 104 bytes: a large trace has a hundred thousand spans and more.
struct Span {
    TraceId trace_id{};
    SpanId span_id{};
    SpanId parent_id{};
    int64_t start = 0, end = 0;
    std::string_view name;
    AttrRange attrs;
    PoolRange events;  // in Built::events
    PoolRange links;   // in Built::links
    uint32_t order = UINT32_MAX;  // event ordinal; UINT32_MAX for synthetic roots
    uint32_t dropped_events = 0;
    uint32_t dropped_links = 0;
    bool has_parent = false;
};
static_assert(sizeof(Span) <= 104, "a large trace has a hundred thousand spans and more");

struct OpRow {
    std::string name, kind, input_shapes;
    int64_t calls = 0, cpu_total_ns = 0, self_cpu_ns = 0, device_total_ns = 0, self_device_ns = 0;
};

// A live train.step span a profiled step's operators go under (ConvertOptions.live_steps).
struct LivePhase {
    SpanId span_id{};
    int64_t start = 0, end = 0;
};
struct LiveStep {
    int64_t number = 0;
    TraceId trace_id{};
    SpanId span_id{};
    std::vector<LivePhase> phases;
    std::string trigger;  // what started the window ("": unknown, no attribute)
};

// Takes each request as it is written: its header and its spans, the two parts of one
// ExportTraceServiceRequest, in that order (the views are valid during the call only).
using RequestSink = std::function<void(std::string_view head, std::string_view spans)>;

struct Options {
    std::optional<std::string> run_id;
    std::optional<int64_t> rank, world_size, base_time_ns;
    bool full = false;
    int64_t min_duration_ns = 10000;
    int64_t event_limit = 128;  // 0 = unlimited
    int64_t link_limit = 128;
    int64_t span_budget = 1000;  // spans per trace at default detail; 0 = unlimited
    int64_t split_world_size = 4;
    int64_t max_request_bytes = 3 * 1024 * 1024;
    int64_t attribute_value_length_limit = 8192;  // characters of a string attribute; -1 = none
    ResourceComposer compose_resource;  // required: the trace's resource (resource.hpp)
    bool group_by_input_shapes = false;
    std::string scope_version;
    std::vector<LiveStep> live_steps;
    RequestSink request_sink;  // optional: takes the requests instead of ConvertOutput::requests
};

using Stats = std::vector<std::pair<std::string, int64_t>>;

struct Built {
    std::deque<std::string> strings;  // owns strings that attribute views point at
    Attrs attrs;                      // every span's and span event's attributes, range by range
    std::vector<SpanEvent> events;    // every span's span events, range by range
    std::vector<SpanLink> links;      // every span's links, range by range
    BigVector<Span> spans;
    std::vector<uint32_t> order;  // indices into spans, in output order
    std::vector<OpRow> ops;
    std::vector<ResourceAttr> resource;
    Stats stats;
    std::string window_id;  // 16 hex digits (ids.hpp window_id)
};

}  // namespace otelprof
