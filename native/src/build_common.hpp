// Internal to the builder's stages (tree.cpp, builder.cpp): the small types and helpers they share.
// Not installed, never included by the bindings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "otelprof/json.hpp"
#include "otelprof/trace.hpp"

namespace otelprof::detail {

// Not yet computed (owners, nearest kept ancestors).
constexpr int kUnset = -2;

// Why an event is hidden beyond its kind or length (reference: volume.HIDDEN_*).
enum Hidden : uint8_t { kHiddenShort = 1, kHiddenPython, kHiddenBudget, kHiddenStepCopy, kHiddenWindowRoot, kHiddenOutsideStep };

// What hidden events a parent accounts for, by class (reference: volume.FOLD_CLASSES): ops and
// annotations, python functions, runtime calls, kernels, memcpys, memsets, other device activity.
constexpr int kFoldClasses = 7;
inline int fold_class(Kind k) {
    switch (k) {
        case Kind::Python: return 1;
        case Kind::Runtime: return 2;
        case Kind::Kernel: return 3;
        case Kind::Memcpy: return 4;
        case Kind::Memset: return 5;
        case Kind::Sync:
        case Kind::GpuAnnotation: return 6;
        default: return 0;
    }
}

struct IdentPairHash {
    size_t operator()(const std::pair<Ident, Ident>& k) const {
        uint64_t h = static_cast<uint64_t>(k.first.value) * 0x9E3779B97F4A7C15ULL;
        h ^= static_cast<uint64_t>(k.second.value) + 0x7F4A7C159E3779B9ULL + (h << 6) + (h >> 2);
        h ^= (k.first.is_str ? 1u : 0u) | (k.second.is_str ? 2u : 0u);
        return static_cast<size_t>(h);
    }
};
struct IdentPairEq {
    bool operator()(const std::pair<Ident, Ident>& a, const std::pair<Ident, Ident>& b) const {
        return a.first == b.first && a.second == b.second;
    }
};

struct Item {
    int64_t t;
    int probe;  // 0 = event, 1 = probe
    int64_t neg_end;
    uint32_t ordinal;
    int32_t idx;  // >= 0 event index, < 0: -1 - probe index
    bool operator<(const Item& o) const {
        if (t != o.t) return t < o.t;
        if (probe != o.probe) return probe < o.probe;
        if (neg_end != o.neg_end) return neg_end < o.neg_end;
        return ordinal < o.ordinal;
    }
};

// Sorts items that mostly arrive as a few ascending runs (tree.cpp); the same order as std::sort.
void sort_items(std::vector<Item>& items);

}  // namespace otelprof::detail
