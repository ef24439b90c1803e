// The span model's output: spans ready to encode, per-op aggregates, counters.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
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
AttrKey arg_key(int arg_attribute);
AttrKey memory_key(int memory_attribute);
std::string_view key_name(AttrKey key);
size_t key_count();

// Strings are views: into the parsed document, static tables, or Built::strings.
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

using Attrs = BigVector<AttrValue>;  // attributes, keyed by AttrValue::key
using ResourceAttr = std::pair<std::string_view, AttrValue>;

// A span's attributes, span events or links: a contiguous range of one of Built's pools
// (Built::attrs, events, links), not a vector per span.
struct AttrRange {
    uint32_t begin = 0, count = 0;
};
using PoolRange = AttrRange;

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
