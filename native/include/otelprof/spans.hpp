// The span model's output: spans ready to encode, per-op aggregates, counters.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "otelprof/attrs.hpp"
#include "otelprof/hugepages.hpp"
#include "otelprof/resource.hpp"

namespace otelprof {

using TraceId = std::array<uint8_t, 16>;
using SpanId = std::array<uint8_t, 8>;

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
    int64_t start = 0, end = 0;  // the live step's own interval, in the phases' time base (LiveMatch::time)
};
// How live steps find their ProfilerStep#N markers (ConvertOptions.live_match): by number, or by
// time (markers in order of start, each to the unused live step overlapping it most).
enum class LiveMatch : uint8_t { number, time };

// Storage the requests are written into directly (the bindings: Python bytes objects), so that
// none is written into the encoder's own buffer first and then copied. One buffer is open at a
// time, or (two threads encoding) several: each thread opens, readies and grows its own (open
// and grow must be safe to call from either: BytesStore takes the GIL), and the calling thread
// closes them all, in the requests' order.
class RequestStore {
  public:
    virtual ~RequestStore() = default;
    // A buffer of `capacity` bytes for a request.
    virtual char* open(size_t capacity) = 0;
    // Readies [p, p + n) of an open buffer before it is first written (e.g. faults its pages in
    // at once), from the thread that writes it; called in order, a stretch at a time, as a
    // request grows.
    virtual void ready(char* p, size_t n) = 0;
    // The open buffer `buffer` grown to `capacity` bytes, what it holds kept (it may move).
    virtual char* grow(char* buffer, size_t capacity) = 0;
    // The first `size` bytes of the open buffer `buffer` are the next request: it is done.
    virtual void close(char* buffer, size_t size) = 0;
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
    std::optional<std::string> source_file;  // named on every trace root (otelprof.source.file)
    std::optional<std::string> execution_trace_file;  // and this (otelprof.execution_trace.file)
    std::vector<LiveStep> live_steps;
    LiveMatch live_match = LiveMatch::number;
    // extra attributes of the op spans whose "Record function id" is the key (an execution
    // trace's join: ConvertOptions.op_attributes), in order
    std::unordered_map<int64_t, std::vector<std::pair<std::string, ResourceAttrValue>>> op_attributes;
    RequestStore* request_store = nullptr;  // optional: holds the requests instead of ConvertOutput::requests
    // 2: JSON of split_from_bytes or more is parsed by two threads (TraceReader::split), and the
    // build stages and the encoder split their work between two from parallel_from events
    // (build) or spans (encoder): where a thread's start is well paid for
    int64_t threads = 1;
    int64_t split_from_bytes = int64_t{8} << 20;  // where a thread's start and the merge are well paid for
    int64_t parallel_from = 16384;

    // Whether a stage with `items` events or spans splits its work between two threads.
    bool parallel(size_t items) const { return threads > 1 && static_cast<int64_t>(items) >= parallel_from; }
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
    // the names of attribute keys from key_count() on: Options::op_attributes' keys, in the
    // order first placed (the encoder appends them to its fixed key table)
    std::vector<std::string> extra_keys;
};

}  // namespace otelprof
