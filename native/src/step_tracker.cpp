#include "otelprof/step_tracker.hpp"

#include <algorithm>
#include <utility>

namespace otelprof {

namespace {
constexpr int index(Phase p) { return static_cast<int>(p); }
}  // namespace

void StepTracker::phase_begin(Phase phase, int64_t now) {
    std::lock_guard<std::mutex> lock(mutex_);
    int& depth = depth_[index(phase)];
    if (depth && current_ && !pending_end_ && phase != Phase::kData) {
        ++depth;  // a nested call (a submodule's forward): counted by its outermost call
        return;
    }
    if (phase == Phase::kData) {
        on_data_fetch(now);
    } else if ((phase == Phase::kForward || phase == Phase::kBackward) && pending_end_) {
        const int64_t end = *pending_end_;
        close(end);
        open(end);  // the loop's tail (logging, zero_grad) belongs to the next step
    }
    if (!current_) open(now);
    if (depth == 0) phase_start_[index(phase)] = now;
    ++depth;
}

void StepTracker::phase_end(Phase phase, int64_t now) {
    std::lock_guard<std::mutex> lock(mutex_);
    phase_end_locked(phase, now);
}

void StepTracker::data_end(int64_t now, int64_t samples, int64_t tokens) {
    std::lock_guard<std::mutex> lock(mutex_);
    phase_end_locked(Phase::kData, now);
    if (samples >= 0) samples_ = samples;
    if (tokens >= 0) tokens_ = tokens;
}

void StepTracker::set_batch(int64_t samples, int64_t tokens) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (samples >= 0) samples_ = samples;
    if (tokens >= 0) tokens_ = tokens;
}

void StepTracker::phase_end_locked(Phase phase, int64_t now) {
    int& depth = depth_[index(phase)];
    if (depth == 0) return;  // began before instrumentation
    --depth;
    if (depth || !current_) return;
    const int64_t start = phase_start_[index(phase)];
    now = std::max(now, start);  // threads read the clock before taking the lock
    TrackedStep& step = *current_;
    const uint8_t bit = static_cast<uint8_t>(1u << index(phase));
    step.totals[index(phase)] += now - start;
    step.with_total |= bit;
    if (step.phases.size() < kMaxPhaseSpans) {
        step.phases.push_back(PhaseSpan{phase, start, now});
    } else {
        ++step.dropped_phases;
    }
    if (phase == Phase::kOptimizer) {
        optimized_ = true;
        if (!dataloader_ && !explicit_) pending_end_ = now;
    }
}

void StepTracker::step(int64_t now) {
    std::lock_guard<std::mutex> lock(mutex_);
    explicit_ = true;
    if (!current_) open(now);
    close(now);
    open(now);
}

void StepTracker::begin_scope(uint32_t name, int64_t now) {
    std::lock_guard<std::mutex> lock(mutex_);
    explicit_ = true;
    if (current_ && !current_->phases.empty()) close(now);  // work since the last boundary is a step
    open(now);
    current_->name = name;
}

void StepTracker::end_scope(int64_t now) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (current_) close(now);
}

void StepTracker::finish(int64_t now) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pending_end_) {
        close(*pending_end_);
    } else if (current_ && optimized_) {
        close(now);
    }
    current_.reset();
}

void StepTracker::take(TrackerOutbox& out) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!has_outbox_) return;
    if (outbox_.first_open) out.first_open = outbox_.first_open;
    for (TrackedStep& s : outbox_.closed) out.closed.push_back(std::move(s));
    outbox_.closed.clear();
    outbox_.first_open.reset();
    has_outbox_ = false;
}

void StepTracker::on_data_fetch(int64_t now) {
    dataloader_ = true;
    pending_end_.reset();
    if (explicit_ || !current_) return;
    if (optimized_) {
        close(now);
    } else {
        current_.reset();  // no training since the last fetch: start over here
    }
}

void StepTracker::open(int64_t now) {
    current_.emplace();
    current_->start = current_->end = now;
    optimized_ = false;
    if (!opened_) {
        opened_ = true;
        outbox_.first_open = next_number_;
        has_outbox_ = true;
    }
}

void StepTracker::close(int64_t end) {
    pending_end_.reset();
    if (!current_) return;
    TrackedStep step = std::move(*current_);
    current_.reset();
    step.end = std::max(end, step.start);
    step.number = next_number_++;
    step.samples = samples_;
    step.tokens = tokens_;
    samples_.reset();
    tokens_.reset();
    // phases still running (a forward that spans the boundary) continue into the next step
    outbox_.closed.push_back(std::move(step));
    has_outbox_ = true;
}

}  // namespace otelprof
