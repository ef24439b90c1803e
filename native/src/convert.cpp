#include "otelprof/convert.hpp"

#include <chrono>

#include "otelprof/builder.hpp"
#include "otelprof/encoder.hpp"
#include "otelprof/trace.hpp"

namespace otelprof {

namespace {
using clock = std::chrono::steady_clock;
int64_t ns(clock::time_point a, clock::time_point b) {
    return static_cast<int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}
}  // namespace

ConvertOutput convert_trace(std::string_view json, const Options& options) {
    auto t0 = clock::now();
    // The reader takes the events as the document is parsed: "parse" includes reading them,
    // "read" is what remains (metadata, time base).
    TraceReader reader(options.base_time_ns, json.size());
    auto doc = std::make_unique<Document>(json, &reader);
    return convert_parsed(reader, doc, options, ns(t0, clock::now()));
}

ConvertOutput convert_parsed(TraceReader& reader, std::unique_ptr<Document>& doc, const Options& options, int64_t parse_ns) {
    const std::string_view json = doc->text();
    auto t1 = clock::now();
    Trace trace = reader.finish(doc, json);
    auto t2 = clock::now();
    Built built = build_spans(*doc, trace, options);
    auto t3 = clock::now();
    ConvertOutput out;
    out.requests = encode_requests(built, options.scope_version, static_cast<size_t>(options.max_request_bytes));
    auto t4 = clock::now();
    out.phase_ns = {{"parse", parse_ns}, {"read", ns(t1, t2)}, {"build", ns(t2, t3)}, {"encode", ns(t3, t4)}};
    out.ops = std::move(built.ops);
    out.stats = std::move(built.stats);
    out.window_id = std::move(built.window_id);
    for (auto& [key, value] : out.stats)
        if (key == "requests") value = static_cast<int64_t>(out.requests.size());
    return out;
}

}  // namespace otelprof
