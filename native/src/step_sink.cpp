#include "otelprof/step_sink.hpp"

#include <algorithm>
#include <stdexcept>
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
    const uint64_t ordinal = ordinal_;
    ordinal_ += 1 + step.phases.size();
    std::string window;  // an evaluation span carries no mark and leaves the next step's in place
    if (!step.evaluation) window.swap(window_);
    if (max_held_ > 0) {  // device-timed: its ids and mark are taken now, the rest at release()
        held_.push_back({step, make_record(step, name, ordinal, parent_trace, parent_span, std::move(window), modules)});
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
    added.wake = enqueue(make_record(step, name, ordinal, parent_trace, parent_span, std::move(window), modules));
    return added;
}

StepRecord StepSink::make_record(const TrackedStep& step, const std::string& name, uint64_t ordinal,
                                 const std::optional<TraceId>& parent_trace, const std::optional<SpanId>& parent_span,
                                 std::string window, const std::vector<std::string>* modules) const {
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
