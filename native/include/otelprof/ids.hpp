// Deterministic trace and span ids: FNV-1a 64 + SplitMix64 finisher (mirrors otelprof/otlp/ids.py).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "otelprof/spans.hpp"

namespace otelprof {

constexpr uint64_t kSeedHi = 0xCBF29CE484222325ULL;
constexpr uint64_t kSeedLo = 0x84222325CBF29CE4ULL;
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

inline uint64_t fnv1a64(std::string_view data, uint64_t seed) {
    uint64_t h = seed;
    for (unsigned char c : data) h = (h ^ c) * 0x100000001B3ULL;
    return h;
}

inline uint64_t mix64(uint64_t z) {
    z += kGolden;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

inline void put_be64(uint64_t v, uint8_t* out) {
    for (int k = 7; k >= 0; --k) {
        out[k] = static_cast<uint8_t>(v & 0xFF);
        v >>= 8;
    }
}

inline TraceId make_trace_id(std::string_view key) {
    uint64_t hi = mix64(fnv1a64(key, kSeedHi)), lo = mix64(fnv1a64(key, kSeedLo));
    if (hi == 0 && lo == 0) lo = 1;
    TraceId id;
    put_be64(hi, id.data());
    put_be64(lo, id.data() + 8);
    return id;
}

// 16 hex digits naming a window by its content: a fold of every complete event's (start, end)
// in file order, and the count of all events (mirrors otelprof/otlp/ids.py window_id).
class WindowFold {
  public:
    void add(int64_t start, int64_t end) {
        step(static_cast<uint64_t>(start));
        step(static_cast<uint64_t>(end));
    }
    std::string finish(uint64_t total) const {
        static const char digits[] = "0123456789abcdef";
        uint64_t v = mix64(h_ ^ total);
        std::string out(16, '0');
        for (int k = 15; k >= 0; --k, v >>= 4) out[static_cast<size_t>(k)] = digits[v & 0xF];
        return out;
    }

  private:
    void step(uint64_t x) {
        h_ = (h_ ^ x) * kGolden;
        h_ ^= h_ >> 32;
    }
    uint64_t h_ = kSeedHi;
};

inline SpanId make_span_id(uint64_t base, uint64_t ordinal) {
    uint64_t v = mix64(base + ordinal * kGolden);
    if (v == 0) v = 1;
    SpanId id;
    put_be64(v, id.data());
    return id;
}

}  // namespace otelprof
