#include "otelprof/convert.hpp"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <chrono>
#include <cstdlib>
#include <memory>

#include "otelprof/builder.hpp"
#include "otelprof/encoder.hpp"
#include "otelprof/trace.hpp"

namespace otelprof {

namespace {
using clock = std::chrono::steady_clock;
constexpr size_t kTrimAfterBytes = size_t{8} << 20;  // JSON size from which the heap is trimmed
int64_t ns(clock::time_point a, clock::time_point b) {
    return static_cast<int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}
}  // namespace

ConvertOutput convert_trace(std::string_view json, const Options& options) {
    auto t0 = clock::now();
    // The reader takes the events as the document is parsed: "parse" includes reading them,
    // "read" is what remains (metadata, time base).
    auto reader = std::make_unique<TraceReader>(options.base_time_ns, json.size());
    if (options.threads > 1 && static_cast<int64_t>(json.size()) >= options.split_from_bytes) reader->split(json);
    auto doc = std::make_unique<Document>(json, reader.get());
    return convert_parsed(std::move(reader), std::move(doc), options, ns(t0, clock::now()));
}

ConvertOutput convert_parsed(std::unique_ptr<TraceReader> reader, std::unique_ptr<Document> doc, const Options& options,
                             int64_t parse_ns, const std::function<void()>& text_read) {
    const size_t json_size = doc->text().size();
    auto t1 = clock::now();
    Trace trace = reader->finish(doc, doc->text());
    const int64_t parse_tail_ns = reader->split_ns();
    // the trace refers to its own strings only (its events' args are digested): the reader, the
    // document and the text go before the build (peak memory)
    reader.reset();
    doc.reset();
    if (text_read) text_read();
    auto t2 = clock::now();
    Built built = build_spans(trace, options);
    auto t3 = clock::now();
    // the spans refer to `built` only: what the encoder does not read goes before the requests
    // are written (peak memory)
    trace = Trace();
#if defined(__GLIBC__)
    // The build's scratch, freed, stays in the heap (glibc raises its mmap threshold as large
    // blocks are freed): ~14 MiB on the largest shared trace, given back in about a millisecond,
    // with what the build's second thread freed in its own arena (parallel_from). Given back
    // after the requests are written instead, the requests reuse part of it and the encode is
    // ~4 ms faster there, but the peak is higher: ns_resolution's 15 MB, 41 -> 44 MiB (3.1x
    // the payload), df_index's 95 -> 103 with two threads. Only from 8 MiB of JSON:
    // malloc_trim locks every arena in turn and returns their pages, and a training loop
    // allocating beside a profiling window's (a few MB) conversion waits on it
    // (benchmarks/overhead.py's window ratio: 1.050-1.055 with it, 1.032-1.035 without).
    if (json_size >= kTrimAfterBytes) malloc_trim(0);
#endif
    ConvertOutput out;
    auto t4 = clock::now();
    const auto max_bytes = static_cast<size_t>(options.max_request_bytes);
    size_t n_requests;
    if (options.request_store) {
        n_requests = encode_requests(built, options.scope_version, max_bytes, *options.request_store,
                                     options.parallel(built.order.size()));
    } else {
        out.requests = encode_requests(built, options.scope_version, max_bytes);
        n_requests = out.requests.size();
    }
    auto t5 = clock::now();
    out.phase_ns = {{"parse", parse_ns}, {"read", ns(t1, t2)}, {"build", ns(t2, t3)}, {"free", ns(t3, t4)}, {"encode", ns(t4, t5)},
                    {"parse_tail", parse_tail_ns}};
    out.ops = std::move(built.ops);
    out.stats = std::move(built.stats);
    out.window_id = std::move(built.window_id);
    for (auto& [key, value] : out.stats)
        if (key == "requests") value = static_cast<int64_t>(n_requests);
    return out;
}

}  // namespace otelprof
