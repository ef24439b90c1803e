#include "otelprof/step_tracker.hpp"

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

namespace otelprof {

namespace {
constexpr int index(Phase p) { return static_cast<int>(p); }
constexpr uint8_t bit(Phase p) { return static_cast<uint8_t>(1u << index(p)); }
}  // namespace

void StepTracker::reset_step() {
    optimized_ = backward_ = scoped_ = updated_ = skipped_ = false;
    forwards_ = nograd_ = last_opt_end_ = pending_ = pending_start_ = cut_ = 0;
    opts_.clear();
}

void StepTracker::reset_batches() {
    samples_.reset();
    tokens_.reset();
    batches_ = 0;
    set_batches_.reset();
    // set_batch() / step(samples=...) replace the sums; set_batch() after the step's update
    // (automatic rules) is for the next step
    set_samples_ = std::exchange(next_samples_, std::nullopt);
    set_tokens_ = std::exchange(next_tokens_, std::nullopt);
}

bool StepTracker::in_stack(Phase phase) const {
    return std::find(stack_.begin(), stack_.end(), phase) != stack_.end();
}

bool StepTracker::forward_is_outermost() {
    std::lock_guard<std::mutex> lock(mutex_);
    return depth_[index(Phase::kForward)] == 0 && depth_[index(Phase::kBackward)] == 0;
}

int64_t StepTracker::eval_forwards() {
    std::lock_guard<std::mutex> lock(mutex_);
    return eval_forwards_;
}

void StepTracker::phase_begin(Phase phase, int64_t now, uint64_t key, bool grad, uint32_t module) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int p = index(phase);
    if (phase == Phase::kForward && depth_[index(Phase::kBackward)]) {
        ++recompute_;  // autograd recomputes it (checkpointing): backward's time
        return;
    }
    if (depth_[p] && phase == Phase::kData) {  // the last fetch never ended: forget it
        depth_[p] = 0;
        const auto it = std::find(stack_.begin(), stack_.end(), phase);
        if (it != stack_.end()) stack_.erase(it);
    }
    if (depth_[p]) {
        ++depth_[p];  // a nested call (a submodule's forward): counted once
        if (phase == Phase::kOptimizer) opt_inner_ = true;  // the optimizer stepped inside a scaler's step
        return;
    }
    if (phase == Phase::kForward) forward_seen();
    if (!stack_.empty()) {
        const Phase top = stack_.back();  // pauses while this one runs inside it
        // an empty stretch since it resumed (between a closure's forward and backward) is none
        if (!untimed_[index(top)] && now > phase_start_[index(top)])
            interval(top, phase_start_[index(top)], now, module_[index(top)]);
    } else if (decide(phase, key, grad, now)) {
        untimed_[p] = true;
        depth_[p] = 1;
        ++eval_forwards_;
        return;
    }
    if (!current_ && !stack_.empty()) {
        untimed_[p] = true;  // inside an untimed call
    } else {
        if (!current_) open(now);
        untimed_[p] = false;
    }
    stack_.push_back(phase);
    depth_[p] = 1;
    phase_start_[p] = now;
    module_[p] = module;
    if (phase == Phase::kForward) {
        ++forwards_;
        if (!grad) ++nograd_;
    } else if (phase == Phase::kBackward) {
        backward_ = backward_seen_ = true;
    } else if (phase == Phase::kOptimizer) {
        opt_key_ = key;
        opt_inner_ = false;
    }
}

bool StepTracker::decide(Phase phase, uint64_t key, bool grad, int64_t now) {
    if (phase == Phase::kData) {
        on_data_fetch(now);
    } else if (phase == Phase::kForward && !grad) {
        const bool had = current_.has_value();
        if (had && optimized_ && !scoped_ && !explicit_) return after_update(now);
        if (!had || optimized_ || (current_->phases.empty() && !scoped_)) {
            if (had && !scoped_ && !explicit_) discard();  // a step opened at the last update, nothing in it yet
            return !had || !scoped_;
        }
    } else if (phase == Phase::kOptimizer && current_ && !explicit_ &&
               std::find(opts_.begin(), opts_.end(), key) != opts_.end()) {
        split();
    }
    return false;
}

// A no-grad forward after the step's update: the step's own (false) while no more than it usually
// has, else evaluation (true) from the first beyond the last step's count on.
bool StepTracker::after_update(int64_t now) {
    if (++pending_ == 1) pending_start_ = now;
    if (pending_ == kept_ + 1) cut_ = now;
    const int64_t batches = std::max<int64_t>(1, batches_);
    const int64_t per_batch = (forwards_ - nograd_ + batches - 1) / batches;  // training forwards
    if (pending_ <= std::max<int64_t>({1, kept_, per_batch})) return false;
    eval_forwards_ += pending_ - 1 - kept_;  // this one: the caller's
    pending_ = kept_;
    cut_phases(cut_);
    close(cut_);
    return true;
}

void StepTracker::phase_end(Phase phase, int64_t now) {
    std::lock_guard<std::mutex> lock(mutex_);
    phase_end_locked(phase, now);
}

void StepTracker::update_end(int64_t now) {
    std::lock_guard<std::mutex> lock(mutex_);
    skip_ = depth_[index(Phase::kOptimizer)] == 1 && !opt_inner_;
    phase_end_locked(Phase::kOptimizer, now);
    skip_ = false;
}

bool StepTracker::phase_end_locked(Phase phase, int64_t now) {
    const int p = index(phase);
    if (phase == Phase::kForward && recompute_) {
        --recompute_;
        return false;
    }
    if (depth_[p] == 0) return false;  // began before instrumentation
    if (--depth_[p]) return false;
    const auto it = std::find(stack_.begin(), stack_.end(), phase);
    if (it != stack_.end()) stack_.erase(it);
    if (phase == Phase::kBackward) recompute_ = 0;  // a recomputed forward's end that never came
    if (untimed_[p]) {
        untimed_[p] = false;
        return true;
    }
    now = std::max(now, phase_start_[p]);  // threads read the clock before taking the lock
    interval(phase, phase_start_[p], now, module_[p]);
    if (!stack_.empty()) {
        phase_start_[index(stack_.back())] = now;  // the paused phase resumes
    } else if (phase == Phase::kOptimizer && current_) {
        optimizer_done(now);
    }
    return true;
}

void StepTracker::interval(Phase phase, int64_t start, int64_t end, uint32_t module) {
    if (!current_) return;
    TrackedStep& step = *current_;
    step.totals[index(phase)] += end - start;
    step.with_total |= bit(phase);
    if (step.phases.size() < kMaxPhaseSpans) {
        step.phases.push_back(PhaseSpan{phase, start, end, module});
    } else {
        ++step.dropped_phases;
    }
}

void StepTracker::optimizer_done(int64_t now) {
    optimized_ = optimizer_seen_ = true;
    (skip_ ? skipped_ : updated_) = true;
    last_opt_end_ = now;
    if (std::find(opts_.begin(), opts_.end(), opt_key_) == opts_.end() && opts_.size() < kMaxOptimizers)
        opts_.push_back(opt_key_);
    if (dataloader_ || explicit_ || !known_) return;
    for (uint64_t k : *known_) {
        if (std::find(opts_.begin(), opts_.end(), k) == opts_.end()) return;
    }
    close(now);  // every optimizer of an update has stepped: the update is done
    open(now);   // the loop's tail (zero_grad, logging) belongs to the next step
}

void StepTracker::forward_seen() {
    ++forwards_seen_;
    const int64_t due = backward_seen_ ? kHintTrainingForwards : kHintForwards;
    if (!hinted_ && forwards_seen_ >= due && !optimizer_seen_ && !explicit_) {
        hinted_ = true;
        outbox_.hint = forwards_seen_;
        has_outbox_ = true;
    }
}

void StepTracker::data_end(int64_t now, bool batch, int64_t samples, int64_t tokens) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!phase_end_locked(Phase::kData, now)) return;
    if (batch) {
        ++batches_;
        if (samples >= 0) samples_ = samples_.value_or(0) + samples;
        if (tokens >= 0) tokens_ = tokens_.value_or(0) + tokens;
    } else if (current_ && !(forwards_ || backward_ || optimized_ || batches_ || scoped_)) {
        discard();  // the DataLoader was exhausted: no step begins here
    }
}

void StepTracker::set_batch(int64_t samples, int64_t tokens) {
    std::lock_guard<std::mutex> lock(mutex_);
    const bool later = optimized_ && !explicit_;  // after the update: the next step's
    if (samples >= 0) (later ? next_samples_ : set_samples_) = samples;
    if (tokens >= 0) (later ? next_tokens_ : set_tokens_) = tokens;
}

void StepTracker::step(int64_t now, int64_t number, int64_t samples, int64_t tokens, int64_t micro_batches) {
    std::lock_guard<std::mutex> lock(mutex_);
    explicit_ = true;
    if (samples >= 0) set_samples_ = samples;
    if (tokens >= 0) set_tokens_ = tokens;
    if (micro_batches >= 0) set_batches_ = micro_batches;
    if (!current_) open(boundary_ ? *boundary_ : now);
    close(now, number);
    boundary_ = now;
}

void StepTracker::begin_scope(uint32_t name, int64_t now, bool evaluation) {
    std::lock_guard<std::mutex> lock(mutex_);
    explicit_ = true;
    std::optional<std::tuple<std::optional<int64_t>, std::optional<int64_t>, int64_t>> fetched;
    if (current_) {
        if (backward_ || optimized_) {
            close(now);  // training since the last boundary is a step of its own
        } else {
            if (!forwards_) fetched.emplace(samples_, tokens_, batches_);  // a fetch just before: the scope's batch
            discard();
        }
    }
    open(now);
    if (fetched) std::tie(samples_, tokens_, batches_) = *fetched;
    current_->name = name;
    current_->evaluation = evaluation;
    scoped_ = true;
}

void StepTracker::end_scope(int64_t now) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!current_) return;
    close(now);
    boundary_ = now;
}

void StepTracker::finish() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (current_ && optimized_ && !scoped_) {
        if (pending_) {  // no-grad forwards after the last update: evaluation
            eval_forwards_ += pending_;
            pending_ = 0;
            cut_phases(pending_start_);
        }
        close(last_opt_end_);
    } else if (current_) {
        discard();
    }
}

int64_t StepTracker::abandon() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (current_) discard();
    return next_number_++;
}

void StepTracker::resume(int64_t at, int64_t now) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stack_.empty() || now <= at) return;
    const int p = index(stack_.back());
    if (!untimed_[p] && phase_start_[p] == at) phase_start_[p] = now;
}

void StepTracker::take(TrackerOutbox& out) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!has_outbox_) return;
    if (outbox_.first_open) out.first_open = outbox_.first_open;
    if (outbox_.hint) out.hint = outbox_.hint;
    for (TrackedStep& s : outbox_.closed) out.closed.push_back(std::move(s));
    outbox_.closed.clear();
    outbox_.first_open.reset();
    outbox_.hint.reset();
    has_outbox_ = false;
}

void StepTracker::on_data_fetch(int64_t now) {
    dataloader_ = true;
    if (!current_ || scoped_) return;
    if (optimized_ && !explicit_) {
        close(now);
    } else if (forwards_ && !backward_) {
        discard();  // forward-only work since the step began: evaluation batches
    }  // else: another micro-batch of this step (or a batch fetched ahead)
}

void StepTracker::open(int64_t now) {
    current_.emplace();
    current_->start = current_->end = now;
    reset_step();
    if (!opened_) {
        opened_ = true;
        outbox_.first_open = next_number_;
        has_outbox_ = true;
    }
}

void StepTracker::discard() {
    eval_forwards_ += nograd_;
    current_.reset();
    reset_step();
    reset_batches();
}

std::vector<PhaseSpan> StepTracker::cut_phases(int64_t cut) {
    TrackedStep& step = *current_;
    std::vector<PhaseSpan> moved, kept;
    for (const PhaseSpan& s : step.phases) (s.start >= cut ? moved : kept).push_back(s);
    step.phases = std::move(kept);
    for (const PhaseSpan& s : moved) step.totals[index(s.phase)] -= s.end - s.start;
    for (int k = 0; k < kPhaseCount; ++k) {
        const Phase phase = static_cast<Phase>(k);
        if (!(step.with_total & bit(phase)) || step.dropped_phases) continue;
        const bool left = std::any_of(step.phases.begin(), step.phases.end(),
                                      [phase](const PhaseSpan& s) { return s.phase == phase; });
        if (!left) {  // none of its intervals is left
            step.with_total &= static_cast<uint8_t>(~bit(phase));
            step.totals[k] = 0;
        }
    }
    return moved;
}

void StepTracker::split() {
    const int64_t cut = last_opt_end_;
    const std::vector<PhaseSpan> moved = cut_phases(cut);
    pending_ = 0;  // moved along
    close(cut);
    open(cut);
    for (const PhaseSpan& s : moved) {
        interval(s.phase, s.start, s.end, s.module);
        if (s.phase == Phase::kForward) {
            ++forwards_;
        } else if (s.phase == Phase::kBackward) {
            backward_ = true;
        }
    }
}

void StepTracker::close(int64_t end, int64_t number) {
    if (!current_) return;
    TrackedStep step = std::move(*current_);
    current_.reset();
    step.end = std::max(end, step.start);
    if (step.evaluation) {  // takes the next training step's number, counts its forwards
        step.number = next_number_;
        eval_forwards_ += forwards_;
    } else {
        step.number = number >= 0 ? number : next_number_;
        next_number_ = step.number + 1;
    }
    step.samples = set_samples_ ? set_samples_ : samples_;
    step.tokens = set_tokens_ ? set_tokens_ : tokens_;
    step.micro_batches = set_batches_ ? *set_batches_ : batches_;
    step.skipped = skipped_ && !updated_;
    if (!opts_.empty()) known_ = opts_;
    kept_ = pending_;
    reset_step();
    reset_batches();
    // phases still running (a forward that spans the boundary) continue into the next step
    outbox_.closed.push_back(std::move(step));
    has_outbox_ = true;
}

}  // namespace otelprof
