// libFuzzer over gzip input (.ci/fuzz): the streamed conversion (inflating on one thread while
// parsing on another) must give what inflating first and then converting gives, requests or
// error text alike (convert_gzip.hpp); anything else traps.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "otelprof/convert.hpp"
#include "otelprof/convert_gzip.hpp"
#include "otelprof/gzip.hpp"
#include "otelprof/json.hpp"

namespace {

constexpr uint64_t kCap = uint64_t{1} << 24;

// The requests' bytes, or "!" and the error's text.
template <typename Convert>
std::string outcome(Convert&& convert) {
    try {
        const otelprof::ConvertOutput out = convert();
        std::string all;
        for (const auto& r : out.requests) all += std::string(r.bytes()) + '\n';
        return all;
    } catch (const std::runtime_error& e) {  // TraceError, GzipError
        return std::string("!") + e.what();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view gz(reinterpret_cast<const char*>(data), size);
    otelprof::Options o;
    o.compose_resource = [](const otelprof::ResourceFacts&) {
        return otelprof::ComposedResource{{{"service.name", std::string("fuzz")}}, 0};
    };
    std::optional<std::string> text;
    try {
        text = otelprof::gunzip(gz, kCap);
    } catch (const otelprof::GzipError&) {
    }
    const std::string streamed = outcome([&] { return otelprof::convert_gzip(gz, kCap, o); });
    if (!text || text->find_first_not_of(" \t\r\n") == std::string::npos) return 0;  // gzip's or "empty trace" errors
    const std::string whole = outcome([&] { return otelprof::convert_trace(*text, o); });
    if (streamed != whole) __builtin_trap();
    return 0;
}
