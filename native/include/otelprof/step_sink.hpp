// Where a step goes once the tracker closes it (otelprof/capture/metrics/step_metrics.py and
// spans/step_spans.py, native side): folded into the step metrics and queued for its span,
// without a Python object per step (those cost a small model's training thread ~1 us each in
// allocation and garbage collection), with the profiling-window mark the session set for it.
// Not thread-safe: the binding calls it under the GIL.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "otelprof/spans.hpp"
#include "otelprof/step_spans.hpp"
#include "otelprof/step_tracker.hpp"

namespace otelprof {

// step_metrics.STEP_BUCKETS: from 1 ms to 10 minutes (seconds); the last bucket is +Inf.
constexpr std::array<double, 18> kStepBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                 1,     2.5,    5,     10,   30,    60,   120,  300, 600};
constexpr size_t kStepBucketCount = kStepBuckets.size() + 1;

// A step-duration exemplar: the step's own trace (hashed from its number by the caller at scrape
// time) or the application span's trace it nested under.
struct StepExemplar {
    int64_t number = -1;  // -1: none yet
    std::optional<TraceId> trace_id;
    double value = 0, at = 0;  // seconds; Unix time of the step's end
};

struct StepHistogram {
    std::array<uint64_t, kStepBucketCount> counts{};  // per bucket (cumulated at scrape)
    double sum = 0;
    // the bucket `value` falls in: the first bound >= value (Python's bisect_left), else +Inf
    size_t observe(double value);
};

struct StepMetricsState {
    StepHistogram duration;
    std::array<StepExemplar, kStepBucketCount> exemplars;  // latest per duration bucket
    std::array<StepHistogram, kPhaseCount> phases;
    uint64_t steps = 0, spans_dropped = 0;
    uint64_t skipped = 0;  // steps whose update was skipped (counted in steps too)
    int64_t samples = 0, tokens = 0, micro_batches = 0;
    std::optional<double> last_step, samples_rate, tokens_rate;
};

// The training step folded last, for what the caller records per step beside the sink (the
// OTLP metrics): its duration, phase totals and sizes, and its span's ids.
struct StepFolded {
    int64_t number = -1;  // -1: none yet
    double seconds = 0;
    std::array<int64_t, kPhaseCount> totals{};  // ns per phase
    uint8_t with_total = 0;                     // bit per phase that has a total
    std::optional<int64_t> samples, tokens;
    int64_t micro_batches = 0;
    uint64_t ordinal = 0;              // its span's id ordinal
    std::optional<TraceId> trace_id;  // the application span's; else the step's own
};

// The process's resident high-water mark per training step: the twin of
// capture/memory/peaks.py's ResidentPeaks (its docstring gives the rule), read by the sink itself
// so that a CPU step's memory costs no Python call. Reset by writing "5" to /proc/self/clear_refs
// (fds opened once, again after fork); where those cannot be opened, the current RSS.
class ResidentPeaks {
  public:
    static constexpr int64_t kCheckEvery = 16;  // memory_peaks.CHECK_EVERY
    ResidentPeaks() = default;
    ResidentPeaks(const ResidentPeaks&) = delete;
    ResidentPeaks& operator=(const ResidentPeaks&) = delete;
    ~ResidentPeaks() { stop(); }
    // Opens the files, reads once (the first step's peak starts now) and compares the marks.
    // "" or why the files could not be opened (the readings are then the current RSS).
    std::string start();
    void stop();
    bool on() const { return on_; }
    bool exact() const { return exact_; }
    // The step's resident peak (bytes); the high-water mark then restarts from now.
    std::optional<int64_t> read();
    // KiB: the lifetime high-water mark the resets took away (the process's, kept across sinks).
    static int64_t kept_kib();
    // VmHWM (KiB) from /proc/<pid>/status text, as memory_peaks.vm_hwm_kib parses it.
    static std::optional<int64_t> vm_hwm_kib(const std::string& status);
    static std::optional<int64_t> current_rss();

  private:
    bool open(std::string* error);
    void close_fds();
    bool vm_hwm(std::optional<int64_t>& out);  // false: the read failed (OSError)
    bool check(std::optional<int64_t>& out);   // memory_peaks' _check; false: the read failed

    int status_ = -1, clear_ = -1;
    uint64_t forks_ = 0;  // forks seen when the files were opened (after one: the parent's files)
    bool on_ = false, exact_ = false;
    int64_t steps_ = 0;
};

// What add() asks of its caller.
struct StepAdded {
    bool wake = false;      // the queue has reached batch_steps: time to wake the encoder
    bool boundary = false;  // a training step ended: the session's per-step work runs (an
                            // evaluation span is none), and the next step's mark is set
    bool held = false;      // the step is held for its device times (hold()): time to release
};

// A step held for its device times: what it closed with, and its span (ids and mark taken).
struct HeldStep {
    TrackedStep step;
    StepRecord record;
};

// A held step's device times: its end and its phase intervals, in order (ns).
struct DeviceTimes {
    int64_t end = 0;
    std::vector<std::pair<int64_t, int64_t>> phases;
};

class StepSink {
  public:
    StepSink(size_t max_pending, size_t batch_steps) : max_pending_(max_pending), batch_steps_(batch_steps) {}

    // A closed step, its name and the application span it nests under (if any): folded into the
    // metrics (not an evaluation), queued for its span (dropped and counted when max_pending
    // wait). A training step takes the window mark set for it (set_window) and clears it; an
    // evaluation span carries none and leaves it for the next training step.
    // `modules`: the phases' module names by slot (PhaseSpan::module).
    StepAdded add(const TrackedStep& step, const std::string& name, const std::optional<TraceId>& parent_trace,
                  const std::optional<SpanId>& parent_span, const std::vector<std::string>* modules = nullptr);
    // The profiling-window mark of the step beginning now (StepRecord::window; "": none), decided
    // when it begins and put on its span when it closes (so no span thread can take the step's
    // record before it is marked).
    void set_window(std::string window) { window_ = std::move(window); }
    // The memory peaks of the training step closing next (read just before add(), as its span
    // must have them before any span thread can take its record); taken by that step.
    void set_memory(const StepMemory& memory) { memory_ = memory; }
    // The memory the last training step took (with its resident peak when resident is on).
    const std::optional<StepMemory>& last_memory() const { return last_memory_; }
    // On (start()): each training step's resident peak is read in add(), replacing set_memory's.
    ResidentPeaks resident;
    // Span id ordinals for `count` spans made elsewhere (an out-of-memory step's): the first.
    uint64_t reserve(size_t count) {
        const uint64_t first = ordinal_;
        ordinal_ += count;
        return first;
    }

    // Device-timed steps (capture/steps/device_timing.py): from now on add() holds each closed
    // step (its span ids and window mark taken, nothing folded or queued) until release(); past
    // `max_held` held steps the oldest is released with its CPU times (counted: held_overflows).
    void hold(size_t max_held) { max_held_ = max_held; }
    // The oldest held step (its CPU times), or nullptr.
    const HeldStep* held() const { return held_.empty() ? nullptr : &held_.front(); }
    size_t held_count() const { return held_.size(); }
    uint64_t held_overflows() const { return held_overflows_; }
    // The oldest held step, folded and queued as add() does a CPU-timed one: with `device`, its
    // end and phase intervals replaced (and, unless it dropped phases, its phase totals summed
    // from them), else with its CPU times. Throws std::invalid_argument (nothing released) when
    // `device` has another number of phases. boundary: it was a training step.
    StepAdded release(const DeviceTimes* device);

    // Read under the caller's lock (the GIL): copy it before making Python objects.
    const StepMetricsState& metrics() const { return metrics_; }
    const StepFolded& folded() const { return folded_; }
    std::vector<StepRecord> take();
    size_t pending() const { return queue_.size(); }
    // The step queued last (capture/windows/profiling.py reads a profiled step's span ids right after add).
    // Held steps first: the newest step is the last held while any is.
    const StepRecord* last() const {
        if (!held_.empty()) return &held_.back().record;
        return queue_.empty() ? nullptr : &queue_.back();
    }
    // After fork(): the child starts with no queued or held spans (its parent ships them).
    void clear_queue() {
        queue_.clear();
        held_.clear();
    }

  private:
    void fold(const TrackedStep& step, const std::optional<TraceId>& parent_trace, uint64_t ordinal);
    StepRecord make_record(const TrackedStep& step, const std::string& name, uint64_t ordinal,
                           const std::optional<TraceId>& parent_trace, const std::optional<SpanId>& parent_span,
                           std::string window, const std::vector<std::string>* modules,
                           const StepMemory& memory) const;
    // Queues a record (dropped and counted when max_pending wait); wake: a batch is due.
    bool enqueue(StepRecord&& r);

    size_t max_pending_, batch_steps_;
    uint64_t ordinal_ = 0;  // span id ordinals: a step's span, then one per phase interval
    StepMetricsState metrics_;
    StepFolded folded_;
    std::vector<StepRecord> queue_;
    std::string window_;
    StepMemory memory_;
    std::optional<StepMemory> last_memory_;
    size_t max_held_ = 0;  // 0: CPU-timed, nothing held
    uint64_t held_overflows_ = 0;
    std::deque<HeldStep> held_;
};

}  // namespace otelprof
