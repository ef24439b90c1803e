// Attribute values and their packed pools: what span and span-event attributes are made of,
// shared by the trace reader (event args, digested as they are read) and the span builder.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace otelprof {

// Keys of span and span-event attributes, numbered: the fixed keys below, then the attributes of
// kArgAttributes (arg_key), then those of kMemoryAttributes (memory_key). See key_name.
using AttrKey = uint16_t;
enum FixedKey : AttrKey {
    kCategoryKey, kThreadIdKey, kAggregatedCountKey, kAggregatedDurationKey, kHiddenSpansKey, kHiddenKey, kSyntheticKey,
    kStepKey, kRankKey, kSelfCpuKey, kSelfDeviceKey, kPeakAllocatedKey,
    // live step spans (step_spans.hpp)
    kStepSourceKey, kStepSamplesKey, kStepTokensKey, kDroppedPhasesKey, kPhaseKey, kStepMicroBatchesKey,
    kStepWindowKey, kPhaseModuleKey,
    // iteration roots (a window without steps)
    kIterationKey, kIterationSourceKey,
    // readable names (names.hpp)
    kKernelNameKey, kMemoryDeviceKey,
    // what a trace list shows (OpenInference's input/output; MLflow's request/response previews)
    kWindowTriggerKey, kInputValueKey, kInputMimeTypeKey, kOutputValueKey, kOutputMimeTypeKey,
    kStepSkippedKey,  // live step spans: an update a gradient scaler skipped
    // live step spans: the step's memory peaks and the out-of-memory errors it caught (StepMemory)
    kStepPeakAllocatedKey, kStepPeakReservedKey, kStepPeakResidentKey, kStepOomsKey,
    // aggregates, what parents and trace roots say was folded into them, window parts
    kAggregatedSelfKey, kAggregatedMinKey, kAggregatedMaxKey,
    kFoldedFirstKey,  // class c's count is kFoldedFirstKey + 2c, its duration the next (kFoldClasses)
    kTraceHiddenKey = kFoldedFirstKey + 14, kTraceAggregatedKey, kSourceFileKey, kWindowPartKey, kWindowPartsKey,
    kEventNameKey,  // the whole name of an event whose span name was cut
    kCodeFunctionKey, kCodeFilePathKey, kCodeLineKey,  // a python_function event's frame
    kMemoryPeakBytesKey, kMemoryPeakDeviceKey,  // the op span at a device's memory peak
    kExecutionTraceFileKey,  // trace roots: Options::execution_trace_file
    kFixedKeyCount
};
constexpr AttrKey arg_key(int arg_attribute) { return static_cast<AttrKey>(kFixedKeyCount + arg_attribute); }
AttrKey memory_key(int memory_attribute);
std::string_view key_name(AttrKey key);
size_t key_count();

// Strings are views: into static tables, Trace::strings or Built::strings (never the JSON text).
// 16 bytes: the string's pointer shares the union (a million of these per large trace); string
// lengths fit in 32 bits, as inputs are under 4 GiB. A span or span-event attribute (in an
// Attrs pool) keeps its key in the padding.
struct AttrValue {
    enum class Type : uint8_t { Str, Int, Double, Bool } type = Type::Str;
    AttrKey key = 0;
    uint32_t len = 0;  // Str only
    union {
        const char* s = "";
        int64_t i;
        double d;
    };
    static AttrValue str(std::string_view v) { AttrValue a; a.type = Type::Str; a.s = v.data(); a.len = static_cast<uint32_t>(v.size()); return a; }
    static AttrValue integer(int64_t v) { AttrValue a; a.type = Type::Int; a.i = v; return a; }
    static AttrValue dbl(double v) { AttrValue a; a.type = Type::Double; a.d = v; return a; }
    static AttrValue boolean(bool v) { AttrValue a; a.type = Type::Bool; a.i = v ? 1 : 0; return a; }
};

static_assert(sizeof(AttrValue) == 16, "a large trace has a million attributes");

// A span's attributes, span events or links: a contiguous range of one of Built's pools
// (Built::attrs, events, links), not a vector per span.
struct AttrRange {
    uint32_t begin = 0, count = 0;
};
using PoolRange = AttrRange;

// Span and span-event attributes, packed (a million per large trace, mostly small integers and
// string views: 4 to 5 bytes each on average instead of 16). An attribute is a header byte (type in
// the top two bits, then the key, or 63 and the key in the next two bytes), then its value: Int a
// zigzag varint, Double 8 bytes, Bool 1 byte, Str its pointer (8 bytes) and length (4). A range of
// them (AttrRange) starts at a byte offset (size()) and counts attributes.
class Attrs {
  public:
    Attrs() = default;
    Attrs(Attrs&& o) noexcept
        : data_(std::move(o.data_)), len_(std::exchange(o.len_, 0)), cap_(std::exchange(o.cap_, 0)),
          longest_(std::exchange(o.longest_, 0)) {}
    Attrs& operator=(Attrs&& o) noexcept {
        data_ = std::move(o.data_);
        len_ = std::exchange(o.len_, 0);
        cap_ = std::exchange(o.cap_, 0);
        longest_ = std::exchange(o.longest_, 0);
        return *this;
    }
    // Where the next attribute starts.
    uint32_t size() const { return static_cast<uint32_t>(len_); }
    // The length (bytes) of the longest string pushed.
    uint32_t longest_string() const { return longest_; }
    void reserve(size_t bytes) {
        if (bytes > cap_) grow(bytes);
    }
    __attribute__((always_inline)) void push_back(const AttrValue& v) {
        if (len_ + kMaxRecord > cap_) grow(std::max(cap_ * 2, len_ + kMaxRecord + 4096));
        uint8_t* p = data_.get() + len_;
        const uint8_t type = static_cast<uint8_t>(v.type) << 6;
        if (v.key < kKeyEscape) {
            *p++ = static_cast<uint8_t>(type | v.key);
        } else {
            *p++ = static_cast<uint8_t>(type | kKeyEscape);
            std::memcpy(p, &v.key, 2);
            p += 2;
        }
        switch (v.type) {
            case AttrValue::Type::Str:
                std::memcpy(p, &v.s, 8);
                std::memcpy(p + 8, &v.len, 4);
                p += 12;
                longest_ = std::max(longest_, v.len);
                break;
            case AttrValue::Type::Int: {
                uint64_t z = (static_cast<uint64_t>(v.i) << 1) ^ static_cast<uint64_t>(v.i >> 63);
                while (z >= 0x80) {
                    *p++ = static_cast<uint8_t>(z | 0x80);
                    z >>= 7;
                }
                *p++ = static_cast<uint8_t>(z);
                break;
            }
            case AttrValue::Type::Double:
                std::memcpy(p, &v.d, 8);
                p += 8;
                break;
            case AttrValue::Type::Bool: *p++ = v.i ? 1 : 0; break;
        }
        len_ = static_cast<size_t>(p - data_.get());
    }
    // `other`'s attributes after these: its ranges then start size() bytes further on.
    void append(const Attrs& other) {
        if (!other.len_) return;
        if (len_ + other.len_ + kMaxRecord > UINT32_MAX) throw std::length_error("span attributes over 4 GiB");
        if (len_ + other.len_ + kMaxRecord > cap_) grow(std::max(cap_ * 2, len_ + other.len_ + kMaxRecord + 4096));
        std::memcpy(data_.get() + len_, other.data_.get(), other.len_);
        len_ += other.len_;
        longest_ = std::max(longest_, other.longest_);
    }
    // f(const AttrValue&) for each attribute of `r`, in order.
    template <typename F>
    void visit(AttrRange r, F&& f) const {
        const uint8_t* p = data_.get() + r.begin;
        AttrValue v;
        for (uint32_t k = 0; k < r.count; ++k) {
            p = decode(p, v);
            f(static_cast<const AttrValue&>(v));
        }
    }
    // f(AttrValue&) for each attribute of `r`, in order; f may shorten a string (len), nothing else.
    template <typename F>
    void edit(AttrRange r, F&& f) {
        uint8_t* p = data_.get() + r.begin;
        AttrValue v;
        for (uint32_t k = 0; k < r.count; ++k) {
            uint8_t* next = const_cast<uint8_t*>(decode(p, v));
            const uint32_t len = v.len;
            f(v);
            if (v.type == AttrValue::Type::Str && v.len != len) std::memcpy(next - 4, &v.len, 4);
            p = next;
        }
    }

  private:
    static constexpr uint8_t kKeyEscape = 63;
    static constexpr size_t kMaxRecord = 3 + 12;
    struct Free {
        void operator()(uint8_t* p) const { std::free(p); }
    };
    std::unique_ptr<uint8_t, Free> data_;
    size_t len_ = 0, cap_ = 0;
    uint32_t longest_ = 0;

    void grow(size_t cap) {
        // ranges start at 32-bit offsets: more would wrap (a trace far beyond the inputs read)
        if (cap > UINT32_MAX) {
            if (len_ + kMaxRecord > UINT32_MAX) throw std::length_error("span attributes over 4 GiB");
            cap = UINT32_MAX;
        }
        auto* grown = static_cast<uint8_t*>(std::realloc(data_.get(), cap));
        if (!grown) throw std::bad_alloc();
        data_.release();
        data_.reset(grown);
        cap_ = cap;
    }
    static const uint8_t* decode(const uint8_t* p, AttrValue& v) {
        const uint8_t head = *p++;
        v.type = static_cast<AttrValue::Type>(head >> 6);
        v.key = head & kKeyEscape;
        if (v.key == kKeyEscape) {
            std::memcpy(&v.key, p, 2);
            p += 2;
        }
        switch (v.type) {
            case AttrValue::Type::Str:
                std::memcpy(&v.s, p, 8);
                std::memcpy(&v.len, p + 8, 4);
                return p + 12;
            case AttrValue::Type::Int: {
                uint64_t z = 0;
                for (int shift = 0;; shift += 7) {
                    const uint8_t b = *p++;
                    z |= static_cast<uint64_t>(b & 0x7F) << shift;
                    if (b < 0x80) break;
                }
                v.i = static_cast<int64_t>((z >> 1) ^ (~(z & 1) + 1));
                return p;
            }
            case AttrValue::Type::Double: std::memcpy(&v.d, p, 8); return p + 8;
            case AttrValue::Type::Bool: v.i = *p; return p + 1;
        }
        return p;
    }
};
// Copies `s` into `strings`: large chunks that never reallocate, so the views stay valid.
inline std::string_view keep_string(std::deque<std::string>& strings, std::string_view s) {
    constexpr size_t kChunk = 1 << 20;
    if (strings.empty() || strings.back().capacity() - strings.back().size() < s.size()) {
        strings.emplace_back();
        strings.back().reserve(std::max(kChunk, s.size()));
    }
    std::string& chunk = strings.back();
    const size_t at = chunk.size();
    chunk.append(s);
    return std::string_view(chunk.data() + at, s.size());
}

}  // namespace otelprof
