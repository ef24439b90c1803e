#include "otelprof/step_sink.hpp"

#include <algorithm>
#include <utility>

namespace otelprof {

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
    if (!step.evaluation) fold(step, parent_trace);
    const uint64_t ordinal = ordinal_;
    ordinal_ += 1 + step.phases.size();
    std::string window;  // an evaluation span carries no mark and leaves the next step's in place
    if (!step.evaluation) {
        window.swap(window_);
        const double seconds = static_cast<double>(step.end - step.start) / 1e9;
        folded_ = {step.number, seconds,      step.totals,        step.with_total,
                   step.samples, step.tokens, step.micro_batches, ordinal, parent_trace};
    }
    if (queue_.size() >= max_pending_) {
        ++metrics_.spans_dropped;
        return added;
    }
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
    r.window = std::move(window);
    r.phases.reserve(step.phases.size());
    for (const PhaseSpan& p : step.phases) {
        const bool named = modules != nullptr && p.module && p.module < modules->size();
        r.phases.push_back({kPhaseNames[static_cast<int>(p.phase)], p.start, p.end, named ? (*modules)[p.module] : ""});
    }
    queue_.push_back(std::move(r));
    added.wake = queue_.size() == batch_steps_;
    return added;
}

// The same arithmetic, in the same order, as StepMetrics._fold (so the floats agree exactly).
void StepSink::fold(const TrackedStep& step, const std::optional<TraceId>& parent_trace) {
    StepMetricsState& m = metrics_;
    const double seconds = static_cast<double>(step.end - step.start) / 1e9;
    const double end = static_cast<double>(step.end) / 1e9;
    StepExemplar& exemplar = m.exemplars[m.duration.observe(seconds)];
    exemplar.number = step.number;
    exemplar.trace_id = parent_trace;
    exemplar.value = seconds;
    exemplar.at = end;
    ++m.steps;
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
}

std::vector<StepRecord> StepSink::take() {
    std::vector<StepRecord> out;
    out.swap(queue_);
    return out;
}

}  // namespace otelprof
