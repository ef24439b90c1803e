// Conversion straight from gzip bytes: inflating on one thread while parsing on another.
#pragma once

#include <cstdint>
#include <string_view>

#include "otelprof/convert.hpp"

namespace otelprof {

// Converts the trace `gz` inflates to (every member, at most `cap` bytes). Throws GzipError for
// what gunzip() rejects, and for inflated text that is empty or only whitespace ("empty
// trace"); TraceError for JSON that is not a readable trace, with the message convert_trace
// gives for the inflated text.
ConvertOutput convert_gzip(std::string_view gz, uint64_t cap, const Options& options);

}  // namespace otelprof
