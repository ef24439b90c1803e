#include "otelprof/encoder.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>

#include "otelprof/beside.hpp"

namespace otelprof {

namespace {

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

const std::vector<KeyField>& key_fields() {
    static const std::vector<KeyField> table = [] {
        std::vector<KeyField> fields(key_count());
        for (size_t k = 0; k < fields.size(); ++k) {
            const std::string_view name = key_name(static_cast<AttrKey>(k));
            KeyField& f = fields[k];
            char* end = put_varint(f.bytes + 1, name.size());
            f.bytes[0] = static_cast<char>(tag(1, 2));
            if (end - f.bytes + name.size() > KeyField::kMax) throw std::logic_error("attribute key too long");
            end = put_bytes(end, name.data(), name.size());
            f.size = static_cast<size_t>(end - f.bytes);
        }
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
        if (!store_ && !fixed_) std::free(data_);
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
    // Writes into [p, p + capacity), which is not its own and never grows (before anything is
    // written): a request whose size is known, with room for the largest ensure() of its spans.
    void use_fixed(char* p, size_t capacity) {
        data_ = p;
        cap_ = capacity;
        len_ = 0;
        fixed_ = true;
    }
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
    bool fixed_ = false;    // use_fixed

    void ready(size_t cap) {
        store_->ready(data_ + cap_, cap - cap_);
        cap_ = cap;
    }

    __attribute__((noinline)) void grow(size_t need) {
        if (fixed_) throw std::logic_error("a request outgrew the size its spans were given");
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
            data_ = store_->grow(store_cap_);
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
            out.bytes(2, "pytorch.memory", 14);
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
            put_attribute(out, 4, "otelprof.link.kind", AttrValue::str(l.kind));
        });
    }
    if (sp.dropped_links) {
        out.byte(tag(14, 0));
        out.varint(sp.dropped_links);
    }
}

// The size of the ScopeSpans.spans field put_span writes for `sp`, without writing it.
// `longest` rises to the longest string it writes in one piece (a name, a string value): a
// buffer with that much room (and a little) to spare takes every ensure() of the span.
size_t span_field_size(const Span& sp, const Built& built, const std::vector<KeyField>& keys, size_t& longest) {
    auto attribute = [&](const AttrValue& v) {
        if (v.type == AttrValue::Type::Str) longest = std::max<size_t>(longest, v.len);
        const size_t any = any_value_len(v);
        return field_len(keys[v.key].size + 1 + varint_len(any) + any);
    };
    longest = std::max(longest, sp.name.size());
    size_t n = 18 + 10 + (sp.has_parent ? 10 : 0) + 2 + (sp.start ? 9 : 0) + (sp.end ? 9 : 0);
    if (!sp.name.empty()) n += field_len(sp.name.size());
    built.attrs.visit(sp.attrs, [&](const AttrValue& v) { n += attribute(v); });
    for (uint32_t at = sp.events.begin; at < sp.events.begin + sp.events.count; ++at) {
        const SpanEvent& e = built.events[at];
        size_t event = (e.ts ? 9 : 0) + field_len(14);
        built.attrs.visit(e.attrs, [&](const AttrValue& v) { event += attribute(v); });
        n += field_len(event);
    }
    if (sp.dropped_events) n += 1 + varint_len(sp.dropped_events);
    for (uint32_t at = sp.links.begin; at < sp.links.begin + sp.links.count; ++at) {
        const size_t kind = std::strlen(built.links[at].kind);
        n += field_len(18 + 10 + field_len(field_len(18) + field_len(field_len(kind))));
    }
    if (sp.dropped_links) n += 1 + varint_len(sp.dropped_links);
    return field_len(n);
}

}  // namespace

namespace {

// The header of every request of `built`, before its spans: ExportTraceServiceRequest
// .resource_spans, its ResourceSpans.resource and .scope_spans, their ScopeSpans.scope.
class RequestHead {
  public:
    RequestHead(const Built& built, const std::string& scope_version) {
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

  private:
    std::string resource_, scope_;
    size_t scope_spans(size_t body) const { return field_len(scope_.size()) + body; }
    size_t resource_spans(size_t body) const { return field_len(resource_.size()) + field_len(scope_spans(body)); }
};

// The requests of `built`, batch by batch: each batch's spans are written after `room` bytes
// and emit(body, room, n, head, last) takes the n bytes of spans after the room, with their
// header, then leaves `body` open (at `room`) for the next batch unless it was the `last`.
// The room is enough for any request header, or with `tight`, just enough for that of a full
// batch (emit moves the spans where the header is shorter or longer: a short batch, or one past
// the 64 MiB a batch is sized for).
template <typename Open, typename Emit>
size_t encode_batches(const Built& built, const std::string& scope_version, size_t max_bytes, bool tight, Buf& body,
                      Open&& open_batch, Emit&& emit) {
    if (built.order.empty()) return 0;
    const RequestHead head(built, scope_version);
    // Batches fill up to max_bytes; the span that overflows one is written before it is moved on.
    const size_t batch_limit = std::min<size_t>(max_bytes, size_t{64} << 20);
    const size_t room = tight ? head.request_size(batch_limit) - batch_limit : head.max_size();
    const size_t batch_capacity = room + batch_limit + (size_t{64} << 10);
    size_t requests = 0;
    // Emits the first `n` bytes of the batch's spans as one request.
    auto flush = [&](size_t n, bool last) {
        Buf header;
        head.put(header, n);
        emit(body, room, n, header, last);
        ++requests;
    };
    open_batch(batch_capacity, room);
    size_t count = 0;
    std::string span;
    const std::vector<KeyField>& keys = key_fields();
    for (uint32_t idx : built.order) {
        const size_t before = body.size();
        body.message(2, [&] { put_span(body, built.spans[idx], built, keys); }, 2);
        if (head.overflows(count, body.size() - room, max_bytes)) {
            // this span opens the next batch
            span.assign(body.data() + before, body.size() - before);
            body.truncate(before);
            flush(before - room, false);
            body.raw(span.data(), span.size());
            count = 0;
        }
        ++count;
    }
    flush(body.size() - room, true);
    return requests;
}

// encode_batches' requests into `store`, on two threads: first the spans' sizes (half the spans
// each), which fix the batches; then each thread writes whole requests, about half the bytes
// each, into buffers the store opened for all of them at once. No span is written twice.
size_t encode_on_two_threads(const Built& built, const std::string& scope_version, size_t max_bytes,
                             RequestStore& store) {
    const RequestHead head(built, scope_version);
    const std::vector<KeyField>& keys = key_fields();
    const size_t n = built.order.size();
    std::vector<size_t> sizes(n);
    size_t longest[2] = {0, 0};
    auto measure = [&](size_t from, size_t to, size_t& most) {
        for (size_t k = from; k < to; ++k) sizes[k] = span_field_size(built.spans[built.order[k]], built, keys, most);
    };
    run_beside([&] { measure(0, n / 2, longest[0]); }, [&] { measure(n / 2, n, longest[1]); });

    struct Batch {
        size_t first = 0, body = 0;  // its first span (in output order), its spans' bytes
    };
    std::vector<Batch> batches(1);
    for (size_t k = 0, count = 0; k < n; ++k, ++count) {
        if (head.overflows(count, batches.back().body + sizes[k], max_bytes)) {
            batches.push_back({k, 0});
            count = 0;
        }
        batches.back().body += sizes[k];
    }
    batches.push_back({n, 0});  // (where the last one ends)
    const size_t n_requests = batches.size() - 1;

    // the second thread's requests are the last ones, about half the bytes; each thread opens
    // the buffers it writes (an open faults in a buffer's first page: on the second thread, that
    // work is shared too)
    size_t total = 0, split = n_requests;
    for (size_t r = 0; r < n_requests; ++r) total += batches[r].body;
    for (size_t r = 0, bytes = 0; r < n_requests && split == n_requests; ++r)
        if ((bytes += batches[r].body) >= total / 2) split = r + 1;
    const size_t spare = std::max(longest[0], longest[1]) + 256;
    std::vector<char*> buffers(n_requests);
    auto open = [&](size_t from, size_t to) {
        for (size_t r = from; r < to; ++r) buffers[r] = store.open(head.request_size(batches[r].body) + spare);
    };
    auto write = [&](size_t from, size_t to) {
        for (size_t r = from; r < to; ++r) {
            const size_t size = head.request_size(batches[r].body);
            store.ready(buffers[r], size);
            Buf out;
            out.use_fixed(buffers[r], size + spare);
            head.put(out, batches[r].body);
            for (size_t k = batches[r].first; k < batches[r + 1].first; ++k)
                out.message(2, [&] { put_span(out, built.spans[built.order[k]], built, keys); }, 2);
            if (out.size() != size) throw std::logic_error("a request's spans were mismeasured");
        }
    };
    auto part = [&](size_t from, size_t to) {
        return [&, from, to] {
            open(from, to);
            write(from, to);
        };
    };
    if (split < n_requests) run_beside(part(0, split), part(split, n_requests));
    else part(0, n_requests)();
    for (size_t r = 0; r < n_requests; ++r) store.close(buffers[r], head.request_size(batches[r].body));
    return n_requests;
}

}  // namespace

std::vector<Request> encode_requests(const Built& built, const std::string& scope_version, size_t max_bytes) {
    std::vector<Request> requests;
    Buf body;
    size_t capacity = 0;
    auto open_batch = [&](size_t batch_capacity, size_t room) {
        capacity = batch_capacity;
        body.reset(batch_capacity, room);
    };
    // the buffer becomes the request, its header written just before its spans
    auto emit = [&](Buf& batch, size_t room, size_t n, const Buf& head, bool last) {
        Request req;
        req.begin = room - head.size();
        req.size = head.size() + n;
        batch.truncate(room + n);
        req.data = batch.release();
        std::memcpy(req.data.get() + req.begin, head.data(), head.size());
        requests.push_back(std::move(req));
        if (!last) batch.reset(capacity, room);
    };
    encode_batches(built, scope_version, max_bytes, false, body, open_batch, emit);
    return requests;
}

size_t encode_requests(const Built& built, const std::string& scope_version, size_t max_bytes, RequestStore& store,
                       bool two_threads) {
    if (two_threads && !built.order.empty()) return encode_on_two_threads(built, scope_version, max_bytes, store);
    Buf body;
    body.use_store(store);
    size_t capacity = 0;
    auto open_batch = [&](size_t batch_capacity, size_t room) {
        capacity = batch_capacity;
        body.reset(batch_capacity, room);
    };
    // the header goes in the room before the spans; where it is not the room's size, the spans
    // move to meet it
    auto emit = [&](Buf& batch, size_t room, size_t n, const Buf& head, bool last) {
        const size_t h = head.size();
        batch.truncate(room + n);
        if (h != room) {
            if (h > room) batch.ensure(h - room);
            std::memmove(batch.begin() + h, batch.begin() + room, n);
        }
        std::memcpy(batch.begin(), head.data(), h);
        batch.close(h + n);
        if (!last) batch.reset(capacity, room);
    };
    return encode_batches(built, scope_version, max_bytes, true, body, open_batch, emit);
}

}  // namespace otelprof
