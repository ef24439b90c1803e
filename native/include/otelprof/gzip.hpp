// Gzip inflation (every member of a stream, one cap over all of them) into a caller's buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace otelprof {

// The messages match converter/_load.py's gunzip (the caller prefixes the source name).
class GzipError : public std::runtime_error {
   public:
    using std::runtime_error::runtime_error;
};

// Where inflated bytes go: resize(n) makes the buffer n bytes long, keeping the first bytes
// (realloc semantics), and returns its start. The final call sets the exact inflated size.
class GzipSink {
   public:
    virtual ~GzipSink() = default;
    virtual char* resize(size_t n) = 0;
};

// Inflates each gzip member of `in` in turn (as gzip(1) reads concatenated members), stopping
// at the first byte after a member that does not start a new one. Throws GzipError on corrupt
// or truncated data and as soon as more than `cap` bytes come out. Returns the inflated size.
size_t gunzip(std::string_view in, uint64_t cap, GzipSink& sink);

// Convenience for C++ callers: the inflated bytes as a string.
std::string gunzip(std::string_view in, uint64_t cap);

}  // namespace otelprof
