// Gzip inflation with zlib. Mirrors converter/_load.py's gunzip step for step (member loop, cap
// checked after every inflate call with at most cap + 1 bytes of room, same error texts), so
// both paths give the same bytes and the same errors.
#include "otelprof/gzip.hpp"

#include <zlib.h>

#include <algorithm>
#include <cstring>

namespace otelprof {

namespace {

constexpr size_t kMaxCall = size_t{1} << 30;  // zlib's avail_in/avail_out are 32-bit
constexpr size_t kMinCapacity = size_t{64} << 10;
constexpr size_t kMaxRatio = 1032;  // DEFLATE expands at most ~1032:1

struct Inflater {
    z_stream zs{};
    Inflater() {
        if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) throw std::bad_alloc();
    }
    ~Inflater() { inflateEnd(&zs); }
    Inflater(const Inflater&) = delete;
    Inflater& operator=(const Inflater&) = delete;
};

// Python's zlib module words errors as "Error <code> while decompressing data: <zlib msg>".
[[noreturn]] void corrupt(int err, const char* zmsg) {
    if (zmsg == nullptr) {
        switch (err) {
            case Z_BUF_ERROR: zmsg = "incomplete or truncated stream"; break;
            case Z_STREAM_ERROR: zmsg = "inconsistent stream state"; break;
            case Z_DATA_ERROR: zmsg = "invalid input data"; break;
            default: break;
        }
    }
    std::string what = "corrupt gzip data (Error " + std::to_string(err) + " while decompressing data";
    if (zmsg != nullptr) what += std::string(": ") + zmsg;
    throw GzipError(what + ")");
}

// First capacity: the last member's ISIZE trailer (exact for one member under 4 GiB), kept
// within what the input can expand to and the cap.
size_t initial_capacity(std::string_view in, uint64_t cap) {
    size_t hint = kMinCapacity;
    if (in.size() >= 18) {
        const auto* t = reinterpret_cast<const unsigned char*>(in.data() + in.size() - 4);
        hint = std::max<size_t>(hint, size_t{t[0]} | size_t{t[1]} << 8 | size_t{t[2]} << 16 | size_t{t[3]} << 24);
    }
    hint = std::min<uint64_t>(hint, uint64_t{in.size()} * kMaxRatio + kMinCapacity);
    return static_cast<size_t>(std::min<uint64_t>(hint, cap + 1));
}

}  // namespace

size_t gunzip(std::string_view in, uint64_t cap, GzipSink& sink) {
    cap = std::min<uint64_t>(cap, uint64_t{1} << 62);  // cap + 1 and doubling stay in range
    const auto* data = reinterpret_cast<const unsigned char*>(in.data());
    const size_t n = in.size();
    size_t capacity = initial_capacity(in, cap);
    char* out = sink.resize(capacity);
    size_t total = 0;
    size_t at = 0;  // start of the current member
    Inflater inf;
    for (;;) {
        if (at != 0 && inflateReset(&inf.zs) != Z_OK) corrupt(Z_STREAM_ERROR, inf.zs.msg);
        size_t fed = at;
        inf.zs.avail_in = 0;
        for (;;) {
            if (inf.zs.avail_in == 0) {
                if (fed >= n) throw GzipError("truncated gzip data");
                const size_t piece = std::min(n - fed, kMaxCall);
                inf.zs.next_in = const_cast<unsigned char*>(data + fed);
                inf.zs.avail_in = static_cast<uInt>(piece);
                fed += piece;
            }
            if (total == capacity) {  // grow geometrically, never past cap + 1
                capacity = static_cast<size_t>(std::min<uint64_t>(uint64_t{capacity} * 2, cap + 1));
                out = sink.resize(capacity);
            }
            const size_t room = std::min(capacity - total, kMaxCall);
            inf.zs.next_out = reinterpret_cast<unsigned char*>(out + total);
            inf.zs.avail_out = static_cast<uInt>(room);
            const int err = inflate(&inf.zs, Z_NO_FLUSH);
            total += room - inf.zs.avail_out;
            if (err != Z_OK && err != Z_BUF_ERROR && err != Z_STREAM_END) corrupt(err, inf.zs.msg);
            if (total > cap) throw GzipError("decompressed trace exceeds " + std::to_string(cap) + " bytes");
            if (err == Z_STREAM_END) break;
        }
        at = fed - inf.zs.avail_in;
        if (n - at < 2 || data[at] != 0x1f || data[at + 1] != 0x8b) break;  // trailing bytes are ignored
    }
    sink.resize(total);
    return total;
}

std::string gunzip(std::string_view in, uint64_t cap) {
    struct StringSink final : GzipSink {
        std::string s;
        char* resize(size_t size) override {
            s.resize(size);
            return s.data();
        }
    } sink;
    gunzip(in, cap, sink);
    return std::move(sink.s);
}

}  // namespace otelprof
