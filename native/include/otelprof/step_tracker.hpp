// Step boundaries and phases from a training loop's activity: the rules of
// otelprof/capture/steps.py (its docstring states them), in C++ because the hooks fire several
// times per step and each Python-level event cost ~1.5 us on a small model's training thread.
// Pure state machine: the caller passes the time of each event and takes the closed steps (and
// the first opening) from the outbox afterwards, so no callback runs while the state changes.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

namespace otelprof {

enum class Phase : uint8_t { kData = 0, kForward = 1, kBackward = 2, kOptimizer = 3 };
constexpr int kPhaseCount = 4;
// Phase intervals kept per step (gradient accumulation makes several); later ones are counted.
constexpr size_t kMaxPhaseSpans = 64;

struct PhaseSpan {
    Phase phase;
    int64_t start = 0, end = 0;
};

struct TrackedStep {
    int64_t number = -1;  // numbered when it closes: discarded steps take none
    int64_t start = 0, end = 0;
    std::vector<PhaseSpan> phases;  // in order
    std::array<int64_t, kPhaseCount> totals{};
    uint8_t with_total = 0;  // bit per phase that has a total
    int64_t dropped_phases = 0;
    std::optional<int64_t> samples, tokens;
    uint32_t name = 0;  // the caller's name slot: 0 is the default, step_scope()s set theirs
};

// What an event left for the caller: steps that closed, in order, and the number of the first
// step when the first step opened.
struct TrackerOutbox {
    std::vector<TrackedStep> closed;
    std::optional<int64_t> first_open;
    bool empty() const { return closed.empty() && !first_open; }
};

class StepTracker {
  public:
    explicit StepTracker(int64_t first_step = 0) : next_number_(first_step) {}

    // Every event takes the lock only for the state change (callers hold no other lock).
    void phase_begin(Phase phase, int64_t now);
    void phase_end(Phase phase, int64_t now);
    // phase_end(kData) and the batch's sizes (negative: unknown), in one event.
    void data_end(int64_t now, int64_t samples, int64_t tokens);
    void set_batch(int64_t samples, int64_t tokens);
    void step(int64_t now);
    void begin_scope(uint32_t name, int64_t now);
    void end_scope(int64_t now);
    void finish(int64_t now);

    // Moves what the events since the last call left into `out` (appended).
    void take(TrackerOutbox& out);
    bool pending() const { return has_outbox_; }

  private:
    void phase_end_locked(Phase phase, int64_t now);
    void on_data_fetch(int64_t now);
    void open(int64_t now);
    void close(int64_t end);

    std::mutex mutex_;
    int64_t next_number_;
    std::optional<TrackedStep> current_;
    std::array<int, kPhaseCount> depth_{};
    std::array<int64_t, kPhaseCount> phase_start_{};
    bool explicit_ = false;    // the application calls step() / step_scope()
    bool dataloader_ = false;  // a DataLoader iterator has been seen
    bool optimized_ = false;   // an optimizer stepped in the current step
    bool opened_ = false;      // the first step has opened
    std::optional<int64_t> pending_end_;  // no-DataLoader rule: the last optimizer step's end
    std::optional<int64_t> samples_, tokens_;
    TrackerOutbox outbox_;
    bool has_outbox_ = false;
};

}  // namespace otelprof
