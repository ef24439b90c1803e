#include "otelprof/names.hpp"

#include <vector>

namespace otelprof {

namespace {

// otlp/names.py: LIST_LIMIT, ARG_LIMIT, NAME_LIMIT, VISIBLE (characters), ELLIPSIS, SEPARATOR
constexpr size_t kListLimit = 64;
constexpr size_t kArgLimit = 24;
constexpr size_t kNameLimit = 128;
constexpr size_t kVisible = 32;
constexpr int kDepthLimit = 32;  // otlp/names.py: DEPTH_LIMIT (reading recurses once per level)
constexpr std::string_view kEllipsis = "\xE2\x80\xA6";       // U+2026
constexpr std::string_view kSeparator = " \xC2\xB7 ";        // U+00B7 between spaces
constexpr std::string_view kAnonymous = "(anonymous namespace)::";
// otlp/names.py: _NOISE, _CALLABLE, _PLATFORM, _PLATFORM_MORE, _BUILTIN (lowercase ASCII)
constexpr std::string_view kNoise[] = {"kernel", "functor", "cuda", "impl"};
constexpr std::string_view kCallable[] = {"functor", "op", "ops"};
constexpr std::string_view kPlatform[] = {"kepler", "maxwell", "pascal", "volta", "turing", "ampere",
                                          "ada", "hopper", "blackwell", "cutlass", "cudnn", "cublas",
                                          "cublaslt", "cask", "xmma", "tensorop"};
constexpr std::string_view kPlatformMore[] = {"infer", "train"};
constexpr std::string_view kBuiltin[] = {"void", "bool", "char", "wchar_t", "char8_t", "char16_t", "char32_t",
                                         "short", "int", "long", "signed", "unsigned", "float", "double",
                                         "auto", "const", "volatile", "true", "false", "nullptr", "decltype"};

struct Unbalanced {};

bool is_open(char c) { return c == '<' || c == '(' || c == '[' || c == '{'; }
bool is_close(char c) { return c == '>' || c == ')' || c == ']' || c == '}'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_upper(char c) { return c >= 'A' && c <= 'Z'; }
bool is_lower(char c) { return c >= 'a' && c <= 'z'; }
bool is_alnum(char c) { return is_digit(c) || is_upper(c) || is_lower(c); }

template <size_t N>
bool in(const std::string_view (&set)[N], std::string_view word) {
    for (std::string_view w : set)
        if (w == word) return true;
    return false;
}

// ASCII lowercase of a short word into `buf` (longer words match no set: returned empty).
std::string_view lower(std::string_view s, char (&buf)[16]) {
    if (s.size() > sizeof buf) return {};
    for (size_t k = 0; k < s.size(); ++k) buf[k] = is_upper(s[k]) ? static_cast<char>(s[k] + 32) : s[k];
    return std::string_view(buf, s.size());
}

// Characters (code points) of UTF-8 text.
size_t chars(std::string_view s) {
    size_t n = 0;
    for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    return n;
}

bool ends_with_at(std::string_view s, size_t i, std::string_view suffix) {
    return i >= suffix.size() && s.substr(i - suffix.size(), suffix.size()) == suffix;
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

std::string_view strip(std::string_view s) {
    // Python's str.strip() on the ASCII whitespace demanglers write
    auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
    while (!s.empty() && space(s.front())) s.remove_prefix(1);
    while (!s.empty() && space(s.back())) s.remove_suffix(1);
    return s;
}

size_t close_of(std::string_view s, size_t i) {
    int depth = 0;
    for (size_t j = i; j < s.size(); ++j) {
        if (is_open(s[j])) {
            ++depth;
        } else if (is_close(s[j])) {
            if (--depth == 0) return j;
        }
    }
    throw Unbalanced{};
}

bool is_call_operator(std::string_view s, size_t i) { return ends_with_at(s, i, "operator") && i + 1 < s.size() && s[i + 1] == ')'; }
bool is_decltype(std::string_view s, size_t i) { return ends_with_at(s, i, "decltype"); }

// Index of the first `sep` at or after `start` outside brackets, or npos.
size_t separator(std::string_view s, size_t start, std::string_view sep) {
    size_t i = start;
    while (i < s.size()) {
        if (is_open(s[i])) {
            i = close_of(s, i) + 1;
            continue;
        }
        if (s.substr(i, sep.size()) == sep) return i;
        ++i;
    }
    return std::string_view::npos;
}

// `s` split at `sep` outside brackets.
std::vector<std::string_view> split(std::string_view s, std::string_view sep) {
    std::vector<std::string_view> parts;
    size_t start = 0;
    for (size_t end; (end = separator(s, start, sep)) != std::string_view::npos; start = end + sep.size())
        parts.push_back(s.substr(start, end - start));
    parts.push_back(s.substr(start));
    return parts;
}

// Index of the first '(' outside brackets that is neither operator()'s nor decltype('s, or npos.
size_t function_paren(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        const char c = s[i];
        if (c == '(' && is_call_operator(s, i)) {
            i += 2;
            continue;
        }
        if (c == '(' && !is_decltype(s, i)) return i;
        if (is_open(c)) {
            i = close_of(s, i) + 1;
            continue;
        }
        ++i;
    }
    return std::string_view::npos;
}

// Calls f(start, end) for each word of an identifier (otlp/names.py: _words).
template <class F>
void for_each_word(std::string_view s, F&& f) {
    const size_t n = s.size();
    size_t i = 0;
    while (i < n) {
        if (!is_alnum(s[i])) {
            ++i;
            continue;
        }
        size_t j = i + 1;
        while (j < n && is_alnum(s[j])) {
            const char a = s[j - 1], b = s[j];
            if ((is_lower(a) && is_upper(b)) || (is_upper(a) && is_upper(b) && j + 1 < n && is_lower(s[j + 1])) ||
                is_digit(a) != is_digit(b))
                break;
            ++j;
        }
        f(i, j);
        i = j;
    }
}

template <size_t N>
bool has_word(std::string_view s, const std::string_view (&set)[N]) {
    bool found = false;
    char buf[16];
    for_each_word(s, [&](size_t a, size_t b) { found = found || in(set, lower(s.substr(a, b - a), buf)); });
    return found;
}

// Without its noise words, each with an '_' that would be left dangling (names.py: _strip_noise).
std::string strip_noise(std::string_view h) {
    std::vector<std::pair<size_t, size_t>> noise;
    char buf[16];
    for_each_word(h, [&](size_t a, size_t b) {
        if (in(kNoise, lower(h.substr(a, b - a), buf))) noise.emplace_back(a, b);
    });
    std::string out(h);
    for (auto it = noise.rbegin(); it != noise.rend(); ++it) {
        size_t a = it->first, b = it->second;
        const bool left_none = a == 0, right_none = b >= out.size();
        const bool left_sep = !left_none && out[a - 1] == '_', right_sep = !right_none && out[b] == '_';
        if (left_sep && (right_sep || right_none)) {
            --a;
        } else if (left_none && right_sep) {
            ++b;
        }
        out.erase(a, b - a);
    }
    for (char c : out)
        if (is_upper(c) || is_lower(c)) return out;
    return std::string(h);
}

// Only noise words and numbers (Kernel, Kernel2).
bool is_generic(std::string_view h) {
    bool noise = false, other = false;
    char buf[16];
    for_each_word(h, [&](size_t a, size_t b) {
        const std::string_view w = h.substr(a, b - a);
        if (in(kNoise, lower(w, buf))) {
            noise = true;
        } else if (!is_digit(w[0])) {
            other = true;
        }
    });
    return noise && !other;
}

bool is_name(std::string_view h) {
    if (h.empty() || !(is_upper(h[0]) || is_lower(h[0]) || h[0] == '_')) return false;
    size_t end = 0;
    while (end < h.size() && (is_alnum(h[end]) || h[end] == '_')) ++end;
    return !in(kBuiltin, h.substr(0, end));
}

bool is_platform(std::string_view t) {
    char buf[16];
    if (in(kPlatform, lower(t, buf))) return true;
    for (std::string_view prefix : {std::string_view("sm"), std::string_view("gfx")}) {
        if (t.size() <= prefix.size() || !is_digit(t[prefix.size()])) continue;
        bool ok = true;
        for (size_t k = 0; k < t.size(); ++k) {
            const char c = k < prefix.size() && is_upper(t[k]) ? static_cast<char>(t[k] + 32) : t[k];
            ok = ok && (k < prefix.size() ? c == prefix[k] : is_alnum(c));
        }
        if (ok) return true;
    }
    return false;
}

// The start of each '_'-separated token of `h`.
std::vector<size_t> token_starts(std::string_view h) {
    std::vector<size_t> starts{0};
    for (size_t i = 0; i < h.size(); ++i)
        if (h[i] == '_') starts.push_back(i + 1);
    return starts;
}

std::string_view token(std::string_view h, const std::vector<size_t>& starts, size_t k) {
    const size_t end = k + 1 < starts.size() ? starts[k + 1] - 1 : h.size();
    return h.substr(starts[k], end - starts[k]);
}

// (h without its leading platform words, those words) (names.py: _platform_split).
std::pair<std::string_view, std::string_view> platform_split(std::string_view h) {
    const std::vector<size_t> starts = token_starts(h);
    const size_t n = starts.size();
    if (n < 2 || !is_platform(token(h, starts, 0))) return {h, {}};
    size_t k = 1;
    char buf[16];
    while (k < n - 1) {
        const std::string_view t = token(h, starts, k);
        bool digits = !t.empty();
        for (char c : t) digits = digits && is_digit(c);
        if (!(is_platform(t) || in(kPlatformMore, lower(t, buf)) || digits)) break;
        ++k;
    }
    if (starts[k] == h.size()) return {h, {}};  // nothing left
    return {h.substr(starts[k]), h.substr(0, starts[k] - 1)};
}

bool is_tile(std::string_view t) {
    for (size_t i = 1; i + 1 < t.size(); ++i)
        if (t[i] == 'x' && is_digit(t[i - 1]) && is_digit(t[i + 1])) return true;
    return false;
}

// `h` with its first tile token moved to end within kVisible characters (names.py: _tile_forward).
std::string tile_forward(std::string h) {
    const std::vector<size_t> starts = token_starts(h);
    const size_t n = starts.size();
    size_t t = 0;
    while (t < n && !is_tile(token(h, starts, t))) ++t;
    if (t == n || t == 0) return h;
    const std::string_view tile = token(h, starts, t);
    const size_t tile_end = starts[t] + tile.size();
    if (chars(std::string_view(h).substr(0, tile_end)) <= kVisible) return h;
    const size_t tile_chars = chars(tile);
    size_t k = t - 1;
    while (k > 1 && chars(std::string_view(h).substr(0, starts[k] - 1)) + 1 + tile_chars > kVisible) --k;
    std::string out(std::string_view(h).substr(0, starts[k]));
    out.append(tile);
    out += '_';
    out.append(std::string_view(h).substr(starts[k], starts[t] - starts[k]));  // tokens k..t-1 and an '_'
    if (tile_end < h.size()) {
        out.append(std::string_view(h).substr(tile_end + 1));
    } else {
        out.pop_back();  // the tile was the last token
    }
    return out;
}

// head<args>tail: a name and its template arguments (names.py: _Node), in an arena; children
// and lambda parameters are chains of sibling indices.
struct Node {
    std::string_view head, tail;
    int first = -1;   // first template argument
    int next = -1;    // next sibling
    int params = -1;  // first parameter type of the lambda a local entity stands for
    bool list = false, local = false, gone = false;
};

class Folder {
public:
    std::string fold(std::string_view s);

private:
    std::vector<Node> nodes_;

    int add(std::string_view head, std::string_view tail) {
        nodes_.push_back(Node{head, tail});
        return static_cast<int>(nodes_.size()) - 1;
    }
    int parse(std::string_view t);
    int parse_args(std::string_view inner);
    int parse_arg(std::string_view a);
    int lambda_params(std::string_view seg);
    bool is_callable(int n);
    int find_callable(int n);
    void render(int n, bool nested, std::string_view head, bool params, std::string& out);
    void list_text(int first, std::string& out);
    void lists(std::string_view s, bool nested, std::string& out);
};

int Folder::parse(std::string_view t) {
    size_t i = 0;
    while (i < t.size()) {
        const char c = t[i];
        if (is_open(c)) {
            const size_t j = close_of(t, i);
            if (c == '<') {
                const int args = parse_args(t.substr(i + 1, j - i - 1));
                const int n = add(t.substr(0, i), t.substr(j + 1));
                nodes_[n].first = args;
                nodes_[n].list = true;
                return n;
            }
            i = j + 1;
            continue;
        }
        ++i;
    }
    return add(t, {});
}

int Folder::parse_args(std::string_view inner) {
    int first = -1, last = -1;
    size_t start = 0;
    for (;;) {
        const size_t end = separator(inner, start, ",");
        const int n = parse_arg(inner.substr(start, end == std::string_view::npos ? end : end - start));
        (last < 0 ? first : nodes_[last].next) = n;
        last = n;
        if (end == std::string_view::npos) return first;
        start = end + 1;
    }
}

int Folder::parse_arg(std::string_view a) {
    // the segments of split(a, "::") one at a time, without a vector of them
    const std::string_view whole = strip(a);
    std::string_view chosen, prev;
    bool local = false;
    size_t start = 0;
    for (;;) {
        const size_t end = separator(whole, start, "::");
        const std::string_view seg = whole.substr(start, end == std::string_view::npos ? end : end - start);
        const size_t p = function_paren(seg);
        if (p != std::string_view::npos && p > 0) {  // a function: what follows is local to it (a lambda)
            chosen = seg.substr(0, p);
            local = true;
            if (chosen == "operator()" && start > 0) chosen = prev;
            break;
        }
        if (end == std::string_view::npos) {
            chosen = seg;
            break;
        }
        prev = seg;
        start = end + 2;
    }
    chosen = strip(chosen);
    if (starts_with(chosen, "(")) chosen = strip(chosen.substr(close_of(chosen, 0) + 1));  // a cast
    const int n = parse(chosen);
    if (local) {
        for (size_t end; (end = separator(whole, start, "::")) != std::string_view::npos;) start = end + 2;
        const int params = lambda_params(strip(whole.substr(start)));  // the last segment
        nodes_[n].local = true;
        nodes_[n].params = params;
    }
    return n;
}

int Folder::lambda_params(std::string_view seg) {
    if (!starts_with(seg, "{lambda(") && !starts_with(seg, "[lambda(")) return -1;
    const std::string_view inner = seg.substr(8, close_of(seg, 7) - 8);
    return strip(inner).empty() ? -1 : parse_args(inner);
}

bool Folder::is_callable(int n) { return nodes_[n].local || has_word(nodes_[n].head, kCallable); }

int Folder::find_callable(int n) {
    for (int a = nodes_[n].first; a >= 0; a = nodes_[a].next) {
        if (is_callable(a)) return a;
        const int found = find_callable(a);
        if (found >= 0) return found;
    }
    return -1;
}

void Folder::render(int n, bool nested, std::string_view head, bool params, std::string& out) {
    // by index: rendering a tail parses its lists into the arena, which may move
    out.append(head);
    if (nodes_[n].list) {
        bool kept = false;
        for (int a = nodes_[n].first; a >= 0 && !kept; a = nodes_[a].next) kept = !nodes_[a].gone;
        if (kept && nested) {
            list_text(nodes_[n].first, out);
        } else if (kept) {
            out += '<';
            out.append(kEllipsis);
            out += '>';
        }
    }
    lists(nodes_[n].tail, nested, out);
    if (!params || nodes_[n].params < 0) return;
    std::string inner;
    for (int p = nodes_[n].params; p >= 0; p = nodes_[p].next) {
        if (p != nodes_[n].params) inner += ", ";
        render(p, true, nodes_[p].head, false, inner);
    }
    out += '(';
    if (chars(inner) <= kListLimit) {
        out += inner;
    } else {
        out.append(kEllipsis);
    }
    out += ')';
}

void Folder::list_text(int first, std::string& out) {
    // written in place; only a list over the limit is written again
    const size_t mark = out.size();
    out += '<';
    bool any = false;
    for (int a = first; a >= 0; a = nodes_[a].next) {
        if (nodes_[a].gone) continue;
        if (any) out += ", ";
        any = true;
        render(a, true, nodes_[a].head, false, out);
    }
    if (chars(std::string_view(out).substr(mark + 1)) <= kListLimit) {
        out += '>';
        return;
    }
    out.resize(mark + 1);
    std::string one;
    any = false;
    for (int a = first; a >= 0; a = nodes_[a].next) {
        if (nodes_[a].gone) continue;
        one.clear();
        render(a, true, nodes_[a].head, false, one);
        if (chars(one) > kArgLimit) {
            one.clear();
            render(a, false, nodes_[a].head, false, one);
        }
        if (any) out += ", ";
        any = true;
        out += one;
    }
    if (chars(std::string_view(out).substr(mark + 1)) > kListLimit) {
        out.resize(mark + 1);
        out.append(kEllipsis);
    }
    out += '>';
}

void Folder::lists(std::string_view s, bool nested, std::string& out) {
    size_t i = 0;
    while (i < s.size()) {
        const char c = s[i];
        if (is_open(c)) {
            const size_t j = close_of(s, i);
            if (c != '<') {
                out.append(s.substr(i, j - i + 1));
            } else if (nested) {
                list_text(parse_args(s.substr(i + 1, j - i - 1)), out);
            } else {
                out += '<';
                out.append(kEllipsis);
                out += '>';
            }
            i = j + 1;
            continue;
        }
        out += c;
        ++i;
    }
}

std::string Folder::fold(std::string_view s) {
    nodes_.reserve(64);
    std::string_view core = s;
    const size_t p = function_paren(s);
    if (p != std::string_view::npos) {  // the parameter list and the return type go
        size_t start = 0, i = 0;
        while (i < p) {
            const char c = s[i];
            if (is_open(c)) {
                i = close_of(s, i) + 1;
                continue;
            }
            if (c == ' ') start = i + 1;
            ++i;
        }
        core = s.substr(start, p - start);
    }
    const std::vector<std::string_view> segments = split(core, "::");
    const int fn = parse(segments.back());
    std::vector<int> chain;  // outermost operation first
    int op = find_callable(fn);
    if (op < 0 && nodes_[fn].list && is_generic(nodes_[fn].head) && is_name(nodes_[nodes_[fn].first].head))
        op = nodes_[fn].first;
    while (op >= 0) {
        nodes_[op].gone = true;
        chain.push_back(op);
        op = find_callable(op);
    }
    const int lead = chain.empty() ? fn : chain.back();
    std::string out;
    out.reserve(2 * kNameLimit);
    bool first = true;
    auto part = [&](int n) {
        if (!first) out.append(kSeparator);
        first = false;
        std::string_view platform;
        std::string head;
        if (n == lead) {
            const auto [rest, words] = platform_split(nodes_[n].head);
            platform = words;
            head = tile_forward(strip_noise(rest));
        } else {
            head = strip_noise(nodes_[n].head);
        }
        render(n, true, head, n == lead && n != fn, out);
        if (!platform.empty()) {
            out.append(kSeparator);
            out.append(platform);
        }
    };
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) part(*it);
    part(fn);
    if (segments.size() > 1) {
        out.append(kSeparator);
        lists(core.substr(0, core.size() - segments.back().size() - 2), true, out);
    }
    return out;
}

std::string demangled_prefix(std::string_view s) {
    size_t i = 2;
    const bool nested = s.size() > i && s[i] == 'N';
    if (nested) {
        ++i;
        while (i < s.size() && std::string_view("rVKRO").find(s[i]) != std::string_view::npos) ++i;
    }
    auto digit = [&](size_t k) { return k < s.size() && s[k] >= '0' && s[k] <= '9'; };
    std::string name;
    bool any = false;
    while (digit(i)) {
        size_t j = i;
        uint64_t n = 0;
        while (digit(j)) {
            n = n * 10 + static_cast<uint64_t>(s[j] - '0');
            if (n > s.size()) return std::string(s);  // longer than the rest: as Python's int would fail the check below
            ++j;
        }
        if (n == 0 || j + n > s.size()) return std::string(s);
        const std::string_view ident = s.substr(j, n);
        i = j + n;
        if (!starts_with(ident, "_GLOBAL__N")) {
            if (any) name += "::";
            name.append(ident);
            any = true;
        }
        if (!nested) break;
    }
    if (!any) return std::string(s);
    if (i < s.size() && s[i] == 'I') name += "<" + std::string(kEllipsis) + ">";
    return name;
}

std::string cap(std::string s) {
    if (chars(s) <= kNameLimit) return s;
    size_t n = 0;
    for (size_t k = 0; k < s.size(); ++k) {
        if ((static_cast<unsigned char>(s[k]) & 0xC0) != 0x80 && n++ == kNameLimit - 1) {
            s.resize(k);
            break;
        }
    }
    return s + std::string(kEllipsis);
}

}  // namespace

std::string fold_kernel_name(std::string_view name) {
    std::string s;
    s.reserve(name.size());
    for (size_t i = 0; i < name.size();) {
        if (name.substr(i, kAnonymous.size()) == kAnonymous) {
            i += kAnonymous.size();
        } else {
            s += name[i++];
        }
    }
    bool ascii = true;
    for (char c : s) ascii = ascii && (static_cast<unsigned char>(c) & 0x80) == 0;
    if (starts_with(s, "_Z") && ascii) {
        std::string demangled = demangled_prefix(s);
        if (demangled == s) return cap(std::move(s));  // not readable: only cut
        s = std::move(demangled);
    }
    int depth = 0;
    for (char c : s) {
        if (is_open(c) && ++depth > kDepthLimit) return cap(std::move(s));  // nested too deep: only cut
        if (is_close(c)) --depth;
    }
    try {
        return cap(Folder().fold(s));
    } catch (const Unbalanced&) {
        return cap(std::move(s));
    }
}

std::string device_name(int64_t device_type, bool has_id, int64_t device_id) {
    // c10::DeviceType (c10/core/DeviceType.h); otlp/names.py: DEVICE_TYPES
    static constexpr std::string_view kTypes[] = {
        "cpu", "cuda", "mkldnn", "opengl", "opencl", "ideep", "hip", "fpga", "maia", "xla", "vulkan",
        "metal", "xpu", "mps", "meta", "hpu", "ve", "lazy", "ipu", "mtia", "privateuseone",
    };
    constexpr int64_t count = sizeof(kTypes) / sizeof(kTypes[0]);
    if (device_type < 0 || device_type >= count) return {};
    std::string out(kTypes[device_type]);
    if (device_type == 0 || !has_id || device_id < 0) return out;
    return out + ":" + std::to_string(device_id);
}

std::string hex_address(int64_t v) {
    // as "0x%" PRIx64 writes it, without printf (a large trace has tens of thousands)
    static const char digits[] = "0123456789abcdef";
    char buf[18];
    char* p = buf + sizeof buf;
    uint64_t u = static_cast<uint64_t>(v);
    do {
        *--p = digits[u & 0xF];
        u >>= 4;
    } while (u);
    *--p = 'x';
    *--p = '0';
    return std::string(p, static_cast<size_t>(buf + sizeof buf - p));
}

}  // namespace otelprof
