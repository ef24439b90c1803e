// Spans -> ExportTraceServiceRequest protobuf bytes, split by size (mirrors reference/encoder.py,
// and serializes exactly as the official protobuf runtime does for these messages).
#pragma once

#include <string>
#include <vector>

#include "otelprof/spans.hpp"

namespace otelprof {

std::vector<std::string> encode_requests(const Built& built, const std::string& scope_version, size_t max_bytes);

}  // namespace otelprof
