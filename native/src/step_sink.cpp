#include "otelprof/step_sink.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace otelprof {

namespace {
std::atomic<int64_t> g_resident_kept{0};  // memory_peaks._RESIDENT_KEPT's native half
// Forks seen (in the child): files opened before one are the parent's. Counted by an atfork
// handler rather than comparing getpid(): any syscall in a step costs a small model's loop
// ~10 us on a VM (measured), far more than the call itself.
std::atomic<uint64_t> g_forks{0};
void count_fork() { g_forks.fetch_add(1, std::memory_order_relaxed); }

int64_t max_rss_kib() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_maxrss;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Python's int(bytes) in base 10: whitespace around, a sign, digits with single underscores
// between them; nullopt where it raises (or past int64).
std::optional<int64_t> python_int(const char* b, const char* e) {
    while (b < e && is_space(*b)) ++b;
    while (e > b && is_space(e[-1])) --e;
    bool negative = false;
    if (b < e && (*b == '+' || *b == '-')) negative = *b++ == '-';
    if (b == e) return std::nullopt;
    int64_t v = 0;
    bool digit = false;  // the previous character was a digit
    for (; b < e; ++b) {
        if (*b == '_' && digit) {
            digit = false;
            continue;
        }
        if (*b < '0' || *b > '9') return std::nullopt;
        if (v > (INT64_MAX - 9) / 10) return std::nullopt;
        v = v * 10 + (*b - '0');
        digit = true;
    }
    if (!digit) return std::nullopt;  // empty, or a trailing underscore
    return negative ? -v : v;
}
}  // namespace

std::optional<int64_t> ResidentPeaks::vm_hwm_kib(const std::string& status) {
    const size_t at = status.find("VmHWM:");
    if (at == std::string::npos) return std::nullopt;
    const size_t found = status.find("kB", at);
    // status[at + 6 : end], end -1 (not found) as Python slices it: up to the last character
    const size_t end = found == std::string::npos ? (status.empty() ? 0 : status.size() - 1) : found;
    const size_t begin = std::min(at + 6, status.size());
    if (end <= begin) return python_int(status.data(), status.data());
    return python_int(status.data() + begin, status.data() + end);
}

std::optional<int64_t> ResidentPeaks::current_rss() {
    const int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return std::nullopt;
    char buf[256];
    const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
    ::close(fd);
    if (n <= 0) return std::nullopt;
    const char* p = buf;
    const char* e = buf + n;
    while (p < e && !is_space(*p)) ++p;  // size, then resident (pages)
    const char* b = p;
    while (b < e && is_space(*b)) ++b;
    const char* f = b;
    while (f < e && !is_space(*f)) ++f;
    const std::optional<int64_t> pages = python_int(b, f);
    if (!pages) return std::nullopt;
    return *pages * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

int64_t ResidentPeaks::kept_kib() { return g_resident_kept.load(std::memory_order_relaxed); }

bool ResidentPeaks::open(std::string* error) {
    static const int registered = pthread_atfork(nullptr, nullptr, count_fork);
    (void)registered;
    close_fds();
    forks_ = g_forks.load(std::memory_order_relaxed);
    status_ = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (status_ >= 0) clear_ = ::open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
    if (status_ >= 0 && clear_ >= 0) return true;
    const int err = errno;
    if (error != nullptr) {
        *error = std::string("[Errno ") + std::to_string(err) + "] " + std::strerror(err) + ": '" +
                 (status_ < 0 ? "/proc/self/status" : "/proc/self/clear_refs") + "'";
    }
    return false;
}

void ResidentPeaks::close_fds() {
    if (status_ >= 0) ::close(status_);
    if (clear_ >= 0) ::close(clear_);
    status_ = clear_ = -1;
}

std::string ResidentPeaks::start() {
    std::string error;
    open(&error);
    on_ = true;
    read();  // the first step's peak starts now
    std::optional<int64_t> ignored;
    check(ignored);  // the mark kept at exec (a launcher's) may be above the resident set now
    return error;
}

void ResidentPeaks::stop() {
    close_fds();
    on_ = false;
}

bool ResidentPeaks::vm_hwm(std::optional<int64_t>& out) {
    char buf[4096];
    const ssize_t n = pread(status_, buf, sizeof(buf), 0);
    if (n < 0) return false;
    out = vm_hwm_kib(std::string(buf, static_cast<size_t>(n)));
    return true;
}

bool ResidentPeaks::check(std::optional<int64_t>& out) {
    if (status_ < 0) return false;
    if (!vm_hwm(out)) return false;
    if (out && max_rss_kib() > *out) exact_ = true;
    return true;
}

std::optional<int64_t> ResidentPeaks::read() {
    if (status_ >= 0 && forks_ != g_forks.load(std::memory_order_relaxed)) open(nullptr);  // the parent's files
    if (status_ < 0 || clear_ < 0) return current_rss();
    ++steps_;
    std::optional<int64_t> hwm;
    if (exact_) {
        if (!vm_hwm(hwm)) return std::nullopt;
    } else if (steps_ % kCheckEvery == 0) {
        if (!check(hwm)) hwm.reset();  // memory_peaks' _check answers None for a failed read
    } else {
        hwm = max_rss_kib();
    }
    if (!hwm) return current_rss();
    int64_t kept = g_resident_kept.load(std::memory_order_relaxed);
    while (*hwm > kept && !g_resident_kept.compare_exchange_weak(kept, *hwm)) {
    }
    if (::write(clear_, "5", 1) < 0) return std::nullopt;
    return *hwm * 1024;
}

namespace {
constexpr const char* kPhaseNames[kPhaseCount] = {"data", "forward", "backward", "optimizer"};
}  // namespace

size_t StepHistogram::observe(double value) {
    const size_t i = static_cast<size_t>(std::lower_bound(kStepBuckets.begin(), kStepBuckets.end(), value) -
                                         kStepBuckets.begin());
    ++counts[i];
    sum += value;
    return i;
}

StepAdded StepSink::add(const TrackedStep& step, const std::string& name, const std::optional<TraceId>& parent_trace,
                        const std::optional<SpanId>& parent_span, const std::vector<std::string>* modules) {
    StepAdded added;
    added.boundary = !step.evaluation;  // an evaluation is a span, in no step metric, no boundary
    const uint64_t ordinal = ordinal_;
    ordinal_ += 1 + step.phases.size();
    std::string window;  // an evaluation span carries no mark and leaves the next step's in place
    if (!step.evaluation) window.swap(window_);
    StepMemory memory;  // likewise the memory peaks set for the training step
    if (!step.evaluation) {
        std::swap(memory, memory_);
        if (resident.on()) memory.resident = resident.read();
        last_memory_ = memory;
    }
    if (max_held_ > 0) {  // device-timed: its ids and mark are taken now, the rest at release()
        held_.push_back(
            {step, make_record(step, name, ordinal, parent_trace, parent_span, std::move(window), modules, memory)});
        added.held = true;
        if (held_.size() > max_held_) {  // the device is too far behind: the oldest keeps its CPU times
            ++held_overflows_;
            added.wake = release(nullptr).wake;
        }
        return added;
    }
    if (!step.evaluation) fold(step, parent_trace, ordinal);
    if (queue_.size() >= max_pending_) {
        ++metrics_.spans_dropped;
        return added;
    }
    added.wake =
        enqueue(make_record(step, name, ordinal, parent_trace, parent_span, std::move(window), modules, memory));
    return added;
}

StepRecord StepSink::make_record(const TrackedStep& step, const std::string& name, uint64_t ordinal,
                                 const std::optional<TraceId>& parent_trace, const std::optional<SpanId>& parent_span,
                                 std::string window, const std::vector<std::string>* modules,
                                 const StepMemory& memory) const {
    StepRecord r;
    r.name = name;
    r.number = step.number;
    r.start = step.start;
    r.end = step.end;
    r.ordinal = ordinal;
    r.trace_id = parent_trace;
    r.parent_id = parent_span;
    r.samples = step.samples;
    r.tokens = step.tokens;
    r.dropped_phases = step.dropped_phases;
    r.micro_batches = step.micro_batches;
    r.skipped = step.skipped;
    r.window = std::move(window);
    r.memory = memory;
    r.phases.reserve(step.phases.size());
    for (const PhaseSpan& p : step.phases) {
        const bool named = modules != nullptr && p.module && p.module < modules->size();
        r.phases.push_back({kPhaseNames[static_cast<int>(p.phase)], p.start, p.end, named ? (*modules)[p.module] : ""});
    }
    return r;
}

bool StepSink::enqueue(StepRecord&& r) {
    if (queue_.size() >= max_pending_) {
        ++metrics_.spans_dropped;
        return false;
    }
    queue_.push_back(std::move(r));
    return queue_.size() == batch_steps_;
}

// As device_timing.DeviceTiming._to_device_times replaces a Python Step's times.
StepAdded StepSink::release(const DeviceTimes* device) {
    StepAdded added;
    if (held_.empty()) return added;
    HeldStep& front = held_.front();
    if (device != nullptr && device->phases.size() != front.step.phases.size())
        throw std::invalid_argument("release(): the device times have another number of phases than the step");
    HeldStep h = std::move(front);
    held_.pop_front();
    if (device != nullptr) {
        h.step.end = h.record.end = device->end;
        for (size_t i = 0; i < device->phases.size(); ++i) {
            h.step.phases[i].start = h.record.phases[i].start = device->phases[i].first;
            h.step.phases[i].end = h.record.phases[i].end = device->phases[i].second;
        }
        if (!h.step.dropped_phases) {  // totals of phases beyond the kept ones stay CPU-measured
            h.step.totals = {};
            h.step.with_total = 0;
            for (const PhaseSpan& p : h.step.phases) {
                const int k = static_cast<int>(p.phase);
                h.step.totals[static_cast<size_t>(k)] += p.end - p.start;
                h.step.with_total = static_cast<uint8_t>(h.step.with_total | (1u << k));
            }
        }
    }
    added.boundary = !h.step.evaluation;
    if (added.boundary) fold(h.step, h.record.trace_id, h.record.ordinal);
    added.wake = enqueue(std::move(h.record));
    return added;
}

// The same arithmetic, in the same order, as StepMetrics._fold (so the floats agree exactly).
void StepSink::fold(const TrackedStep& step, const std::optional<TraceId>& parent_trace, uint64_t ordinal) {
    StepMetricsState& m = metrics_;
    const double seconds = static_cast<double>(step.end - step.start) / 1e9;
    const double end = static_cast<double>(step.end) / 1e9;
    StepExemplar& exemplar = m.exemplars[m.duration.observe(seconds)];
    exemplar.number = step.number;
    exemplar.trace_id = parent_trace;
    exemplar.value = seconds;
    exemplar.at = end;
    ++m.steps;
    if (step.skipped) ++m.skipped;
    for (int k = 0; k < kPhaseCount; ++k) {
        if (step.with_total & (1u << k)) m.phases[static_cast<size_t>(k)].observe(static_cast<double>(step.totals[k]) / 1e9);
    }
    m.last_step = end;
    m.micro_batches += step.micro_batches;
    if (step.samples) {
        m.samples += *step.samples;
        if (seconds > 0) m.samples_rate = static_cast<double>(*step.samples) / seconds;
    }
    if (step.tokens) {
        m.tokens += *step.tokens;
        if (seconds > 0) m.tokens_rate = static_cast<double>(*step.tokens) / seconds;
    }
    folded_ = {step.number, seconds,      step.totals,        step.with_total,
               step.samples, step.tokens, step.micro_batches, ordinal, parent_trace};
}

std::vector<StepRecord> StepSink::take() {
    std::vector<StepRecord> out;
    out.swap(queue_);
    return out;
}

}  // namespace otelprof
