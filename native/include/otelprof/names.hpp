// Readable span names (mirrors otlp/names.py, which states the rules).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace otelprof {

// The span name of a kernel called `name`: what tells kernels apart first (the operation lifted
// out of the template arguments, noise words and platform prefixes out of the lead, the tile
// within 32 characters), parts joined by " · ", at most 128 characters (otlp/names.py states the rules).
std::string fold_kernel_name(std::string_view name);

// "cpu", "cuda:0", … for a c10::DeviceType number and device index (has_id false: no index);
// empty for a type c10 does not number.
std::string device_name(int64_t device_type, bool has_id, int64_t device_id);

// "0x" and the lowercase hex digits of `v` as an unsigned 64-bit number.
std::string hex_address(int64_t v);

}  // namespace otelprof
