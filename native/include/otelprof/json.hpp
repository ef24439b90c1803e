// Minimal, strict JSON DOM: numbers keep their source text (so a reader can convert them
// exactly), strings point into the input when unescaped. Knows nothing of Kineto (trace.hpp).
// Semantics mirror Python's json module (duplicate keys: last value wins).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "otelprof/hugepages.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace otelprof {

// Input that cannot be read as a trace; the message names where and why.
struct TraceError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// String equality for member keys (short; compared once per member parsed): whole words inline,
// as a call to memcmp costs more than the comparison itself.
inline bool same(std::string_view a, std::string_view b) {
    const size_t n = a.size();
    if (n != b.size()) return false;
    const char *x = a.data(), *y = b.data();
    auto word_at = [](const char* p, size_t at, auto word) {
        std::memcpy(&word, p + at, sizeof word);
        return word;
    };
    auto equal_at = [&](size_t at, auto word) { return word_at(x, at, word) == word_at(y, at, word); };
#if defined(__SSE2__)
    if (n >= 16) {  // long names (kernels): 16 bytes at a time, the last 16 overlapping
        auto equal16 = [&](size_t at) {
            const __m128i a16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + at));
            const __m128i b16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(y + at));
            return _mm_movemask_epi8(_mm_cmpeq_epi8(a16, b16)) == 0xFFFF;
        };
        for (size_t at = 0; at + 16 < n; at += 16)
            if (!equal16(at)) return false;
        return equal16(n - 16);
    }
#endif
    if (n >= 8) {
        for (size_t at = 0; at + 8 < n; at += 8)
            if (!equal_at(at, uint64_t{})) return false;
        return equal_at(n - 8, uint64_t{});  // the last 8 bytes, overlapping the last whole word
    }
    if (n >= 4) return equal_at(0, uint32_t{}) && equal_at(n - 4, uint32_t{});  // overlapping halves
    for (size_t at = 0; at < n; ++at)
        if (x[at] != y[at]) return false;
    return true;
}

// Hash of short strings (keys, names), a word at a time. Tables of input strings use a seed
// random per table, so a crafted trace cannot make its strings collide (which would make
// lookups linear); nothing that is output depends on the seed.
inline uint64_t hash_text(std::string_view text, uint64_t seed) {
    uint64_t h = seed ^ (text.size() * 0x9E3779B97F4A7C15ULL);
    for (size_t at = 0; at < text.size(); at += 8) {
        uint64_t w = 0;
        std::memcpy(&w, text.data() + at, std::min<size_t>(8, text.size() - at));
        h = (h ^ w) * 0xBF58476D1CE4E5B9ULL;
        h ^= h >> 31;
    }
    return h;
}
uint64_t random_seed();

enum class JType : uint8_t { Null, False, True, Int, BigInt, Num, Str, Arr, Obj };

constexpr uint32_t kNoNode = UINT32_MAX;

// Member keys are interned per document: lookups compare 32-bit ids instead of re-reading key
// text scattered over the input (a cache miss per member), and nodes stay at 24 bytes.
using KeyId = uint32_t;
constexpr KeyId kNoKey = UINT32_MAX;

// Nodes are stored in pre-order: a container's first child follows it, and its children are
// linked through `next`, an offset, so the parser writes each node once.
struct JNode {
    JType type = JType::Null;
    uint32_t len = 0;   // string/number text length, or child count
    KeyId key = kNoKey;  // member key when inside an object (Document::key)
    uint32_t next = 0;  // the next sibling is this many nodes on (0: none)
    union {
        int64_t i;      // Int
        const char* s;  // Str / Num / BigInt text
    };
    JNode() : i(0) {}

    std::string_view str() const { return {s, len}; }
    bool is_number() const { return type == JType::Int || type == JType::BigInt || type == JType::Num; }
};
static_assert(sizeof(JNode) == 24, "a large trace has millions of nodes");

class Document;

// Takes the elements of one array member of the root object (array_key(); a trace's events) as
// they are parsed, so that the document need not keep them: most nodes are read only once.
class ElementSink {
  public:
    virtual ~ElementSink() = default;
    // The root object's member whose array is streamed here.
    virtual std::string_view array_key() const = 0;
    // That array starts at node `array` (a duplicate key starts another). The document keeps
    // the array node, without elements.
    virtual void begin(uint32_t array) = 0;
    // The array's next element, just parsed at node `at`. The document then drops its nodes.
    virtual void element(const Document& doc, uint32_t at) = 0;
    // The array opened at text offset `array_at` (after its '['; not called for streamed input):
    // returns where a second parser (Document::parse_elements) reads its elements from, or
    // SIZE_MAX. The parser calls resume() at the first element at or past that offset.
    virtual size_t handoff([[maybe_unused]] size_t array_at) { return SIZE_MAX; }
    // The next element starts at offset `at`: returns where this parser goes on, the offset of
    // the array's ']' when the second parser's elements were taken from `at` to there, else `at`.
    virtual size_t resume(size_t at) { return at; }
};

// JSON that is still arriving (being inflated) into one buffer that never moves.
class InputStream {
  public:
    virtual ~InputStream() = default;
    virtual const char* data() const = 0;
    virtual size_t size_hint() const = 0;  // the expected size, to size arrays (0: unknown)
    // Blocks until at least `want` bytes are there or all of them are; returns how many are
    // there, and sets `complete` when that is all.
    virtual size_t wait_for(size_t want, bool& complete) = 0;
};

class Document {
  public:
    // Parses `text` (kept alive by the caller). Throws TraceError.
    explicit Document(std::string_view text, ElementSink* sink = nullptr);
    // Parses `stream` as it arrives. Any TraceError may be an artefact of input the parser
    // was not given yet (a value longer than the read-ahead): the caller parses the whole
    // text again for the verdict. text() is the input parsed, once complete.
    Document(InputStream& stream, ElementSink* sink);
    std::string_view text() const { return text_; }
    // Parses the elements of an array from offset `from` of `text` (where one starts, in the
    // array Document(text, sink) streams) to the array's ']', each to `sink` as that parse
    // would; sets `end` to the offset of the ']'. `stop`, read between elements, ends the parse.
    // Throws TraceError, without a position: the caller parses that part again for the verdict.
    static std::unique_ptr<Document> parse_elements(std::string_view text, size_t from, ElementSink& sink,
                                                    const std::atomic<bool>& stop, size_t& end);
    // Where a second parser can start in `text`, at or after offset `near`: an object after
    // "}," (whitespace aside), or SIZE_MAX. It may be no element at all (text in a string).
    static size_t element_near(std::string_view text, size_t near);

    const JNode& root() const { return nodes_[root_]; }
    const JNode& node(uint32_t index) const { return nodes_[index]; }
    uint32_t index(const JNode& node) const { return static_cast<uint32_t>(&node - nodes_.data()); }
    // Children in order: for (auto* c = doc.first(node); c; c = doc.next(c)) ...
    const JNode* first(const JNode& container) const { return container.len ? &container + 1 : nullptr; }
    const JNode* next(const JNode* node) const { return node->next ? node + node->next : nullptr; }
    // The node after `node`, a child that is not its container's last: the next one in a loop
    // that counts its container's children. Most children are scalars, whose next sibling is the
    // adjacent node: a branch the processor predicts, where following `next` waits on a load.
    static const JNode* after(const JNode* node) {
        const uint32_t step = node->next;
        if (__builtin_expect(step == 1, 1)) return node + 1;
        return node + step;
    }
    // Object member lookup with Python dict semantics: the last duplicate wins.
    const JNode* get(const JNode& object, KeyId key) const;
    const JNode* get(const JNode& object, std::string_view key) const { return get(object, key_id(key)); }

    // The id of `key`, or kNoKey when no object in the document has such a member.
    KeyId key_id(std::string_view key) const;
    std::string_view key(const JNode& member) const { return keys_[member.key]; }
    std::string_view key_name(KeyId id) const { return keys_[id]; }
    size_t key_count() const { return keys_.size(); }

  private:
    friend class Parser;
    Document() = default;
    std::string_view text_;
    BigVector<JNode> nodes_;
    uint32_t root_ = 0;
    std::vector<std::unique_ptr<char[]>> arena_;  // decoded (escaped) strings
    std::vector<std::string_view> keys_;           // by KeyId
    std::vector<uint64_t> key_hashes_;             // by KeyId
    std::vector<uint8_t> plain_;                   // by KeyId: no quote, backslash or control character
    uint64_t hash_seed_ = random_seed();
    std::vector<KeyId> key_slots_;                 // open-addressing table over keys_

    KeyId intern(std::string_view key);
    KeyId find_key(std::string_view key, uint64_t hash, size_t& slot) const;
};

// Canonical compact rendering, identical to the Python reference's `render`.
void render_json(const Document& doc, const JNode& node, std::string& out);
void append_json_string(std::string_view s, std::string& out);

// int64 value of an integer literal node, or false (mirrors `as_int64`).
inline bool as_int64(const JNode* n, int64_t& out) {
    if (n && n->type == JType::Int) {
        out = n->i;
        return true;
    }
    return false;
}
// Finite double of a number node, or false (mirrors `as_double`).
bool as_double(const JNode* n, double& out);
const char* type_name(const JNode* n);

}  // namespace otelprof
