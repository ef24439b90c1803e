#include "otelprof/names.hpp"

#include <vector>

namespace otelprof {

namespace {

// otlp/names.py: LIST_LIMIT, ARG_LIMIT, NAME_LIMIT (characters), ELLIPSIS
constexpr size_t kListLimit = 64;
constexpr size_t kArgLimit = 24;
constexpr size_t kNameLimit = 128;
constexpr std::string_view kEllipsis = "\xE2\x80\xA6";  // U+2026
constexpr std::string_view kAnonymous = "(anonymous namespace)::";

struct Unbalanced {};

bool is_open(char c) { return c == '<' || c == '(' || c == '[' || c == '{'; }
bool is_close(char c) { return c == '>' || c == ')' || c == ']' || c == '}'; }

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

std::vector<std::string_view> split(std::string_view s, std::string_view sep) {
    std::vector<std::string_view> parts;
    size_t start = 0, i = 0;
    while (i < s.size()) {
        if (is_open(s[i])) {
            i = close_of(s, i) + 1;
            continue;
        }
        if (s.substr(i, sep.size()) == sep) {
            parts.push_back(s.substr(start, i - start));
            i += sep.size();
            start = i;
            continue;
        }
        ++i;
    }
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

std::string lists(std::string_view s, bool nested);

std::string arg(std::string_view a, bool nested) {
    const std::vector<std::string_view> segments = split(strip(a), "::");
    std::string_view chosen = segments.back();
    for (size_t k = 0; k < segments.size(); ++k) {
        const std::string_view seg = segments[k];
        const size_t p = function_paren(seg);
        if (p != std::string_view::npos && p > 0) {
            chosen = seg.substr(0, p);
            if (chosen == "operator()" && k > 0) chosen = segments[k - 1];
            break;
        }
    }
    chosen = strip(chosen);
    if (starts_with(chosen, "(")) chosen = strip(chosen.substr(close_of(chosen, 0) + 1));
    return lists(chosen, nested);
}

std::string list(std::string_view inner) {
    const std::vector<std::string_view> args = split(inner, ",");
    std::vector<std::string> full;
    full.reserve(args.size());
    for (std::string_view a : args) full.push_back(arg(a, true));
    auto join = [](const std::vector<std::string>& parts) {
        std::string text;
        for (size_t k = 0; k < parts.size(); ++k) {
            if (k) text += ", ";
            text += parts[k];
        }
        return text;
    };
    std::string text = join(full);
    if (chars(text) <= kListLimit) return "<" + text + ">";
    std::vector<std::string> shorter;
    shorter.reserve(args.size());
    for (size_t k = 0; k < args.size(); ++k) shorter.push_back(chars(full[k]) <= kArgLimit ? full[k] : arg(args[k], false));
    text = join(shorter);
    if (chars(text) <= kListLimit) return "<" + text + ">";
    return "<" + std::string(kEllipsis) + ">";
}

std::string lists(std::string_view s, bool nested) {
    std::string out;
    size_t i = 0;
    while (i < s.size()) {
        const char c = s[i];
        if (is_open(c)) {
            const size_t j = close_of(s, i);
            if (c == '<') out += nested ? list(s.substr(i + 1, j - i - 1)) : "<" + std::string(kEllipsis) + ">";
            else out.append(s.substr(i, j - i + 1));
            i = j + 1;
            continue;
        }
        out += c;
        ++i;
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
    if (starts_with(s, "_Z") && ascii) return cap(demangled_prefix(s));
    try {
        std::string_view core = s;
        const size_t p = function_paren(s);
        if (p != std::string_view::npos) {
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
            core = std::string_view(s).substr(start, p - start);
        }
        return cap(lists(core, true));
    } catch (const Unbalanced&) {
        return cap(s);
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
