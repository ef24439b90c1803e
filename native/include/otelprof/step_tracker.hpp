// Step boundaries and phases from a training loop's activity: the rules of
// otelprof/capture/steps/tracker.py (its docstring states them), in C++ because the hooks fire several
// times per step and each Python-level event cost ~1.5 us on a small model's training thread.
// Pure state machine: the caller passes the time of each event and takes the closed steps (and
// the first opening, the hint) from the outbox afterwards, so no callback runs while the state
// changes.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

namespace otelprof {

enum class Phase : uint8_t { kData = 0, kForward = 1, kBackward = 2, kOptimizer = 3 };
constexpr int kPhaseCount = 4;
// Phase intervals kept per step (gradient accumulation and closures make several); later ones
// are counted.
constexpr size_t kMaxPhaseSpans = 64;
// Distinct optimizers told apart per step.
constexpr size_t kMaxOptimizers = 16;
// Forwards with no optimizer step and no explicit step before the hint; once a backward has run
// (gradient accumulation runs many before the first update), kHintTrainingForwards.
constexpr int64_t kHintForwards = 10;
constexpr int64_t kHintTrainingForwards = 256;

struct PhaseSpan {
    Phase phase;
    int64_t start = 0, end = 0;
    uint32_t module = 0;  // a forward's root module: the caller's name slot (0: unknown)
};

struct TrackedStep {
    int64_t number = -1;  // numbered when it closes: discarded steps take none
    int64_t start = 0, end = 0;
    std::vector<PhaseSpan> phases;  // in order
    std::array<int64_t, kPhaseCount> totals{};
    uint8_t with_total = 0;  // bit per phase that has a total
    int64_t dropped_phases = 0;
    std::optional<int64_t> samples, tokens;
    int64_t micro_batches = 0;  // DataLoader batches fetched in the step
    uint32_t name = 0;  // the caller's name slot: 0 is the default, step_scope()s set theirs
    bool evaluation = false;  // begin_scope(evaluation): a span, not a training step
    bool skipped = false;     // its optimizer update was skipped (a gradient scaler found inf/NaN)
};

// What an event left for the caller: steps that closed, in order, the number of the first step
// when the first step opened, and the forwards seen when the hint is due.
struct TrackerOutbox {
    std::vector<TrackedStep> closed;
    std::optional<int64_t> first_open;
    std::optional<int64_t> hint;
    bool empty() const { return closed.empty() && !first_open && !hint; }
};

class StepTracker {
  public:
    explicit StepTracker(int64_t first_step = 0) : next_number_(first_step) {}

    // Every event takes the lock only for the state change (callers hold no other lock).
    // `key` tells optimizers apart; `grad`: a forward under grad mode (false: evaluation).
    // `module`: a forward's root module, as the caller's name slot (0: unknown).
    void phase_begin(Phase phase, int64_t now, uint64_t key = 0, bool grad = true, uint32_t module = 0);
    void phase_end(Phase phase, int64_t now);
    // The end of the optimizer phase a gradient scaler's step opened: a skipped update when no
    // optimizer step ran inside it.
    void update_end(int64_t now);
    // The end of a fetch: with a batch of these sizes (negative: unknown), or none (exhausted).
    void data_end(int64_t now, bool batch, int64_t samples, int64_t tokens);
    void set_batch(int64_t samples, int64_t tokens);
    // `number`, `samples`, `tokens`: negative when not given.
    void step(int64_t now, int64_t number = -1, int64_t samples = -1, int64_t tokens = -1, int64_t micro_batches = -1);
    void begin_scope(uint32_t name, int64_t now, bool evaluation = false);
    void end_scope(int64_t now);
    void finish();
    // An error ended the open step and its span was made elsewhere (an out-of-memory step's):
    // the step is dropped (no boundary, no finish() closes it) and its number taken, returned.
    int64_t abandon();
    // The callbacks of the last event (at `at`: a closed step, the first opening) ran until
    // `now`: the phase that began at `at` restarts at `now`, so their cost (the profiler's step,
    // where a window starts or stops) is no phase's; the step keeps its boundary.
    void resume(int64_t at, int64_t now);
    // Whether a forward now would need grad mode read (an outermost forward, not recomputed).
    bool forward_is_outermost();
    int64_t eval_forwards();

    // Moves what the events since the last call left into `out` (appended).
    void take(TrackerOutbox& out);
    bool pending() const { return has_outbox_; }

  private:
    bool phase_end_locked(Phase phase, int64_t now);
    bool decide(Phase phase, uint64_t key, bool grad, int64_t now);
    bool after_update(int64_t now);
    std::vector<PhaseSpan> cut_phases(int64_t cut);
    void interval(Phase phase, int64_t start, int64_t end, uint32_t module = 0);
    void optimizer_done(int64_t now);
    void forward_seen();
    void on_data_fetch(int64_t now);
    void open(int64_t now);
    void discard();
    void split();
    void close(int64_t end, int64_t number = -1);
    void reset_step();
    void reset_batches();
    bool in_stack(Phase phase) const;

    std::mutex mutex_;
    int64_t next_number_;
    std::optional<TrackedStep> current_;
    std::vector<Phase> stack_;  // running phases, innermost last
    std::array<int, kPhaseCount> depth_{};
    std::array<int64_t, kPhaseCount> phase_start_{};
    std::array<bool, kPhaseCount> untimed_{};  // an outermost call timed in no step
    std::array<uint32_t, kPhaseCount> module_{};  // the running call's module slot
    uint64_t opt_key_ = 0;
    bool explicit_ = false;    // the application calls step() / step_scope()
    bool dataloader_ = false;  // a DataLoader iterator has been seen
    bool opened_ = false;      // the first step has opened
    std::optional<std::vector<uint64_t>> known_;  // the optimizers of the last step that had some
    std::optional<int64_t> boundary_;  // the last explicit boundary
    int64_t forwards_seen_ = 0;
    bool optimizer_seen_ = false, hinted_ = false, backward_seen_ = false;
    int64_t eval_forwards_ = 0;
    int recompute_ = 0;        // forwards running inside a backward (recomputation)
    bool opt_inner_ = false;   // an optimizer step ran inside the running optimizer phase
    bool skip_ = false;        // the optimizer phase ending now is an update the scaler skipped
    int64_t kept_ = 0;         // no-grad forwards after the update the last step kept as its own
    // the current step's work
    bool optimized_ = false, backward_ = false, scoped_ = false;
    bool updated_ = false, skipped_ = false;  // an update in it ran / was skipped
    int64_t forwards_ = 0, nograd_ = 0, last_opt_end_ = 0;
    // no-grad forwards after its update (its own unless evaluation), when the first began, and
    // when the one after those the last step kept began
    int64_t pending_ = 0, pending_start_ = 0, cut_ = 0;
    std::vector<uint64_t> opts_;
    // the current step's batches
    std::optional<int64_t> samples_, tokens_, set_samples_, set_tokens_;
    int64_t batches_ = 0;
    std::optional<int64_t> set_batches_;  // step(micro_batches=...): replaces the fetch count
    std::optional<int64_t> next_samples_, next_tokens_;  // set_batch() after the update
    TrackerOutbox outbox_;
    bool has_outbox_ = false;
};

}  // namespace otelprof
