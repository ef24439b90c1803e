#include "otelprof/json.hpp"

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <unordered_map>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

// The SWAR scans below load 8 bytes as one word and take its lowest byte as the first.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "json.cpp's word-at-a-time scans assume a little-endian target");

namespace otelprof {

namespace {

constexpr int kMaxDepth = 512;

[[noreturn]] void utf8_error(size_t at) { throw TraceError("trace is not valid UTF-8 (byte " + std::to_string(at) + ")"); }

// Length of the UTF-8 sequence that starts with the non-ASCII byte at p (before end), or 0 where it
// is not strict UTF-8 (no overlongs, no encoded surrogates, <= U+10FFFF), as Python's decoder.
inline size_t utf8_sequence(const unsigned char* p, const unsigned char* end) {
    const unsigned char c = *p;
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    if (static_cast<size_t>(end - p) <= need) return 0;
    if (p[1] < lo || p[1] > hi) return 0;
    for (size_t k = 2; k <= need; ++k)
        if (p[k] < 0x80 || p[k] > 0xBF) return 0;
    return need + 1;
}

// Strict UTF-8 validation of a whole text, for the error a JSON error defers to (Python decodes
// before it parses). A parse that succeeds has validated its input as it went (Parser::string).
void validate_utf8(std::string_view text) {
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t chunk;
            std::memcpy(&chunk, p + i, 8);
            if ((chunk & 0x8080808080808080ULL) == 0) {
                i += 8;
                continue;
            }
        }
        if (p[i] < 0x80) {
            ++i;
            continue;
        }
        const size_t len = utf8_sequence(p + i, p + n);
        if (!len) utf8_error(i);
        i += len;
    }
}

// The first byte from p on that a string scan must look at: '"', '\\', a control character or a
// non-ASCII byte (end where there is none).
inline const char* scan_string(const char* p, const char* end) {
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), space = _mm_set1_epi8(0x20);
    for (; end - p >= 16; p += 16) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        // a signed compare: control characters and non-ASCII bytes (negative) are both below ' '
        const __m128i hit =
            _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)), _mm_cmplt_epi8(v, space));
        if (const unsigned mask = static_cast<unsigned>(_mm_movemask_epi8(hit))) return p + __builtin_ctz(mask);
    }
#endif
    // SWAR, 8 bytes at a time (the tail, or all of it without SSE2)
    constexpr uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    for (; end - p >= 8; p += 8) {
        uint64_t w;
        std::memcpy(&w, p, 8);
        const uint64_t quote = w ^ (ones * '"'), slash = w ^ (ones * '\\');
        const uint64_t hit = ((quote - ones) & ~quote) | ((slash - ones) & ~slash) | ((w - ones * 0x20) & ~w) | w;
        if (hit & highs) return p + (__builtin_ctzll(hit & highs) >> 3);  // little-endian: the first such byte
    }
    for (; p < end; ++p) {
        const auto c = static_cast<unsigned char>(*p);
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) return p;
    }
    return p;
}

void put_utf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

}  // namespace

uint64_t random_seed() { return (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}(); }

class Parser {
  public:
    Parser(Document& doc, std::string_view text, ElementSink* sink, InputStream* stream = nullptr)
        : doc_(doc), sink_(sink), sink_key_(sink ? sink->array_key() : std::string_view()), stream_(stream), p_(text.data()), begin_(text.data()), end_(text.data() + text.size()) {}

    void run() {
        if (stream_) read_ahead();
        skip_ws();
        doc_.root_ = value(0, kNoKey);
        while (!complete_) read_ahead(SIZE_MAX);
        skip_ws();
        if (p_ != end_) fail("Extra data");
    }

    std::string_view input() const { return {begin_, static_cast<size_t>(end_ - begin_)}; }

    // Document::parse_elements: the elements from `from` to the array's ']' (returns its
    // offset), at the depth of the streamed array's elements.
    size_t run_elements(size_t from, const std::atomic<bool>& stop) {
        quiet_ = true;
        stop_ = &stop;
        p_ = begin_ + from;
        const uint32_t idx = push(JType::Arr, kNoKey);
        sink_->begin(idx);
        elements(kStreamedDepth, sink_, idx);
        return static_cast<size_t>(p_ - begin_) - 1;  // (p_ is past the ']')
    }

  private:
    Document& doc_;
    ElementSink* sink_;
    std::string_view sink_key_;  // the root member whose array elements go to sink_
    InputStream* stream_;        // input still arriving, or nullptr: all of it is in [begin_, end_)
    const char* p_;
    const char* begin_;
    const char* end_;            // streamed: the end of what has arrived
    bool complete_ = true;       // streamed: end_ is the end of the input
    size_t handoff_ = SIZE_MAX;  // ElementSink::handoff(), until resume() is called
    bool quiet_ = false;         // errors need no message (parse_elements: the caller parses again)
    const std::atomic<bool>* stop_ = nullptr;  // parse_elements: set, the parse ends between elements
    // The depth of the streamed array's elements: the root object's member values are at 1.
    static constexpr int kStreamedDepth = 2;
    std::string buf_;
    // Guesses for member_key, two per slot (see there): the last two keys seen in that slot.
    static constexpr size_t kWays = 2;
    std::vector<KeyId> after_key_;  // slot k: the key after key k
    std::vector<KeyId> first_key_;  // slot k + 1: the first key of an object that is the value of key k; 0: of other objects

    uint32_t push(const JNode& node) {
        doc_.nodes_.push_back(node);
        return static_cast<uint32_t>(doc_.nodes_.size() - 1);
    }

    uint32_t push(JType type, KeyId key) {
        doc_.nodes_.emplace_back();
        doc_.nodes_.back().type = type;
        doc_.nodes_.back().key = key;
        return static_cast<uint32_t>(doc_.nodes_.size() - 1);
    }

    // Streamed input is parsed while it inflates; the parser reads at most this far past p_ before
    // asking for more (and waiting), between array elements and root members. A value longer
    // than this reads as truncated: the caller then parses the whole text again.
    static constexpr size_t kReadAhead = size_t{1} << 20;

    void maybe_read_ahead() {
        if (stream_ && !complete_ && static_cast<size_t>(end_ - p_) < kReadAhead) read_ahead();
    }

    // Waits until `want` bytes past p_ have arrived (or all have). UTF-8 needs no pass of its
    // own: the string scan checks it, and outside strings anything but ASCII is a JSON error.
    void read_ahead(size_t want = 2 * kReadAhead) {
        const size_t at = static_cast<size_t>(p_ - begin_);
        const size_t available = stream_->wait_for(want > SIZE_MAX - at ? SIZE_MAX : at + want, complete_);
        end_ = begin_ + available;
        if (complete_ && available >= UINT32_MAX) throw TraceError("trace too large (over 4 GiB of JSON)");
    }

    [[noreturn]] void fail(const char* what) const {
        if (quiet_) throw TraceError(what);
        // an invalid UTF-8 byte anywhere is the error (Python decodes the whole text first)
        validate_utf8(std::string_view(begin_, static_cast<size_t>(end_ - begin_)));
        // line/column like Python's JSONDecodeError
        size_t line = 1, col = 1;
        for (const char* q = begin_; q < p_ && q < end_; ++q) {
            if (*q == '\n') {
                ++line;
                col = 1;
            } else if ((static_cast<unsigned char>(*q) & 0xC0) != 0x80) {
                ++col;
            }
        }
        throw TraceError("invalid JSON at line " + std::to_string(line) + " column " + std::to_string(col) + ": " + what);
    }

    void skip_ws() {
        // single spaces between tokens are the common case; after a newline, skip the indentation
        // 8 bytes at a time, up to its first non-space byte
        constexpr uint64_t spaces = 0x2020202020202020ULL;
        while (p_ < end_) {
            const char c = *p_;
            if (static_cast<unsigned char>(c) > ' ') break;  // no whitespace: the most common case
            if (c == ' ') {
                ++p_;
            } else if (c == '\n' || c == '\r' || c == '\t') {
                ++p_;
                uint64_t w;
                while (end_ - p_ >= 8) {
                    std::memcpy(&w, p_, 8);
                    if (uint64_t other = w ^ spaces) {
                        p_ += __builtin_ctzll(other) >> 3;  // little-endian: the first non-space byte
                        break;
                    }
                    p_ += 8;
                }
            } else {
                break;
            }
        }
    }

    // Parses one value at p_, appends its node (and its children after it); returns its index.
    // `member` is the key whose value this is (kNoKey: an array element or the root).
    __attribute__((always_inline)) uint32_t value(int depth, KeyId member) {
        if (p_ >= end_) fail("Expecting value");
        switch (*p_) {
            case '{': return object(depth + 1, member);
            case '[': return array(depth + 1, nullptr, member);
            case '"': {
                const std::string_view s = string();
                JNode node;  // written whole, once
                node.type = JType::Str;
                node.key = member;
                node.s = s.data();
                node.len = static_cast<uint32_t>(s.size());
                return push(node);
            }
            case 't': return literal("true", JType::True, member);
            case 'f': return literal("false", JType::False, member);
            case 'n': return literal("null", JType::Null, member);
            default: {
                JNode node;
                node.key = member;
                number(node);
                return push(node);
            }
        }
    }

    uint32_t literal(const char* word, JType type, KeyId member) {
        size_t n = std::strlen(word);
        if (static_cast<size_t>(end_ - p_) < n || std::memcmp(p_, word, n) != 0) fail("Expecting value");
        p_ += n;
        return push(type, member);
    }

    static constexpr uint64_t kPow10[9] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000};

    // How many of the 8 bytes of w (little-endian: the first lowest) are digits before the first
    // that is not.
    static unsigned leading_digits(uint64_t w) {
        // a byte is a digit iff its high nibble is 3 and adding 6 does not carry out of the low one
        // (a carry into the next byte comes from a byte that is not a digit: only later bytes
        // are wrong)
        const uint64_t x = ((w & 0xF0F0F0F0F0F0F0F0ULL) | (((w + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) >> 4)) ^
                           0x3333333333333333ULL;  // zero bytes: digits
        const uint64_t other = (((x & 0x7F7F7F7F7F7F7F7FULL) + 0x7F7F7F7F7F7F7F7FULL) | x) & 0x8080808080808080ULL;
        return other ? static_cast<unsigned>(__builtin_ctzll(other)) >> 3 : 8;
    }

    // The decimal value of 8 digit bytes (the first lowest).
    static uint64_t digits_value(uint64_t w) {
        w -= 0x3030303030303030ULL;  // digit values, first digit lowest
        w = (w * 10) + (w >> 8);     // pairs: 10 * d0 + d1 in every other byte
        return (((w & 0x000000FF000000FFULL) * (100 + (1000000ULL << 32))) +
                (((w >> 16) & 0x000000FF000000FFULL) * (1 + (10000ULL << 32)))) >> 32;
    }

    __attribute__((always_inline)) void number(JNode& out) {
        const char* start = p_;
        bool neg = false;
        if (p_ < end_ && *p_ == '-') {
            neg = true;
            ++p_;
        }
        if (p_ >= end_ || !(*p_ >= '0' && *p_ <= '9')) {
            p_ = start;
            fail("Expecting value");
        }
        // integer part, accumulated while scanning (19 digits always fit in uint64)
        const char* digits = p_;
        uint64_t acc = 0;
        if (*p_ == '0') {
            ++p_;
        } else if (end_ - p_ >= 2 && static_cast<unsigned>(p_[1] - '0') >= 10) {
            acc = static_cast<unsigned>(*p_++ - '0');  // one digit (counts, flags, devices): the commonest length
        } else {
            // up to eight digits at a time, without a branch per digit (timestamps have 16); acc
            // wraps past 2^64 exactly as digit by digit
            while (end_ - p_ >= 8) {
                uint64_t w;
                std::memcpy(&w, p_, 8);
                const unsigned n = leading_digits(w);
                if (n == 8) {
                    acc = acc * 100000000 + digits_value(w);
                    p_ += 8;
                    continue;
                }
                if (n) {
                    // the n digits at the top, '0's below them
                    acc = acc * kPow10[n] + digits_value((w << (8 * (8 - n))) | (0x3030303030303030ULL >> (8 * n)));
                    p_ += n;
                }
                goto digits_done;
            }
            while (p_ < end_ && static_cast<unsigned>(*p_ - '0') < 10) {
                acc = acc * 10 + static_cast<unsigned>(*p_ - '0');
                ++p_;
            }
        digits_done:;
        }
        const size_t n_digits = static_cast<size_t>(p_ - digits);
        bool integral = true;
        if (p_ + 1 < end_ && *p_ == '.' && static_cast<unsigned>(p_[1] - '0') < 10) {
            integral = false;
            p_ += 2;
            while (p_ < end_ && static_cast<unsigned>(*p_ - '0') < 10) ++p_;
        }
        if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
            const char* q = p_ + 1;
            if (q < end_ && (*q == '+' || *q == '-')) ++q;
            if (q < end_ && static_cast<unsigned>(*q - '0') < 10) {
                integral = false;
                while (q < end_ && static_cast<unsigned>(*q - '0') < 10) ++q;
                p_ = q;
            }
        }
        out.s = start;
        out.len = static_cast<uint32_t>(p_ - start);
        if (!integral) {
            out.type = JType::Num;
            return;
        }
        bool fits = n_digits < 19 || (n_digits == 19 && (neg ? acc <= (1ULL << 63) : acc <= static_cast<uint64_t>(INT64_MAX)));
        if (n_digits == 19 && acc < 1000000000000000000ULL) fits = false;  // wrapped past uint64
        if (fits) {
            out.type = JType::Int;
            out.i = neg ? static_cast<int64_t>(0 - acc) : static_cast<int64_t>(acc);
        } else {
            out.type = JType::BigInt;
        }
    }

    static int hexval(char c) {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    }

    // The four hex digits after a "\\u" (p_ after the 'u'). Python's json wants a character after
    // them, and reports a bad escape at its 'u'.
    uint32_t hex4() {
        if (end_ - p_ <= 4) bad_u_escape();
        uint32_t v = 0;
        for (int k = 0; k < 4; ++k) {
            int h = hexval(p_[k]);
            if (h < 0) bad_u_escape();
            v = v * 16 + static_cast<uint32_t>(h);
        }
        p_ += 4;
        return v;
    }

    [[noreturn]] void bad_u_escape() {
        --p_;
        fail("Invalid \\uXXXX escape");
    }

    // Where a string that starts at `start` (after its quote) runs past the end of the input.
    [[noreturn]] void unterminated(const char* start) {
        p_ = start - 1;
        fail("Unterminated string starting at");
    }

    // The length of the UTF-8 sequence at p_ (a non-ASCII byte inside a string). Bytes outside
    // strings are ASCII or a JSON error, so a parse that gets through validates its whole input.
    size_t utf8_char() const {
        const auto* p = reinterpret_cast<const unsigned char*>(p_);
        const size_t len = utf8_sequence(p, reinterpret_cast<const unsigned char*>(end_));
        if (!len) utf8_error(static_cast<size_t>(p_ - begin_));  // every byte before p_ is valid
        return len;
    }

    // Parses a string at p_ (on the opening quote); returns a view valid for the document's life.
    // The common case inline: a string with no escape and no non-ASCII byte.
    __attribute__((always_inline)) std::string_view string() {
        ++p_;
        const char* start = p_;
        p_ = scan_string(p_, end_);
        if (p_ < end_ && *p_ == '"') {
            std::string_view s(start, static_cast<size_t>(p_ - start));
            ++p_;
            return s;
        }
        return string_rest(start);
    }

    // The rest of the string that starts at `start`, from p_ (a byte that scan_string stops at).
    __attribute__((noinline)) std::string_view string_rest(const char* start) {
        while (true) {
            if (p_ >= end_) unterminated(start);
            const auto c = static_cast<unsigned char>(*p_);
            if (c == '"') {
                std::string_view s(start, static_cast<size_t>(p_ - start));
                ++p_;
                return s;
            }
            if (c == '\\') break;
            if (c < 0x20) fail("Invalid control character at");
            p_ += utf8_char();
            p_ = scan_string(p_, end_);
        }
        buf_.assign(start, static_cast<size_t>(p_ - start));
        while (true) {
            const char* run = p_;
            p_ = scan_string(p_, end_);
            buf_.append(run, static_cast<size_t>(p_ - run));
            if (p_ >= end_) unterminated(start);
            const auto c = static_cast<unsigned char>(*p_);
            if (c == '"') {
                ++p_;
                break;
            }
            if (c < 0x20) fail("Invalid control character at");
            if (c != '\\') {
                const size_t len = utf8_char();
                buf_.append(p_, len);
                p_ += len;
                continue;
            }
            ++p_;
            if (p_ >= end_) unterminated(start);
            char e = *p_++;
            switch (e) {
                case '"': buf_.push_back('"'); break;
                case '\\': buf_.push_back('\\'); break;
                case '/': buf_.push_back('/'); break;
                case 'b': buf_.push_back('\b'); break;
                case 'f': buf_.push_back('\f'); break;
                case 'n': buf_.push_back('\n'); break;
                case 'r': buf_.push_back('\r'); break;
                case 't': buf_.push_back('\t'); break;
                case 'u': {
                    uint32_t cp = hex4();
                    if (cp >= 0xD800 && cp <= 0xDBFF && end_ - p_ > 6 && p_[0] == '\\' && p_[1] == 'u') {
                        const char* save = p_;
                        p_ += 2;
                        uint32_t low = hex4();
                        if (low >= 0xDC00 && low <= 0xDFFF) {
                            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                        } else {
                            p_ = save;  // lone high surrogate; the next escape is its own character
                        }
                    }
                    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;  // lone surrogate -> U+FFFD
                    put_utf8(cp, buf_);
                    break;
                }
                default: p_ -= 2; fail("Invalid \\escape");  // at the backslash, as Python's json
            }
        }
        auto mem = std::make_unique<char[]>(buf_.size() + 1);
        std::memcpy(mem.get(), buf_.data(), buf_.size());
        const char* data = mem.get();
        doc_.arena_.push_back(std::move(mem));
        return {data, buf_.size()};
    }

    // Interns the member key at p_. Objects of one kind repeat their keys in one order, so the keys
    // last seen in the same slot of `guesses` are tried before hashing. Slots: the previous key of
    // the object, or for its first key the key the object is the value of (events and their
    // "args" objects alternate). Two guesses per slot, as two kinds of objects often alternate
    // (e.g. complete events and flow events differ after "ph").
    // A guess is first compared with the input itself: a plain key (see Document::plain_) that the
    // input holds, then a quote, is that key, without scanning it as a string.
    __attribute__((always_inline)) KeyId member_key(std::vector<KeyId>& guesses, size_t slot) {
        if (slot * kWays >= guesses.size()) guesses.resize((doc_.keys_.size() + 1) * kWays, kNoKey);
        KeyId* ways = &guesses[slot * kWays];
        for (size_t w = 0; w < kWays; ++w) {
            if (ways[w] == kNoKey || !doc_.plain_[ways[w]]) continue;
            const std::string_view guess = doc_.keys_[ways[w]];
            if (static_cast<size_t>(end_ - p_) > guess.size() + 1 && p_[guess.size() + 1] == '"' &&
                same(guess, std::string_view(p_ + 1, guess.size()))) {
                p_ += guess.size() + 2;
                return ways[w];
            }
        }
        std::string_view key = string();
        for (size_t w = 0; w < kWays; ++w)
            if (ways[w] != kNoKey && same(doc_.keys_[ways[w]], key)) return ways[w];
        KeyId id = doc_.intern(key);
        std::copy_backward(ways, ways + kWays - 1, ways + kWays);
        ways[0] = id;
        return id;
    }

    // Links `child` after `prev` (if any: a first child needs no link) in container `idx`.
    void link(uint32_t idx, uint32_t& prev, uint32_t child) {
        if (prev != kNoNode) doc_.nodes_[prev].next = child - prev;
        prev = child;
        ++doc_.nodes_[idx].len;
    }

    // `sink`: hand the elements to it instead of keeping them (see ElementSink).
    uint32_t array(int depth, ElementSink* sink, KeyId member) {
        if (depth > kMaxDepth) fail("nested too deeply");
        ++p_;
        const uint32_t idx = push(JType::Arr, member);
        if (sink) {
            sink->begin(idx);
            if (!stream_) handoff_ = sink->handoff(static_cast<size_t>(p_ - begin_));
        }
        skip_ws();
        if (p_ < end_ && *p_ == ']') {
            ++p_;
            return idx;
        }
        elements(depth, sink, idx);
        return idx;
    }

    // The elements of the array at node `idx`, from the first (at p_) past the array's ']'.
    void elements(int depth, ElementSink* sink, uint32_t idx) {
        uint32_t prev = kNoNode;
        while (true) {
            maybe_read_ahead();
            skip_ws();
            if (sink) {
                if (stop_ && stop_->load(std::memory_order_relaxed)) throw TraceError("stopped");
                if (static_cast<size_t>(p_ - begin_) >= handoff_) {
                    // a second parser read the elements from here on: its end is where this goes on
                    const auto at = static_cast<size_t>(p_ - begin_);
                    handoff_ = SIZE_MAX;
                    if (const size_t to = sink->resume(at); to != at) {
                        p_ = begin_ + to + 1;  // past the ']'
                        return;
                    }
                }
            }
            const uint32_t child = value(depth, kNoKey);
            if (sink) {
                sink->element(doc_, child);
                doc_.nodes_.resize(child);  // the element's nodes go: the sink read what it needs
            } else {
                link(idx, prev, child);
            }
            skip_ws();
            if (p_ >= end_) fail("Expecting ',' delimiter");
            if (*p_ == ',') {
                ++p_;
                continue;
            }
            if (*p_ == ']') {
                ++p_;
                return;
            }
            fail("Expecting ',' delimiter");
        }
    }

    // Whether the value at p_ is the array of the root object's member the sink streams.
    bool events_member(int depth, KeyId member, KeyId key) const {
        return sink_ && depth == 1 && member == kNoKey && p_ < end_ && *p_ == '[' && doc_.keys_[key] == sink_key_;
    }

    uint32_t object(int depth, KeyId member) {
        if (depth > kMaxDepth) fail("nested too deeply");
        ++p_;
        const uint32_t idx = push(JType::Obj, member);
        uint32_t prev = kNoNode, count = 0;
        KeyId prev_key = kNoKey;
        skip_ws();
        if (p_ < end_ && *p_ == '}') {
            ++p_;
            return idx;
        }
        while (true) {
            if (depth == 1) maybe_read_ahead();
            skip_ws();
            if (p_ >= end_ || *p_ != '"') fail("Expecting property name enclosed in double quotes");
            KeyId key = prev_key = prev_key != kNoKey ? member_key(after_key_, prev_key)
                                                      : member_key(first_key_, member == kNoKey ? 0 : size_t{member} + 1);
            skip_ws();
            if (p_ >= end_ || *p_ != ':') fail("Expecting ':' delimiter");
            ++p_;
            skip_ws();
            // (the value's node has its key)
            const uint32_t child = events_member(depth, member, key) ? array(depth + 1, sink_, key) : value(depth, key);
            // linked here, and counted in a register: the object's node is written once, at its end
            JNode* nodes = doc_.nodes_.data();
            if (prev != kNoNode) nodes[prev].next = child - prev;
            prev = child;
            ++count;
            skip_ws();
            if (p_ < end_ && *p_ == ',') {
                ++p_;
                continue;
            }
            if (p_ < end_ && *p_ == '}') {
                ++p_;
                nodes[idx].len = count;
                return idx;
            }
            fail("Expecting ',' delimiter");
        }
    }
};

Document::Document(std::string_view text, ElementSink* sink) {
    if (text.size() >= UINT32_MAX) throw TraceError("trace too large (over 4 GiB of JSON)");
    nodes_.reserve(text.size() / 12 + 16);
    key_slots_.assign(64, kNoKey);
    Parser(*this, text, sink).run();
    text_ = text;
}

std::unique_ptr<Document> Document::parse_elements(std::string_view text, size_t from, ElementSink& sink,
                                                   const std::atomic<bool>& stop, size_t& end) {
    std::unique_ptr<Document> doc(new Document());
    doc->nodes_.reserve(4096);
    doc->key_slots_.assign(64, kNoKey);
    doc->text_ = text;
    end = Parser(*doc, text, &sink).run_elements(from, stop);
    return doc;
}

size_t Document::element_near(std::string_view text, size_t near) {
    // "}", ",", "{" (whitespace between): an object that follows one in an array, at some depth,
    // or text inside a string. The parser that reaches it tells which (ElementSink::resume).
    constexpr size_t kLook = size_t{1} << 20;
    auto space = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
    const size_t stop = std::min(text.size(), near + kLook);
    for (size_t at = near; at < stop; ++at) {
        const void* comma = std::memchr(text.data() + at, ',', stop - at);
        if (!comma) break;
        at = static_cast<size_t>(static_cast<const char*>(comma) - text.data());
        size_t before = at, next = at + 1;
        while (before > 0 && space(text[before - 1])) --before;
        while (next < text.size() && space(text[next])) ++next;
        if (before > 0 && text[before - 1] == '}' && next < text.size() && text[next] == '{') return next;
    }
    return SIZE_MAX;
}

Document::Document(InputStream& stream, ElementSink* sink) {
    nodes_.reserve(std::min<size_t>(stream.size_hint(), UINT32_MAX) / 12 + 16);
    key_slots_.assign(64, kNoKey);
    Parser parser(*this, std::string_view(stream.data(), 0), sink, &stream);
    parser.run();
    text_ = parser.input();
}

const JNode* Document::get(const JNode& object, KeyId key) const {
    if (object.type != JType::Obj || key == kNoKey) return nullptr;
    const JNode* found = nullptr;
    const JNode* c = first(object);
    for (uint32_t k = 0; k < object.len; ++k, c = after(c))
        if (c->key == key) found = c;
    return found;
}

// The id of `key` if interned; otherwise kNoKey, with `slot` the free slot where it belongs.
KeyId Document::find_key(std::string_view key, uint64_t hash, size_t& slot) const {
    const size_t mask = key_slots_.size() - 1;
    for (slot = hash & mask;; slot = (slot + 1) & mask) {
        KeyId id = key_slots_[slot];
        if (id == kNoKey || (key_hashes_[id] == hash && same(keys_[id], key))) return id;
    }
}

KeyId Document::key_id(std::string_view key) const {
    size_t slot;
    return find_key(key, hash_text(key, hash_seed_), slot);
}

KeyId Document::intern(std::string_view key) {
    const uint64_t hash = hash_text(key, hash_seed_);
    size_t slot;
    KeyId id = find_key(key, hash, slot);
    if (id != kNoKey) return id;
    id = static_cast<KeyId>(keys_.size());
    keys_.push_back(key);
    key_hashes_.push_back(hash);
    plain_.push_back(std::none_of(key.begin(), key.end(), [](char c) { return c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20; }));
    key_slots_[slot] = id;
    if (keys_.size() * 2 > key_slots_.size()) {  // keep the load under a half: rehash into twice the slots
        std::vector<KeyId> grown(key_slots_.size() * 2, kNoKey);
        const size_t mask = grown.size() - 1;
        for (KeyId k = 0; k < keys_.size(); ++k) {
            size_t at = key_hashes_[k] & mask;
            while (grown[at] != kNoKey) at = (at + 1) & mask;
            grown[at] = k;
        }
        key_slots_ = std::move(grown);
    }
    return id;
}

void append_json_string(std::string_view s, std::string& out) {
    static const char* hex = "0123456789abcdef";
    out.push_back('"');
    for (char ch : s) {
        auto c = static_cast<unsigned char>(ch);
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            default:
                if (c < 0x20) {
                    out += "\\u00";
                    out.push_back(hex[c >> 4]);
                    out.push_back(hex[c & 15]);
                } else {
                    out.push_back(ch);
                }
        }
    }
    out.push_back('"');
}

void render_json(const Document& doc, const JNode& node, std::string& out) {
    switch (node.type) {
        case JType::Null: out += "null"; return;
        case JType::True: out += "true"; return;
        case JType::False: out += "false"; return;
        case JType::Int: {
            char digits[24];
            out.append(digits, std::to_chars(digits, digits + sizeof digits, node.i).ptr);
            return;
        }
        case JType::BigInt:
        case JType::Num: out.append(node.s, node.len); return;
        case JType::Str: append_json_string(node.str(), out); return;
        case JType::Arr:
            out.push_back('[');
            for (const JNode* c = doc.first(node); c; c = doc.next(c)) {
                if (c != doc.first(node)) out.push_back(',');
                render_json(doc, *c, out);
            }
            out.push_back(']');
            return;
        case JType::Obj: {
            // Python dict semantics: first position of a key, last value.
            out.push_back('{');
            std::unordered_map<KeyId, const JNode*> last;
            for (const JNode* c = doc.first(node); c; c = doc.next(c)) last[c->key] = c;
            bool first = true;
            for (const JNode* c = doc.first(node); c; c = doc.next(c)) {
                auto it = last.find(c->key);
                if (it == last.end()) continue;  // key already emitted
                if (!first) out.push_back(',');
                first = false;
                append_json_string(doc.key(*c), out);
                out.push_back(':');
                render_json(doc, *it->second, out);
                last.erase(it);
            }
            out.push_back('}');
            return;
        }
    }
}

namespace {

// The double nearest a decimal number literal whose digits (at most 15 significant, so below
// 2^53: exact as a double) times a power of ten within 10^+-22 (exact as a double) it is: one
// correctly rounded multiplication or division gives the correctly rounded result, as from_chars
// would (Clinger's fast path). False where the text is not such a number.
bool exact_decimal(const char* p, size_t len, double& out) {
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD == 0
    static constexpr double kPowers[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                         1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    const char* const end = p + len;
    const bool neg = p < end && *p == '-';
    if (neg) ++p;
    uint64_t digits = 0;
    int significant = 0, exp10 = 0;
    bool any = false, dot = false;
    for (; p < end; ++p) {
        const char c = *p;
        if (c >= '0' && c <= '9') {
            any = true;
            if (digits || c != '0') {
                if (++significant > 15) return false;
                digits = digits * 10 + static_cast<unsigned>(c - '0');
            }
            if (dot) --exp10;
        } else if (c == '.' && !dot) {
            dot = true;
        } else {
            break;
        }
    }
    if (!any) return false;
    if (p < end) {  // an exponent: 'e' or 'E', a sign, at most 3 digits
        if (*p != 'e' && *p != 'E') return false;
        ++p;
        bool eneg = false;
        if (p < end && (*p == '+' || *p == '-')) eneg = *p++ == '-';
        if (p == end || end - p > 3) return false;
        int e = 0;
        for (; p < end; ++p) {
            if (*p < '0' || *p > '9') return false;
            e = e * 10 + (*p - '0');
        }
        exp10 += eneg ? -e : e;
    }
    if (exp10 < -22 || exp10 > 22) return false;
    double v = static_cast<double>(digits);
    v = exp10 < 0 ? v / kPowers[-exp10] : v * kPowers[exp10];
    out = neg ? -v : v;
    return true;
#else
    (void)p, (void)len, (void)out;
    return false;
#endif
}

}  // namespace

bool as_double(const JNode* n, double& out) {
    if (!n) return false;
    if (n->type == JType::Int) {
        out = static_cast<double>(n->i);
        return true;
    }
    if (n->type != JType::Num && n->type != JType::BigInt) return false;
    double v;
    if (n->type == JType::Num && exact_decimal(n->s, n->len, v)) {
        out = v;  // finite by construction
        return true;
    }
    // from_chars rounds as strtod does; out-of-range text (overflow, underflow) takes strtod's
    // path so that its results (infinity, denormals, zero) decide as before
    auto [end, err] = std::from_chars(n->s, n->s + n->len, v);
    if (err != std::errc() || end != n->s + n->len) v = std::strtod(std::string(n->s, n->len).c_str(), nullptr);
    if (!std::isfinite(v)) return false;
    if (n->type == JType::BigInt && std::fabs(v) > 1e308) return false;
    out = v;
    return true;
}

const char* type_name(const JNode* n) {
    if (!n) return "null";
    switch (n->type) {
        case JType::Null: return "null";
        case JType::True:
        case JType::False: return "boolean";
        case JType::Str: return "string";
        case JType::Arr: return "array";
        case JType::Obj: return "object";
        default: return "number";
    }
}

}  // namespace otelprof
