// libFuzzer over the whole conversion of JSON bytes (parser, Kineto reader, span builder,
// encoder), two threads and the split parse on all but the smallest inputs (.ci/fuzz). Input a
// strict parser rejects is fine; what the sanitizers or a std::logic_error see is not.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "otelprof/convert.hpp"
#include "otelprof/json.hpp"

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
    try {
        otelprof::convert_trace(std::string_view(reinterpret_cast<const char*>(data), size), o);
        o.full = true;
        otelprof::convert_trace(std::string_view(reinterpret_cast<const char*>(data), size), o);
    } catch (const otelprof::TraceError&) {
    }
    return 0;
}
