#include "otelprof/convert.hpp"

#include "otelprof/builder.hpp"
#include "otelprof/encoder.hpp"
#include "otelprof/trace.hpp"

namespace otelprof {

ConvertOutput convert_trace(std::string_view json, const Options& options) {
    Document doc(json);
    Trace trace = read_trace(doc, options.base_time_ns);
    Built built = build_spans(doc, trace, options);
    ConvertOutput out;
    out.requests = encode_requests(built, options.scope_version, static_cast<size_t>(options.max_request_bytes));
    out.ops = std::move(built.ops);
    out.stats = std::move(built.stats);
    for (auto& [key, value] : out.stats)
        if (key == "requests") value = static_cast<int64_t>(out.requests.size());
    return out;
}

}  // namespace otelprof
