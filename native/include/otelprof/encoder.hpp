// Spans -> ExportTraceServiceRequest protobuf bytes, split by size (mirrors otelprof/otlp/encoder.py,
// and serializes exactly as the official protobuf runtime does for these messages).
#pragma once

#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "otelprof/spans.hpp"

namespace otelprof {

// Frees what malloc allocated.
struct FreeBytes {
    void operator()(char* p) const { std::free(p); }
};
using Bytes = std::unique_ptr<char, FreeBytes>;

// One serialized request: bytes [begin, begin + size) of `data`. The request is written in
// place, its header in room left before its spans, so that no copy is made to assemble it.
struct Request {
    Bytes data;
    size_t begin = 0, size = 0;
    std::string_view bytes() const { return {data.get() + begin, size}; }
};

std::vector<Request> encode_requests(const Built& built, const std::string& scope_version, size_t max_bytes);

// The same requests, each written into a buffer of `store` and closed there: returns how many.
// With two_threads, a second thread writes the last third or so of them (it measures the spans
// before its own to know how full the request it starts in is).
size_t encode_requests(const Built& built, const std::string& scope_version, size_t max_bytes, RequestStore& store,
                       bool two_threads = false);

}  // namespace otelprof
