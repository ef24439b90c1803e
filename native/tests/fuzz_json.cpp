// libFuzzer over the whole conversion of JSON bytes (parser, Kineto reader, span builder,
// encoder), two threads and the split parse on all but the smallest inputs (.ci/fuzz), and over
// the flame graphs' stack samples (stacks.cpp). Input a strict parser rejects is fine; what the
// sanitizers or a std::logic_error see is not.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "otelprof/convert.hpp"
#include "otelprof/json.hpp"
#include "otelprof/stacks.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    otelprof::Options o;
    o.threads = 2;
    o.split_from_bytes = 512;
    o.parallel_from = 16;
    o.span_budget = 64;  // the budget's aggregation and drops on small traces too
    o.max_request_bytes = 4096;
    o.compose_resource = [](const otelprof::ResourceFacts&) {
        return otelprof::ComposedResource{{{"service.name", std::string("fuzz")}}, 0};
    };
    const std::string_view json(reinterpret_cast<const char*>(data), size);
    try {
        otelprof::convert_trace(json, o);
        o.full = true;
        otelprof::convert_trace(json, o);
    } catch (const otelprof::TraceError&) {
    }
    try {
        otelprof::stack_samples(json, std::nullopt);
    } catch (const otelprof::TraceError&) {
    }
    return 0;
}
