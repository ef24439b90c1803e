// The parser reads what the inflater thread has written so far; a document the streamed parse
// rejects is parsed again, whole, so its verdict and message are convert_trace's. Errors keep
// converter/_load.py's order: the gzip stream's, then an empty trace, then the JSON's.
#include "otelprof/convert_gzip.hpp"

#include <chrono>
#include <memory>
#include <new>
#include <string>

#include "otelprof/gzip.hpp"
#include "otelprof/json.hpp"
#include "otelprof/trace.hpp"

namespace otelprof {

namespace {

class Inflating final : public InputStream {
  public:
    explicit Inflating(StreamingGunzip& gz) : gz_(gz) {}
    const char* data() const override { return gz_.data(); }
    size_t size_hint() const override { return gz_.size_hint(); }
    size_t wait_for(size_t want, bool& complete) override {
        const StreamingGunzip::Progress p = gz_.wait_for(want);
        complete = p.complete;
        return p.available;
    }

  private:
    StreamingGunzip& gz_;
};

// Python's bytes.isspace() of the whole text (and true when it is empty), as load_bytes asks.
bool blank(std::string_view text) {
    for (char c : text)
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\v' && c != '\f') return false;
    return true;
}

ConvertOutput convert_inflated(std::string_view json, const Options& options) {
    if (blank(json)) throw GzipError("empty trace");
    return convert_trace(json, options);
}

}  // namespace

ConvertOutput convert_gzip(std::string_view gz, uint64_t cap, const Options& options) {
    std::unique_ptr<StreamingGunzip> inflater;
    try {
        inflater = std::make_unique<StreamingGunzip>(gz, cap);
    } catch (const std::bad_alloc&) {  // no room to reserve: inflate first, then parse
        const std::string json = gunzip(gz, cap);
        return convert_inflated(json, options);
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<Document> doc;
    auto reader = std::make_unique<TraceReader>(options.base_time_ns, inflater->size_hint());
    try {
        Inflating input(*inflater);
        doc = std::make_unique<Document>(input, reader.get());
    } catch (const TraceError&) {
        const size_t size = inflater->finish();  // a gzip error comes first
        return convert_inflated(std::string_view(inflater->data(), size), options);
    }
    bool rewritten = false;
    const size_t size = inflater->finish(&rewritten);  // the JSON may be whole and the stream still corrupt
    if (rewritten) {  // zlib took what the fast inflater refused: parse what zlib made
        doc.reset();
        return convert_inflated(std::string_view(inflater->data(), size), options);
    }
    const auto parse_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    // the inflated text is freed as soon as the trace is read
    return convert_parsed(std::move(reader), std::move(doc), options, static_cast<int64_t>(parse_ns), [&] { inflater.reset(); });
}

}  // namespace otelprof
