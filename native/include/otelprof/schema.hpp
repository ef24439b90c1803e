// Kineto categories and argument keys, mapped once (mirrors otelprof/otlp/schema.py).
#pragma once

#include <cstdint>
#include <string_view>

namespace otelprof {

enum class Kind : uint8_t {
    Other, CpuOp, Annotation, Python, Runtime, TraceSpan, Kernel, Memcpy, Memset, Sync, GpuAnnotation
};

enum class ArgType : uint8_t { Int, Double, String, Json };

struct ArgAttribute {
    std::string_view key;
    std::string_view attr;
    ArgType type;
};

Kind category_kind(std::string_view cat);
// As category_kind; a known category's `cat` becomes the table's copy of its text (the same
// bytes, read later from the cache instead of from all over the trace's text).
Kind classify_category(std::string_view& cat);
inline bool is_device(Kind k) { return k >= Kind::Kernel; }
inline bool is_device_time(Kind k) { return k == Kind::Kernel || k == Kind::Memcpy || k == Kind::Memset; }
inline bool in_aggregate_kinds(Kind k) {
    return k == Kind::CpuOp || k == Kind::Annotation || k == Kind::Python || k == Kind::Runtime;
}
bool is_filtered_name(std::string_view name);
// N of a "ProfilerStep#N" (at most 18 digits), else false.
bool step_number(std::string_view name, int64_t& out);
bool is_correlation_flow(std::string_view cat);

// Sizes known to the headers: the reader digests args into fixed arrays of these (schema.cpp
// checks them against the tables).
constexpr int kArgAttributeCount = 35;
constexpr int kMemoryAttributeCount = 6;
extern const ArgAttribute kArgAttributes[kArgAttributeCount];
extern const std::string_view kMemoryAttributes[kMemoryAttributeCount][2];
// The index in kArgAttributes / kMemoryAttributes of the arg `key`, or -1.
int arg_index(std::string_view key);
int memory_index(std::string_view key);

}  // namespace otelprof
