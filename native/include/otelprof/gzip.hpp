// Gzip inflation (every member of a stream, one cap over all of them) into a caller's buffer.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

namespace otelprof {

// The messages match converter/_load.py's gunzip (the caller prefixes the source name).
class GzipError : public std::runtime_error {
   public:
    using std::runtime_error::runtime_error;
};

// Where inflated bytes go: resize(n) makes the buffer n bytes long, keeping the first bytes
// (realloc semantics), and returns its start. The final call sets the exact inflated size.
class GzipSink {
   public:
    virtual ~GzipSink() = default;
    virtual char* resize(size_t n) = 0;
    // Called after each inflate call with the bytes out so far (a streaming reader's cue).
    virtual void progress(size_t /*total*/) {}
    // The most bytes one inflate call may produce (smaller: more frequent progress).
    virtual size_t max_step() const { return SIZE_MAX; }
};

// Inflates each gzip member of `in` in turn (as gzip(1) reads concatenated members), stopping
// at the first byte after a member that does not start a new one. Throws GzipError on corrupt
// or truncated data and as soon as more than `cap` bytes come out. Returns the inflated size.
size_t gunzip(std::string_view in, uint64_t cap, GzipSink& sink);

// Convenience for C++ callers: the inflated bytes as a string.
std::string gunzip(std::string_view in, uint64_t cap);

// What StreamingGunzip inflates with: "isa-l" where built with it (libisal-dev), else "zlib".
const char* streaming_inflater();

// Inflates `in` (as gunzip does, same cap and errors) on a thread of its own into one reserved
// region of address space that never moves, so a parser can read the first megabytes while the
// rest is still inflating: on two cores, inflating costs almost nothing on top of parsing.
// Pages are committed only as they are written, and released with the object.
class StreamingGunzip {
   public:
    struct Progress {
        size_t available;  // bytes out so far, final once `complete`
        bool complete;     // inflation ended (see finish() for how)
    };
    // Throws std::bad_alloc when the address space for `cap` bytes cannot be reserved (the
    // caller then inflates into a growing buffer instead). `in` must outlive the object.
    StreamingGunzip(std::string_view in, uint64_t cap);
    ~StreamingGunzip();  // stops the inflater early if it is still running
    StreamingGunzip(const StreamingGunzip&) = delete;
    StreamingGunzip& operator=(const StreamingGunzip&) = delete;

    const char* data() const { return base_; }
    // ISIZE of the last member: the inflated size of a one-member file under 4 GiB (a hint).
    size_t size_hint() const { return hint_; }
    // Blocks until at least `want` bytes are out or inflation has ended.
    Progress wait_for(size_t want);
    // Waits for the end. Returns the inflated size; throws GzipError as gunzip() would.
    // `rewritten`: set when the bytes were inflated again by zlib after the fast inflater
    // rejected them (a parse of what had arrived before is then void).
    size_t finish(bool* rewritten = nullptr);

   private:
    struct Cancelled {};
    class Sink;
    std::string_view in_;
    uint64_t cap_;
    char* base_ = nullptr;
    size_t reserved_ = 0;
    size_t hint_ = 0;
    std::mutex mutex_;
    std::condition_variable changed_;
    size_t available_ = 0;  // guarded by mutex_
    bool done_ = false;     // guarded by mutex_
    bool cancel_ = false;   // guarded by mutex_
    bool redo_ = false;     // guarded by mutex_: the fast inflater gave up (see finish)
    std::string error_;     // set before done_; empty: success
    std::thread thread_;

    void run();
};

}  // namespace otelprof
