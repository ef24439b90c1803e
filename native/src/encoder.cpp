#include "otelprof/encoder.hpp"

#include <cstring>

namespace otelprof {

namespace {

// Field tags: (number << 3) | wire type. 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32.
constexpr uint8_t tag(int number, int wire) { return static_cast<uint8_t>((number << 3) | wire); }

size_t varint_len(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        ++n;
    }
    return n;
}

void put_varint(std::string& out, uint64_t v) {
    while (v >= 0x80) {
        out.push_back(static_cast<char>((v & 0x7F) | 0x80));
        v >>= 7;
    }
    out.push_back(static_cast<char>(v));
}

void put_fixed64(std::string& out, uint64_t v) {
    char b[8];
    for (int k = 0; k < 8; ++k) b[k] = static_cast<char>((v >> (8 * k)) & 0xFF);
    out.append(b, 8);
}

void put_bytes(std::string& out, int field, const void* data, size_t len) {
    out.push_back(static_cast<char>(tag(field, 2)));
    put_varint(out, len);
    out.append(static_cast<const char*>(data), len);
}

// A length-delimited field whose body is written by `body` into `out` (length patched after).
template <typename F>
void put_message(std::string& out, int field, F&& body) {
    out.push_back(static_cast<char>(tag(field, 2)));
    size_t len_pos = out.size();
    out.push_back('\0');  // 1-byte length placeholder
    size_t start = out.size();
    body();
    size_t len = out.size() - start;
    size_t need = varint_len(len);
    if (need > 1) out.insert(len_pos + 1, need - 1, '\0');
    std::string lenbuf;
    put_varint(lenbuf, len);
    std::memcpy(&out[len_pos], lenbuf.data(), need);
}

void put_any_value(std::string& out, const AttrValue& v) {
    switch (v.type) {
        case AttrValue::Type::Str: put_bytes(out, 1, v.s.data(), v.s.size()); break;
        case AttrValue::Type::Bool:
            out.push_back(static_cast<char>(tag(2, 0)));
            put_varint(out, v.i ? 1 : 0);
            break;
        case AttrValue::Type::Int:
            out.push_back(static_cast<char>(tag(3, 0)));
            put_varint(out, static_cast<uint64_t>(v.i));
            break;
        case AttrValue::Type::Double: {
            out.push_back(static_cast<char>(tag(4, 1)));
            uint64_t bits;
            std::memcpy(&bits, &v.d, 8);
            put_fixed64(out, bits);
            break;
        }
    }
}

void put_attributes(std::string& out, int field, const Attrs& attrs) {
    for (const auto& [key, value] : attrs) {
        put_message(out, field, [&] {
            if (!key.empty()) put_bytes(out, 1, key.data(), key.size());
            put_message(out, 2, [&] { put_any_value(out, value); });
        });
    }
}

void put_span(std::string& out, const Span& sp) {
    put_bytes(out, 1, sp.trace_id.data(), 16);
    put_bytes(out, 2, sp.span_id.data(), 8);
    if (sp.has_parent) put_bytes(out, 4, sp.parent_id.data(), 8);
    if (!sp.name.empty()) put_bytes(out, 5, sp.name.data(), sp.name.size());
    out.push_back(static_cast<char>(tag(6, 0)));
    out.push_back(1);  // SPAN_KIND_INTERNAL
    if (sp.start) {
        out.push_back(static_cast<char>(tag(7, 1)));
        put_fixed64(out, static_cast<uint64_t>(sp.start));
    }
    if (sp.end) {
        out.push_back(static_cast<char>(tag(8, 1)));
        put_fixed64(out, static_cast<uint64_t>(sp.end));
    }
    put_attributes(out, 9, sp.attrs);
    for (const SpanEvent& e : sp.events) {
        put_message(out, 11, [&] {
            if (e.ts) {
                out.push_back(static_cast<char>(tag(1, 1)));
                put_fixed64(out, static_cast<uint64_t>(e.ts));
            }
            put_bytes(out, 2, "pytorch.memory", 14);
            put_attributes(out, 3, e.attrs);
        });
    }
    if (sp.dropped_events) {
        out.push_back(static_cast<char>(tag(12, 0)));
        put_varint(out, sp.dropped_events);
    }
    for (const SpanLink& l : sp.links) {
        put_message(out, 13, [&] {
            put_bytes(out, 1, l.trace_id.data(), 16);
            put_bytes(out, 2, l.span_id.data(), 8);
            Attrs kind{{"otelprof.link.kind", AttrValue::str(l.kind)}};
            put_attributes(out, 4, kind);
        });
    }
    if (sp.dropped_links) {
        out.push_back(static_cast<char>(tag(14, 0)));
        put_varint(out, sp.dropped_links);
    }
}

size_t field_len(size_t n) { return 1 + varint_len(n) + n; }

}  // namespace

std::vector<std::string> encode_requests(const Built& built, const std::string& scope_version, size_t max_bytes) {
    std::string resource, scope;
    put_attributes(resource, 1, built.resource);
    put_bytes(scope, 1, "otelprof", 8);
    if (!scope_version.empty()) put_bytes(scope, 2, scope_version.data(), scope_version.size());

    std::vector<std::string> requests;
    std::string body;  // the ScopeSpans.spans fields of the current batch
    size_t count = 0;
    auto size_with = [&](size_t extra) {
        size_t scope_spans = field_len(scope.size()) + body.size() + extra;
        size_t resource_spans = field_len(resource.size()) + field_len(scope_spans);
        return field_len(resource_spans);
    };
    auto flush = [&] {
        std::string req;
        req.reserve(body.size() + resource.size() + scope.size() + 32);
        put_message(req, 1, [&] {                                    // ResourceSpans
            put_message(req, 1, [&] { req += resource; });           // Resource
            put_message(req, 2, [&] {                                // ScopeSpans
                put_message(req, 1, [&] { req += scope; });          // InstrumentationScope
                req += body;
            });
        });
        requests.push_back(std::move(req));
        body.clear();
        count = 0;
    };
    std::string span_buf;
    for (const Span& sp : built.spans) {
        span_buf.clear();
        put_span(span_buf, sp);
        size_t extra = field_len(span_buf.size());
        if (count && size_with(extra) > max_bytes) flush();
        body.push_back(static_cast<char>(tag(2, 2)));
        put_varint(body, span_buf.size());
        body += span_buf;
        ++count;
    }
    if (count) flush();
    return requests;
}

}  // namespace otelprof
