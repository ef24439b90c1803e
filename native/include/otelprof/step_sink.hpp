// Where a CPU-timed step goes once the tracker closes it (otelprof/capture/step_metrics.py and
// step_spans.py, native side): folded into the step metrics and queued for its span, without
// a Python object per step (those cost a small model's training thread ~1 us each in
// allocation and garbage collection). Not thread-safe: the binding calls it under the GIL.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
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
    int64_t samples = 0, tokens = 0, micro_batches = 0;
    std::optional<double> last_step, samples_rate, tokens_rate;
};

class StepSink {
  public:
    StepSink(size_t max_pending, size_t batch_steps) : max_pending_(max_pending), batch_steps_(batch_steps) {}

    // A closed step, its name, the application span it nests under (if any) and what it was to
    // a profiling window (StepRecord::window): folded into the metrics, queued for its span
    // (dropped and counted when max_pending wait). True when the queue has reached batch_steps
    // (time to wake the encoder). `modules`: the phases' module names by slot (PhaseSpan::module).
    bool add(const TrackedStep& step, const std::string& name, const std::optional<TraceId>& parent_trace,
             const std::optional<SpanId>& parent_span, const std::string& window = std::string(),
             const std::vector<std::string>* modules = nullptr);

    // Read under the caller's lock (the GIL): copy it before making Python objects.
    const StepMetricsState& metrics() const { return metrics_; }
    std::vector<StepRecord> take();
    size_t pending() const { return queue_.size(); }
    // The step queued last (capture/windows.py reads a profiled step's span ids right after add).
    const StepRecord* last() const { return queue_.empty() ? nullptr : &queue_.back(); }
    // After fork(): the child starts with no queued spans (its parent ships them).
    void clear_queue() { queue_.clear(); }

  private:
    void fold(const TrackedStep& step, const std::optional<TraceId>& parent_trace);

    size_t max_pending_, batch_steps_;
    uint64_t ordinal_ = 0;  // span id ordinals: a step's span, then one per phase interval
    StepMetricsState metrics_;
    std::vector<StepRecord> queue_;
};

}  // namespace otelprof
