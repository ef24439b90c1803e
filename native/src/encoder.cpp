#include "otelprof/encoder.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>

#include "otelprof/beside.hpp"

namespace otelprof {

namespace {

// Names the encoder writes itself (docs/semantic-conventions.md); sizes below derive from them.
constexpr std::string_view kMemoryEventName = "otelprof.memory";
constexpr std::string_view kLinkKindKey = "otelprof.link.kind";

// Field tags: (number << 3) | wire type. 0 varint, 1 fixed64, 2 length-delimited.
constexpr uint8_t tag(int number, int wire) { return static_cast<uint8_t>((number << 3) | wire); }

size_t varint_len(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        ++n;
    }
    return n;
}

size_t field_len(size_t n) { return 1 + varint_len(n) + n; }

char* put_varint(char* p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = static_cast<char>((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *p++ = static_cast<char>(v);
    return p;
}

char* put_fixed64(char* p, uint64_t v) {
    for (int k = 0; k < 8; ++k) p[k] = static_cast<char>((v >> (8 * k)) & 0xFF);
    return p + 8;
}

// Copies n bytes; short strings (most here) without a call to memcpy, in two overlapping words.
char* put_bytes(char* p, const char* s, size_t n) {
    auto copy_word = [&](size_t at, auto word) {
        std::memcpy(&word, s + at, sizeof word);
        std::memcpy(p + at, &word, sizeof word);
    };
    if (n > 16) {
        std::memcpy(p, s, n);
    } else if (n >= 8) {
        copy_word(0, uint64_t{});
        copy_word(n - 8, uint64_t{});
    } else if (n >= 4) {
        copy_word(0, uint32_t{});
        copy_word(n - 4, uint32_t{});
    } else {
        for (size_t k = 0; k < n; ++k) p[k] = s[k];
    }
    return p + n;
}

// KeyValue.key of every AttrKey, encoded once; written whole (a fixed-size copy), then the
// write position advances by `size`.
struct KeyField {
    static constexpr size_t kMax = 64;
    size_t size;
    char bytes[kMax];
};

KeyField key_field(std::string_view name) {
    KeyField f;
    char* end = put_varint(f.bytes + 1, name.size());
    f.bytes[0] = static_cast<char>(tag(1, 2));
    if (end - f.bytes + name.size() > KeyField::kMax) throw std::logic_error("attribute key too long");
    end = put_bytes(end, name.data(), name.size());
    f.size = static_cast<size_t>(end - f.bytes);
    return f;
}

const std::vector<KeyField>& key_fields() {
    static const std::vector<KeyField> table = [] {
        std::vector<KeyField> fields;
        fields.reserve(key_count());
        for (size_t k = 0; k < key_count(); ++k) fields.push_back(key_field(key_name(static_cast<AttrKey>(k))));
        return fields;
    }();
    return table;
}

// Size of an AnyValue message holding `v`.
size_t any_value_len(const AttrValue& v) {
    switch (v.type) {
        case AttrValue::Type::Str: return field_len(v.len);
        case AttrValue::Type::Bool: return 2;
        case AttrValue::Type::Int: return 1 + varint_len(static_cast<uint64_t>(v.i));
        case AttrValue::Type::Double: return 9;
    }
    return 0;
}

// Append-only byte buffer with amortised growth and unchecked writes after ensure(). Its own
// (malloc) storage, or a RequestStore's buffer (use_store): written there, a request is not copied.
class Buf {
  public:
    Buf() = default;
    Buf(const Buf&) = delete;
    Buf& operator=(const Buf&) = delete;
    ~Buf() {
        if (!store_) std::free(data_);
    }

    size_t size() const { return len_; }
    std::string take() {
        std::string out(data_, len_);
        len_ = 0;
        return out;
    }
    const char* data() const { return data_; }
    char* begin() { return data_; }
    // From now on, reset() opens `store`'s buffers (before anything is written).
    void use_store(RequestStore& store) { store_ = &store; }
    // Starts over with room for `capacity` bytes, the first `skip` of them left unwritten.
    void reset(size_t capacity, size_t skip) {
        if (store_) {
            data_ = store_->open(capacity);
            store_cap_ = capacity;
            cap_ = 0;
            ready(std::min(capacity, skip + kReadyStep));
        } else {
            std::free(data_);
            data_ = static_cast<char*>(std::malloc(capacity));
            if (!data_) throw std::bad_alloc();
            cap_ = capacity;
        }
        len_ = skip;
    }
    // The store's buffer holds the request, its first `size` bytes: it goes to the store.
    void close(size_t size) {
        store_->close(data_, size);
        detach();
    }
    // The store's buffer stays open, to be closed later (by begin()); the Buf lets go of it.
    void detach() {
        data_ = nullptr;
        cap_ = store_cap_ = len_ = 0;
    }
    // The bytes written, in an allocation cut to their size (realloc shrinks in place): many
    // small requests must not each keep a batch's spare room.
    Bytes release() {
        if (char* fitted = static_cast<char*>(std::realloc(data_, std::max<size_t>(len_, 1)))) data_ = fitted;
        Bytes out(data_);
        data_ = nullptr;
        cap_ = len_ = 0;
        return out;
    }
    void truncate(size_t n) { len_ = n; }
    // Marks the bytes written up to p (from ensure()) as part of the buffer.
    void advance_to(const char* p) { len_ = static_cast<size_t>(p - data_); }

    // Room for n more bytes (uninitialised: every byte is written before it is read).
    char* ensure(size_t n) {
        if (len_ + n > cap_) grow(len_ + n);
        return data_ + len_;
    }
    void byte(uint8_t b) {
        *ensure(1) = static_cast<char>(b);
        ++len_;
    }
    void varint(uint64_t v) {
        char* p = ensure(10);
        char* start = p;
        while (v >= 0x80) {
            *p++ = static_cast<char>((v & 0x7F) | 0x80);
            v >>= 7;
        }
        *p++ = static_cast<char>(v);
        len_ += static_cast<size_t>(p - start);
    }
    void fixed64(int field, uint64_t v) {
        char* p = ensure(9);
        p[0] = static_cast<char>(tag(field, 1));
        for (int k = 0; k < 8; ++k) p[1 + k] = static_cast<char>((v >> (8 * k)) & 0xFF);
        len_ += 9;
    }
    void raw(const void* data, size_t n) {
        std::memcpy(ensure(n), data, n);
        len_ += n;
    }
    void bytes(int field, const void* data, size_t n) {
        byte(tag(field, 2));
        varint(n);
        raw(data, n);
    }
    // A length-delimited field whose body `body` writes. Its length is first given `guess` bytes
    // (1 for small messages, 2 for spans) and the body is moved only when the guess was wrong.
    template <typename F>
    void message(int field, F&& body, size_t guess = 1) {
        byte(tag(field, 2));
        size_t len_pos = len_;
        ensure(guess);
        len_ += guess;
        size_t start = len_;
        body();
        size_t n = len_ - start;
        size_t need = varint_len(n);
        if (need != guess) {
            ensure(need);  // room to shift right (shifting left needs none)
            std::memmove(data_ + len_pos + need, data_ + start, n);
            len_ = len_pos + need + n;
        }
        char* p = data_ + len_pos;
        uint64_t v = n;
        while (v >= 0x80) {
            *p++ = static_cast<char>((v & 0x7F) | 0x80);
            v >>= 7;
        }
        *p = static_cast<char>(v);
    }

  private:
    // A store's buffer is readied this much at a time as it fills (its pages faulted in together,
    // and no more of them than the request uses).
    static constexpr size_t kReadyStep = size_t{512} << 10;

    char* data_ = nullptr;
    size_t cap_ = 0;  // writable (in a store's buffer: readied)
    size_t len_ = 0;
    RequestStore* store_ = nullptr;
    size_t store_cap_ = 0;  // the store's buffer

    void ready(size_t cap) {
        store_->ready(data_ + cap_, cap - cap_);
        cap_ = cap;
    }

    __attribute__((noinline)) void grow(size_t need) {
        if (!store_) {
            const size_t cap = std::max(cap_ * 2, need + 256);
            char* grown = static_cast<char*>(std::realloc(data_, cap));
            if (!grown) throw std::bad_alloc();
            data_ = grown;
            cap_ = cap;
            return;
        }
        if (need > store_cap_) {  // a batch past the 64 MiB it was opened for
            store_cap_ = std::max(store_cap_ * 2, need + 256);
            data_ = store_->grow(data_, store_cap_);
        }
        ready(std::min(store_cap_, std::max(need, cap_ + kReadyStep)));
    }
};

void put_any_value(Buf& out, const AttrValue& v) {
    switch (v.type) {
        case AttrValue::Type::Str: out.bytes(1, v.s, v.len); break;
        case AttrValue::Type::Bool:
            out.byte(tag(2, 0));
            out.varint(v.i ? 1 : 0);
            break;
        case AttrValue::Type::Int:
            out.byte(tag(3, 0));
            out.varint(static_cast<uint64_t>(v.i));
            break;
        case AttrValue::Type::Double: {
            uint64_t bits;
            std::memcpy(&bits, &v.d, 8);
            out.fixed64(4, bits);
            break;
        }
    }
}

void put_attribute(Buf& out, int field, std::string_view key, const AttrValue& value) {
    out.message(field, [&] {
        if (!key.empty()) out.bytes(1, key.data(), key.size());
        out.message(2, [&] { put_any_value(out, value); });
    });
}

void put_attributes(Buf& out, int field, const std::vector<ResourceAttr>& attrs) {
    for (const auto& [key, value] : attrs) put_attribute(out, field, key, value);
}

// A span or span-event attribute (KeyValue, as field `field`), written in one go: its size is
// known before it is written, and its key's bytes come from key_fields().
void put_attribute(Buf& out, int field, const AttrValue& v, const std::vector<KeyField>& keys) {
    const KeyField& key = keys[v.key];
    const size_t any = any_value_len(v);
    const size_t body = key.size + 1 + varint_len(any) + any;
    char* p = out.ensure(1 + 10 + KeyField::kMax + 1 + 10 + 1 + 10 + v.len + 8);
    *p++ = static_cast<char>(tag(field, 2));
    p = put_varint(p, body);
    if (key.size <= 32) std::memcpy(p, key.bytes, 32);  // most keys: half the fixed-size copy
    else std::memcpy(p, key.bytes, KeyField::kMax);
    p += key.size;
    *p++ = static_cast<char>(tag(2, 2));
    p = put_varint(p, any);
    switch (v.type) {
        case AttrValue::Type::Str:
            *p++ = static_cast<char>(tag(1, 2));
            p = put_varint(p, v.len);
            p = put_bytes(p, v.s, v.len);
            break;
        case AttrValue::Type::Bool:
            *p++ = static_cast<char>(tag(2, 0));
            *p++ = static_cast<char>(v.i ? 1 : 0);
            break;
        case AttrValue::Type::Int:
            *p++ = static_cast<char>(tag(3, 0));
            p = put_varint(p, static_cast<uint64_t>(v.i));
            break;
        case AttrValue::Type::Double: {
            uint64_t bits;
            std::memcpy(&bits, &v.d, 8);
            *p++ = static_cast<char>(tag(4, 1));
            p = put_fixed64(p, bits);
            break;
        }
    }
    out.advance_to(p);
}

// The span's fields before its attributes, in one go.
void put_span_head(Buf& out, const Span& sp) {
    char* p = out.ensure(18 + 10 + 10 + 1 + 10 + sp.name.size() + 2 + 9 + 9);
    *p++ = static_cast<char>(tag(1, 2));
    *p++ = 16;
    std::memcpy(p, sp.trace_id.data(), 16);
    p += 16;
    *p++ = static_cast<char>(tag(2, 2));
    *p++ = 8;
    std::memcpy(p, sp.span_id.data(), 8);
    p += 8;
    if (sp.has_parent) {
        *p++ = static_cast<char>(tag(4, 2));
        *p++ = 8;
        std::memcpy(p, sp.parent_id.data(), 8);
        p += 8;
    }
    if (!sp.name.empty()) {
        *p++ = static_cast<char>(tag(5, 2));
        p = put_varint(p, sp.name.size());
        p = put_bytes(p, sp.name.data(), sp.name.size());
    }
    *p++ = static_cast<char>(tag(6, 0));
    *p++ = 1;  // SPAN_KIND_INTERNAL
    if (sp.start) {
        *p++ = static_cast<char>(tag(7, 1));
        p = put_fixed64(p, static_cast<uint64_t>(sp.start));
    }
    if (sp.end) {
        *p++ = static_cast<char>(tag(8, 1));
        p = put_fixed64(p, static_cast<uint64_t>(sp.end));
    }
    out.advance_to(p);
}

void put_span(Buf& out, const Span& sp, const Built& built, const std::vector<KeyField>& keys) {
    const Attrs& pool = built.attrs;
    put_span_head(out, sp);
    pool.visit(sp.attrs, [&](const AttrValue& v) { put_attribute(out, 9, v, keys); });
    for (uint32_t at = sp.events.begin; at < sp.events.begin + sp.events.count; ++at) {
        const SpanEvent& e = built.events[at];
        out.message(11, [&] {
            if (e.ts) out.fixed64(1, static_cast<uint64_t>(e.ts));
            out.bytes(2, kMemoryEventName.data(), kMemoryEventName.size());
            pool.visit(e.attrs, [&](const AttrValue& v) { put_attribute(out, 3, v, keys); });
        });
    }
    if (sp.dropped_events) {
        out.byte(tag(12, 0));
        out.varint(sp.dropped_events);
    }
    for (uint32_t at = sp.links.begin; at < sp.links.begin + sp.links.count; ++at) {
        const SpanLink& l = built.links[at];
        out.message(13, [&] {
            out.bytes(1, l.trace_id.data(), 16);
            out.bytes(2, l.span_id.data(), 8);
            put_attribute(out, 4, kLinkKindKey, AttrValue::str(l.kind));
        });
    }
    if (sp.dropped_links) {
        out.byte(tag(14, 0));
        out.varint(sp.dropped_links);
    }
}

// The size of the ScopeSpans.spans field put_span writes for `sp`, without writing it.
size_t span_field_size(const Span& sp, const Built& built, const std::vector<KeyField>& keys) {
    auto attribute = [&](const AttrValue& v) {
        const size_t any = any_value_len(v);
        return field_len(keys[v.key].size + 1 + varint_len(any) + any);
    };
    size_t n = 18 + 10 + (sp.has_parent ? 10 : 0) + 2 + (sp.start ? 9 : 0) + (sp.end ? 9 : 0);
    if (!sp.name.empty()) n += field_len(sp.name.size());
    built.attrs.visit(sp.attrs, [&](const AttrValue& v) { n += attribute(v); });
    for (uint32_t at = sp.events.begin; at < sp.events.begin + sp.events.count; ++at) {
        const SpanEvent& e = built.events[at];
        size_t event = (e.ts ? 9 : 0) + field_len(kMemoryEventName.size());
        built.attrs.visit(e.attrs, [&](const AttrValue& v) { event += attribute(v); });
        n += field_len(event);
    }
    if (sp.dropped_events) n += 1 + varint_len(sp.dropped_events);
    for (uint32_t at = sp.links.begin; at < sp.links.begin + sp.links.count; ++at) {
        const size_t kind = std::strlen(built.links[at].kind);
        n += field_len(18 + 10 + field_len(field_len(kLinkKindKey.size()) + field_len(field_len(kind))));
    }
    if (sp.dropped_links) n += 1 + varint_len(sp.dropped_links);
    return field_len(n);
}

// The header of every request of `built`, before its spans: ExportTraceServiceRequest
// .resource_spans, its ResourceSpans.resource and .scope_spans, their ScopeSpans.scope.
class RequestHead {
  public:
    RequestHead(const Built& built, const std::string& scope_version) {
        if (!built.extra_keys.empty()) {  // the conversion's own keys (op attributes) after the fixed ones
            extra_keys_ = key_fields();
            for (const std::string& name : built.extra_keys) extra_keys_.push_back(key_field(name));
        }
        Buf resource_buf, scope_buf;
        put_attributes(resource_buf, 1, built.resource);
        scope_buf.bytes(1, "otelprof", 8);
        if (!scope_version.empty()) scope_buf.bytes(2, scope_version.data(), scope_version.size());
        resource_ = resource_buf.take();
        scope_ = scope_buf.take();
    }
    // A request's size, `body` bytes of spans with their header.
    size_t request_size(size_t body) const { return field_len(resource_spans(body)); }
    // The rule every batch is cut by: a span that takes a batch of `count` spans to `body` bytes
    // past max_bytes opens the next batch instead, unless it would be the batch's first.
    bool overflows(size_t count, size_t body, size_t max_bytes) const { return count && request_size(body) > max_bytes; }
    // The most a header can take (a body under 2^64 bytes).
    size_t max_size() const { return 2 * (1 + 10) + field_len(resource_.size()) + field_len(scope_.size()); }
    void put(Buf& out, size_t body) const {
        out.byte(tag(1, 2));  // ExportTraceServiceRequest.resource_spans
        out.varint(resource_spans(body));
        out.bytes(1, resource_.data(), resource_.size());  // ResourceSpans.resource
        out.byte(tag(2, 2));                               // ResourceSpans.scope_spans
        out.varint(scope_spans(body));
        out.bytes(1, scope_.data(), scope_.size());  // ScopeSpans.scope
    }

    // Every AttrKey's KeyValue.key bytes, those of built.extra_keys included.
    const std::vector<KeyField>& keys() const { return extra_keys_.empty() ? key_fields() : extra_keys_; }

  private:
    std::string resource_, scope_;
    std::vector<KeyField> extra_keys_;  // key_fields() and built.extra_keys', where it has any
    size_t scope_spans(size_t body) const { return field_len(scope_.size()) + body; }
    size_t resource_spans(size_t body) const { return field_len(resource_.size()) + field_len(scope_spans(body)); }
};

// The requests of `built`, a batch at a time: spans go in after `room` bytes, and a span that
// takes a batch past max_bytes (RequestHead::overflows) is written, then moved on to open the
// next. emit(body, room, n, head) takes the n bytes of spans after the room, with their header;
// then `body` is opened again (at `room`) for the next batch, unless that was the last.
// The room is enough for any request header, or with `tight`, just enough for that of a full
// batch (emit moves the spans where the header is shorter or longer: a short batch, or one past
// the 64 MiB a batch is sized for).
template <typename Emit>
class BatchWriter {
  public:
    BatchWriter(const Built& built, const RequestHead& head, size_t max_bytes, bool tight, Buf& body, Emit& emit)
        : built_(built), head_(head), max_bytes_(max_bytes), body_(body), emit_(emit), keys_(head.keys()) {
        const size_t batch_limit = std::min<size_t>(max_bytes, size_t{64} << 20);
        room_ = tight ? head.request_size(batch_limit) - batch_limit : head.max_size();
        capacity_ = room_ + batch_limit + (size_t{64} << 10);
        body_.reset(capacity_, room_);
    }

    void add(uint32_t idx) {
        const size_t before = body_.size();
        body_.message(2, [&] { put_span(body_, built_.spans[idx], built_, keys_); }, 2);
        if (head_.overflows(count_, body_.size() - room_, max_bytes_)) {
            span_.assign(body_.data() + before, body_.size() - before);
            body_.truncate(before);
            flush(false);
            body_.raw(span_.data(), span_.size());
            count_ = 0;
        }
        ++count_;
    }
    // `count` spans written elsewhere (`spans`), none of which overflows the open batch.
    void append(const Buf& spans, size_t count) {
        body_.raw(spans.data(), spans.size());
        count_ += count;
    }
    size_t count() const { return count_; }
    size_t body_bytes() const { return body_.size() - room_; }
    // The open batch is the last request; returns how many requests there were.
    size_t finish() {
        flush(true);
        return requests_;
    }

  private:
    const Built& built_;
    const RequestHead& head_;
    const size_t max_bytes_;
    Buf& body_;
    Emit& emit_;
    const std::vector<KeyField>& keys_;
    size_t room_ = 0, capacity_ = 0, count_ = 0, requests_ = 0;
    std::string span_;  // the span that moves on to the next batch

    void flush(bool last) {
        Buf header;
        head_.put(header, body_bytes());
        emit_(body_, room_, body_bytes(), header);
        ++requests_;
        if (!last) body_.reset(capacity_, room_);
    }
};

// A request's header written in the room before its `n` bytes of spans, in a store's buffer:
// where the header is not the room's size, the spans move to meet it. Returns the request's size.
size_t put_header_in_room(Buf& batch, size_t room, size_t n, const Buf& head) {
    const size_t h = head.size();
    batch.truncate(room + n);
    if (h != room) {
        if (h > room) batch.ensure(h - room);
        std::memmove(batch.begin() + h, batch.begin() + room, n);
    }
    std::memcpy(batch.begin(), head.data(), h);
    return h + n;
}

// BatchWriter's emit into a store: the request goes to the store as soon as it is written.
struct CloseInStore {
    void operator()(Buf& batch, size_t room, size_t n, const Buf& head) const {
        batch.close(put_header_in_room(batch, room, n, head));
    }
};

// Of the spans in output order, the share the calling thread writes when two threads encode
// (the rest: what the second measures, then writes, takes about as long; df_index).
constexpr double kFirstShare = 0.64;

// encode_requests into `store` on two threads, the same requests as one thread writes. This
// thread writes the first spans as one thread would (requests closed as they fill), and leaves
// its last batch open. The second measures those spans' sizes (span_field_size), which tells
// it how full that batch is; it writes the spans that still fit in it aside, then the rest as
// one thread would, into requests it closes after this thread's (the store's close appends).
// Then this thread adds the spans written aside to its open batch, and closes it.
size_t encode_on_two_threads(const Built& built, const std::string& scope_version, size_t max_bytes,
                             RequestStore& store) {
    const RequestHead head(built, scope_version);
    const std::vector<KeyField>& keys = head.keys();
    const size_t n = built.order.size();
    const auto split = static_cast<size_t>(static_cast<double>(n) * kFirstShare);

    CloseInStore close_now;
    Buf first_body;
    first_body.use_store(store);
    BatchWriter first(built, head, max_bytes, true, first_body, close_now);

    size_t open_count = 0, open_bytes = 0;  // the first's open batch, as the second measures it
    Buf aside;                               // spans that still fit in it
    size_t aside_count = 0;
    std::vector<std::pair<char*, size_t>> later;  // the second's requests, to close after the first's
    auto close_later = [&](Buf& batch, size_t room, size_t n, const Buf& header) {
        later.emplace_back(batch.begin(), put_header_in_room(batch, room, n, header));
        batch.detach();
    };
    auto second = [&] {
        for (size_t k = 0; k < split; ++k) {
            const size_t size = span_field_size(built.spans[built.order[k]], built, keys);
            if (head.overflows(open_count, open_bytes + size, max_bytes)) open_count = open_bytes = 0;
            open_bytes += size;
            ++open_count;
        }
        size_t k = split;
        for (; k < n; ++k, ++aside_count) {
            const size_t before = aside.size();
            aside.message(2, [&] { put_span(aside, built.spans[built.order[k]], built, keys); }, 2);
            if (head.overflows(open_count + aside_count, open_bytes + aside.size(), max_bytes)) {
                aside.truncate(before);  // this span opens the next batch: the second's first
                break;
            }
        }
        if (k == n) return;
        Buf second_body;
        second_body.use_store(store);
        BatchWriter rest(built, head, max_bytes, true, second_body, close_later);
        for (; k < n; ++k) rest.add(built.order[k]);
        rest.finish();
    };
    run_beside([&] {
        for (size_t k = 0; k < split; ++k) first.add(built.order[k]);
    }, second);
    if (first.count() != open_count || first.body_bytes() != open_bytes)
        throw std::logic_error("the spans' measured sizes are not their written sizes");
    first.append(aside, aside_count);
    size_t requests = first.finish();
    for (const auto& [buffer, size] : later) store.close(buffer, size);
    return requests + later.size();
}

}  // namespace

std::vector<Request> encode_requests(const Built& built, const std::string& scope_version, size_t max_bytes) {
    std::vector<Request> requests;
    if (built.order.empty()) return requests;
    // the buffer becomes the request, its header written just before its spans
    auto emit = [&](Buf& batch, size_t room, size_t n, const Buf& head) {
        Request req;
        req.begin = room - head.size();
        req.size = head.size() + n;
        batch.truncate(room + n);
        req.data = batch.release();
        std::memcpy(req.data.get() + req.begin, head.data(), head.size());
        requests.push_back(std::move(req));
    };
    const RequestHead head(built, scope_version);
    Buf body;
    BatchWriter batches(built, head, max_bytes, false, body, emit);
    for (uint32_t idx : built.order) batches.add(idx);
    batches.finish();
    return requests;
}

size_t encode_requests(const Built& built, const std::string& scope_version, size_t max_bytes, RequestStore& store,
                       bool two_threads) {
    if (built.order.empty()) return 0;
    if (two_threads) return encode_on_two_threads(built, scope_version, max_bytes, store);
    CloseInStore emit;
    const RequestHead head(built, scope_version);
    Buf body;
    body.use_store(store);
    BatchWriter batches(built, head, max_bytes, true, body, emit);
    for (uint32_t idx : built.order) batches.add(idx);
    return batches.finish();
}

}  // namespace otelprof
