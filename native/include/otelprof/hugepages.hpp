// Allocator for the few very large per-conversion arrays (JSON nodes, spans, attributes).
// Large traces fill hundreds of megabytes once; with 4 KiB pages the kernel spends a quarter
// of the conversion faulting them in and unmapping them. Asking for transparent huge pages
// (where the system allows them on request) makes that ~500x fewer faults.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace otelprof {

template <typename T>
struct HugePageAllocator {
    using value_type = T;
    static constexpr size_t kHugePage = size_t{2} << 20;

    HugePageAllocator() = default;
    template <typename U>
    HugePageAllocator(const HugePageAllocator<U>&) {}

    T* allocate(size_t n) {
        const size_t bytes = n * sizeof(T);
        if (bytes < kHugePage) {
            if (void* p = std::malloc(bytes ? bytes : 1)) return static_cast<T*>(p);
            throw std::bad_alloc();
        }
        const size_t rounded = (bytes + kHugePage - 1) & ~(kHugePage - 1);
        void* p = std::aligned_alloc(kHugePage, rounded);
        if (!p) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
        madvise(p, rounded, MADV_HUGEPAGE);  // advisory: failure only costs speed
#endif
        return static_cast<T*>(p);
    }
    void deallocate(T* p, size_t) { std::free(p); }

    template <typename U>
    bool operator==(const HugePageAllocator<U>&) const { return true; }
    template <typename U>
    bool operator!=(const HugePageAllocator<U>&) const { return false; }
};

// Asks for transparent huge pages over the whole 2 MiB pages inside [p, p + bytes) (an array
// allocated elsewhere, e.g. a std::vector's reserved storage). Advisory: failure only costs speed.
inline void advise_huge_pages([[maybe_unused]] void* p, [[maybe_unused]] size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    constexpr size_t page = size_t{2} << 20;
    const auto from = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
    const auto to = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(page - 1);
    if (to > from) madvise(reinterpret_cast<void*>(from), to - from, MADV_HUGEPAGE);
#endif
}

template <typename T>
using BigVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace otelprof
