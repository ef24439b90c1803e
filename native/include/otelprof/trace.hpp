// Kineto Chrome-trace events after validation (mirrors otelprof/converter/reference/reader.py).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "otelprof/json.hpp"
#include "otelprof/schema.hpp"

namespace otelprof {

// pid / tid / flow id: an integer, or an interned string (canonical decimal strings become ints).
struct Ident {
    bool is_str = true;
    int64_t value = 0;
    bool operator==(const Ident& o) const { return is_str == o.is_str && value == o.value; }
};

struct Event {
    int64_t start = 0;
    int64_t end = 0;
    uint32_t ordinal = 0;
    Kind kind = Kind::Other;
    std::string_view cat;
    std::string_view name;
    Ident pid, tid;
    const JNode* args = nullptr;  // object or nullptr
    int64_t dur() const { return end - start; }
    bool device() const { return is_device(kind); }
};

struct Instant {
    uint32_t ordinal;
    Ident pid, tid;
    int64_t ts;
    const JNode* args;
};

struct Flow {
    uint32_t ordinal;
    bool fwdbwd;
    char ph;
    Ident id, pid, tid;
    int64_t ts;
};

struct Trace {
    std::vector<Event> events;
    std::vector<Instant> memory;
    std::vector<Flow> flows;
    uint32_t total = 0;
    int64_t metadata_events = 0;
    int64_t ignored_events = 0;
    int64_t base_ns = 0;
    std::optional<int64_t> rank, world_size;
    std::string backend;
    std::vector<std::string_view> gpu_models;
    std::optional<std::string_view> trace_id;
    std::string_view trace_name;
    std::optional<std::string_view> host_name;
};

// Reads `doc` (which must outlive the result). Throws TraceError.
Trace read_trace(const Document& doc, std::optional<int64_t> base_override);

}  // namespace otelprof
