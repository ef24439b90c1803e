// Gzip inflation with zlib. Mirrors converter/_load.py's gunzip step for step (member loop, cap
// checked after every inflate call with at most cap + 1 bytes of room, same error texts), so
// both paths give the same bytes and the same errors.
#include "otelprof/gzip.hpp"

#include <zlib.h>
#ifdef OTELPROF_HAVE_ISAL
#include <isa-l/igzip_lib.h>
#endif

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

#if defined(__linux__) || defined(__APPLE__)
#include <sys/mman.h>
#endif

namespace otelprof {

namespace {

constexpr size_t kMaxCall = size_t{1} << 30;  // zlib's avail_in/avail_out are 32-bit
constexpr size_t kMinCapacity = size_t{64} << 10;
constexpr size_t kMaxRatio = 1032;  // DEFLATE expands at most ~1032:1

struct Inflater {
    z_stream zs{};
    Inflater() {
        if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) throw std::bad_alloc();
    }
    ~Inflater() { inflateEnd(&zs); }
    Inflater(const Inflater&) = delete;
    Inflater& operator=(const Inflater&) = delete;
};

// Python's zlib module words errors as "Error <code> while decompressing data: <zlib msg>".
[[noreturn]] void corrupt(int err, const char* zmsg) {
    if (zmsg == nullptr) {
        switch (err) {
            case Z_BUF_ERROR: zmsg = "incomplete or truncated stream"; break;
            case Z_STREAM_ERROR: zmsg = "inconsistent stream state"; break;
            case Z_DATA_ERROR: zmsg = "invalid input data"; break;
            default: break;
        }
    }
    std::string what = "corrupt gzip data (Error " + std::to_string(err) + " while decompressing data";
    if (zmsg != nullptr) what += std::string(": ") + zmsg;
    throw GzipError(what + ")");
}

// First capacity: the last member's ISIZE trailer (exact for one member under 4 GiB), kept
// within what the input can expand to and the cap.
size_t initial_capacity(std::string_view in, uint64_t cap) {
    size_t hint = kMinCapacity;
    if (in.size() >= 18) {
        const auto* t = reinterpret_cast<const unsigned char*>(in.data() + in.size() - 4);
        hint = std::max<size_t>(hint, size_t{t[0]} | size_t{t[1]} << 8 | size_t{t[2]} << 16 | size_t{t[3]} << 24);
    }
    hint = std::min<uint64_t>(hint, uint64_t{in.size()} * kMaxRatio + kMinCapacity);
    return static_cast<size_t>(std::min<uint64_t>(hint, cap + 1));
}

#ifdef OTELPROF_HAVE_ISAL
// gunzip()'s loop (members, cap, steps) on ISA-L's inflate, about twice zlib's speed. Returns
// false where ISA-L rejects the stream (or a member's header has the reserved flags zlib
// refuses and ISA-L ignores): zlib then inflates it again and says why, in its own words.
bool isal_gunzip(std::string_view in, uint64_t cap, GzipSink& sink, size_t& inflated) {
    constexpr size_t kMaxIsal = size_t{1} << 30;
    const auto* data = reinterpret_cast<const unsigned char*>(in.data());
    const size_t n = in.size();
    auto state = std::make_unique<inflate_state>();  // ~40 KiB: not on the stack
    size_t capacity = initial_capacity(in, cap);
    char* out = sink.resize(capacity);
    size_t total = 0;
    size_t at = 0;  // start of the current member
    for (;;) {
        if (n - at < 10 || (data[at + 3] & 0xE0) != 0) return false;
        isal_inflate_init(state.get());
        state->crc_flag = ISAL_GZIP;
        size_t fed = at;
        for (;;) {
            if (state->avail_in == 0) {
                if (fed >= n) return false;  // truncated
                const size_t piece = std::min(n - fed, kMaxIsal);
                state->next_in = const_cast<unsigned char*>(data + fed);
                state->avail_in = static_cast<uint32_t>(piece);
                fed += piece;
            }
            if (total == capacity) {
                capacity = static_cast<size_t>(std::min<uint64_t>(uint64_t{capacity} * 2, cap + 1));
                out = sink.resize(capacity);
            }
            const size_t room = std::min({capacity - total, kMaxIsal, sink.max_step()});
            state->next_out = reinterpret_cast<unsigned char*>(out + total);
            state->avail_out = static_cast<uint32_t>(room);
            const int err = isal_inflate(state.get());
            total += room - state->avail_out;
            if (err < 0) return false;
            if (total > cap) throw GzipError("decompressed trace exceeds " + std::to_string(cap) + " bytes");
            sink.progress(total);
            if (state->block_state == ISAL_BLOCK_FINISH) break;
        }
        at = fed - state->avail_in;  // ISA-L has checked the trailer's CRC and size
        if (n - at < 2 || data[at] != 0x1f || data[at + 1] != 0x8b) break;  // trailing bytes are ignored
    }
    sink.resize(total);
    inflated = total;
    return true;
}
#endif

}  // namespace

size_t gunzip(std::string_view in, uint64_t cap, GzipSink& sink) {
    cap = std::min<uint64_t>(cap, uint64_t{1} << 62);  // cap + 1 and doubling stay in range
    const auto* data = reinterpret_cast<const unsigned char*>(in.data());
    const size_t n = in.size();
    size_t capacity = initial_capacity(in, cap);
    char* out = sink.resize(capacity);
    size_t total = 0;
    size_t at = 0;  // start of the current member
    Inflater inf;
    for (;;) {
        if (at != 0 && inflateReset(&inf.zs) != Z_OK) corrupt(Z_STREAM_ERROR, inf.zs.msg);
        size_t fed = at;
        inf.zs.avail_in = 0;
        for (;;) {
            if (inf.zs.avail_in == 0) {
                if (fed >= n) throw GzipError("truncated gzip data");
                const size_t piece = std::min(n - fed, kMaxCall);
                inf.zs.next_in = const_cast<unsigned char*>(data + fed);
                inf.zs.avail_in = static_cast<uInt>(piece);
                fed += piece;
            }
            if (total == capacity) {  // grow geometrically, never past cap + 1
                capacity = static_cast<size_t>(std::min<uint64_t>(uint64_t{capacity} * 2, cap + 1));
                out = sink.resize(capacity);
            }
            const size_t room = std::min({capacity - total, kMaxCall, sink.max_step()});
            inf.zs.next_out = reinterpret_cast<unsigned char*>(out + total);
            inf.zs.avail_out = static_cast<uInt>(room);
            const int err = inflate(&inf.zs, Z_NO_FLUSH);
            total += room - inf.zs.avail_out;
            if (err != Z_OK && err != Z_BUF_ERROR && err != Z_STREAM_END) corrupt(err, inf.zs.msg);
            if (total > cap) throw GzipError("decompressed trace exceeds " + std::to_string(cap) + " bytes");
            sink.progress(total);
            if (err == Z_STREAM_END) break;
        }
        at = fed - inf.zs.avail_in;
        if (n - at < 2 || data[at] != 0x1f || data[at + 1] != 0x8b) break;  // trailing bytes are ignored
    }
    sink.resize(total);
    return total;
}

std::string gunzip(std::string_view in, uint64_t cap) {
    struct StringSink final : GzipSink {
        std::string s;
        char* resize(size_t size) override {
            s.resize(size);
            return s.data();
        }
    } sink;
    gunzip(in, cap, sink);
    return std::move(sink.s);
}

// Writes into the reserved region (which never moves) and tells the reader how far it got.
class StreamingGunzip::Sink final : public GzipSink {
   public:
    explicit Sink(StreamingGunzip& owner) : owner_(owner) {}
    char* resize(size_t n) override {
        if (n > owner_.reserved_) throw std::bad_alloc();  // cannot happen: reserved cap + 1
        return owner_.base_;
    }
    void progress(size_t total) override {
        {
            std::lock_guard<std::mutex> lock(owner_.mutex_);
            if (owner_.cancel_) throw Cancelled{};
            owner_.available_ = total;
        }
        owner_.changed_.notify_one();
    }
    // Small steps: the parser waits for at most this much beyond what it needs.
    size_t max_step() const override { return size_t{256} << 10; }

   private:
    StreamingGunzip& owner_;
};

StreamingGunzip::StreamingGunzip(std::string_view in, uint64_t cap) : in_(in), cap_(std::min<uint64_t>(cap, uint64_t{1} << 62)) {
#if defined(MAP_ANONYMOUS) && defined(MAP_NORESERVE)
    // Address space only: the kernel commits a page when the inflater first writes it.
    if (cap_ + 1 > SIZE_MAX / 2) throw std::bad_alloc();
    reserved_ = static_cast<size_t>(cap_ + 1);
    void* p = mmap(nullptr, reserved_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    base_ = static_cast<char*>(p);
    // No MADV_HUGEPAGE here: where the kernel defragments on request, a huge-page fault may
    // wait for compaction, and the parser waits for the inflater (largest trace: parse 46 ->
    // 93-130 ms in three runs of eight with it).
#else
    throw std::bad_alloc();
#endif
    hint_ = std::min<size_t>(initial_capacity(in, cap_), reserved_);
    thread_ = std::thread([this] { run(); });
}

StreamingGunzip::~StreamingGunzip() {
    if (thread_.joinable()) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            cancel_ = true;
        }
        thread_.join();
    }
#if defined(MAP_ANONYMOUS) && defined(MAP_NORESERVE)
    if (base_) munmap(base_, reserved_);
#endif
}

void StreamingGunzip::run() {
    std::string error;
    size_t total = 0;
    bool redo = false;  // the fast inflater gave up: finish() has zlib inflate it again
    try {
        Sink sink(*this);
#ifdef OTELPROF_HAVE_ISAL
        redo = !isal_gunzip(in_, cap_, sink, total);
#else
        total = gunzip(in_, cap_, sink);
#endif
    } catch (const GzipError& e) {
        error = e.what();
    } catch (const Cancelled&) {
        error = "cancelled";
    } catch (const std::bad_alloc&) {
        error = "out of memory while inflating";
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (error.empty() && !redo) available_ = total;
        error_ = std::move(error);
        redo_ = redo;
        done_ = true;
    }
    changed_.notify_all();
}

StreamingGunzip::Progress StreamingGunzip::wait_for(size_t want) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return done_ || available_ >= want; });
    return {available_, done_};
}

size_t StreamingGunzip::finish(bool* rewritten) {
    wait_for(SIZE_MAX);
    if (thread_.joinable()) thread_.join();
    if (rewritten) *rewritten = redo_;
    if (redo_) {  // nobody reads the region now
        redo_ = false;
        Sink sink(*this);
        return gunzip(in_, cap_, sink);  // throws GzipError in zlib's words
    }
    if (!error_.empty()) throw GzipError(error_);
    return available_;
}

const char* streaming_inflater() {
#ifdef OTELPROF_HAVE_ISAL
    return "isa-l";
#else
    return "zlib";
#endif
}

}  // namespace otelprof
