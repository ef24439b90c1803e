// The event tree (mirrors reference/tree.py and the step finding of reference/builder.py): which
// events are steps, what encloses what on each CPU thread, which CPU event launched each device
// event, and the step that owns every event. The later stages (builder.cpp and build_*.cpp) only read it.
#include "otelprof/tree.hpp"

#include <algorithm>
#include <functional>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "otelprof/beside.hpp"

#include "build_common.hpp"

namespace otelprof {

using namespace detail;

namespace detail {

// Sorts items that mostly arrive as a few ascending runs (events in file order, then probes):
// merging the runs is linear per run where a full sort is not. The order is total, so the result
// is the same as std::sort's.
void sort_items(std::vector<Item>& items) {
    constexpr size_t kMaxRuns = 8;
    std::vector<size_t> run_starts;
    for (size_t k = 1; k < items.size() && run_starts.size() < kMaxRuns; ++k)
        if (items[k] < items[k - 1]) run_starts.push_back(k);
    if (run_starts.size() >= kMaxRuns) {
        std::sort(items.begin(), items.end());
        return;
    }
    run_starts.push_back(items.size());
    for (size_t r = 0; r + 1 < run_starts.size(); ++r)
        std::inplace_merge(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(run_starts[r]),
                           items.begin() + static_cast<std::ptrdiff_t>(run_starts[r + 1]));
}

}  // namespace detail

namespace {

// int64 -> event index where the first insertion of a key wins (as unordered_map::try_emplace),
// with open addressing: one probe array instead of a heap node per entry.
class EventByInt {
  public:
    explicit EventByInt(size_t expected) {
        size_t cap = 16;
        while (cap < expected * 2) cap *= 2;
        slots_.assign(cap, Slot{0, -1});
    }
    void try_emplace(int64_t key, int event) {
        const size_t at = slot_of(key);
        if (slots_[at].event >= 0) return;
        slots_[at] = Slot{key, event};
        if (++size_ * 2 > slots_.size()) grow();
    }
    int find(int64_t key) const { return slots_[slot_of(key)].event; }  // -1 if absent

  private:
    struct Slot {
        int64_t key;
        int event;  // -1: empty
    };
    std::vector<Slot> slots_;
    size_t size_ = 0;

    // The slot holding `key`, or the empty slot where it belongs.
    size_t slot_of(int64_t key) const {
        const size_t mask = slots_.size() - 1;
        size_t at = static_cast<size_t>((static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ULL) >> 32) & mask;
        while (slots_[at].event >= 0 && slots_[at].key != key) at = (at + 1) & mask;
        return at;
    }
    void grow() {
        std::vector<Slot> old(slots_.size() * 2, Slot{0, -1});
        old.swap(slots_);
        for (const Slot& s : old)
            if (s.event >= 0) slots_[slot_of(s.key)] = s;
    }
};

// Id -> event index where the first event of an id wins. Ids (correlation, external) number a
// trace's calls densely: where they span at most a few times as many values as there are, a table
// indexed by id (read and written in order, as the ids come) replaces the hash table (a cache
// miss per lookup on a large trace).
class EventById {
  public:
    explicit EventById(const std::vector<std::pair<int64_t, int>>& entries) {
        if (entries.empty()) return;
        int64_t lo = entries[0].first, hi = lo;
        for (const auto& [id, event] : entries) {
            lo = std::min(lo, id);
            hi = std::max(hi, id);
        }
        const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
        if (span < 4 * entries.size() + 1024) {
            lo_ = lo;
            dense_.assign(span + 1, -1);
            for (const auto& [id, event] : entries) {
                int& slot = dense_[static_cast<uint64_t>(id) - static_cast<uint64_t>(lo)];
                if (slot < 0) slot = event;
            }
        } else {
            hashed_ = std::make_unique<EventByInt>(entries.size());
            for (const auto& [id, event] : entries) hashed_->try_emplace(id, event);
        }
    }
    int find(int64_t id) const {  // -1 if absent
        if (hashed_) return hashed_->find(id);
        const uint64_t at = static_cast<uint64_t>(id) - static_cast<uint64_t>(lo_);
        return at < dense_.size() ? dense_[at] : -1;
    }

  private:
    int64_t lo_ = 0;
    std::vector<int> dense_;
    std::unique_ptr<EventByInt> hashed_;
};

template <typename V>
void release(V& v) {
    V().swap(v);
}

// Steps: the first ProfilerStep#N of each N on the CPU side, in start order (reference:
// builder.py's step table); later stages index them by position.
void find_steps(const Trace& trace, EventTree& t) {
    const std::vector<Event>& ev = trace.events;
    const std::vector<Name>& names = trace.names;
    const int n = static_cast<int>(ev.size());
    std::vector<int64_t>& step_num = t.step_num;
    std::vector<int>& steps = t.steps;
    step_num.assign(n, -1);
    {
        std::unordered_set<int64_t> seen;
        for (int i = 0; i < n; ++i) {
            const int64_t num = names[ev[i].name_id].step;
            if (!ev[i].device() && num >= 0 && seen.insert(num).second) {
                step_num[i] = num;
                steps.push_back(i);
            }
        }
    }
    std::sort(steps.begin(), steps.end(), [&](int a, int b) {
        return ev[a].start != ev[b].start ? ev[a].start < ev[b].start : ev[a].ordinal < ev[b].ordinal;
    });
    t.step_index.assign(n, -1);
    for (size_t k = 0; k < steps.size(); ++k) {
        t.step_index[steps[k]] = static_cast<int>(k);
        t.step_starts.push_back(ev[steps[k]].start);
    }
}

// CPU-side nesting per thread (reference: tree.nest): a sweep over each thread's events by start,
// longest first. Memory events and fwdbwd flow ends go along as probes, so each learns the CPU
// event it happened in.
void nest_cpu_events(const Trace& trace, EventTree& t) {
    const std::vector<Event>& ev = trace.events;
    const int n = static_cast<int>(ev.size());
    std::vector<int>& parent = t.parent;
    std::unordered_map<std::pair<Ident, Ident>, std::vector<Item>, IdentPairHash, IdentPairEq> groups;
    // events of one thread come in runs: the last thread's group is looked up once per run
    std::vector<Item>* last = nullptr;
    std::pair<Ident, Ident> last_key;
    auto group = [&](const Ident& pid, const Ident& tid) -> std::vector<Item>& {
        if (!last || !(last_key.first == pid) || !(last_key.second == tid)) {
            last_key = {pid, tid};
            last = &groups[last_key];  // stays valid: the map's elements do not move
        }
        return *last;
    };
    for (int i = 0; i < n; ++i) {
        const Event& e = ev[i];
        if (!e.device()) group(e.pid, e.tid).push_back(Item{e.start, 0, -e.end, e.ordinal, i});
    }
    const int n_mem = static_cast<int>(trace.memory.size());
    for (int k = 0; k < n_mem; ++k) {
        const Instant& m = trace.memory[k];
        group(m.pid, m.tid).push_back(Item{m.ts, 1, 0, m.ordinal, -1 - k});
    }
    std::vector<const Flow*>& fwd_flows = t.fwd_flows;
    for (const Flow& f : trace.flows)
        if (f.fwdbwd) fwd_flows.push_back(&f);
    for (size_t k = 0; k < fwd_flows.size(); ++k) {
        const Flow& f = *fwd_flows[k];
        group(f.pid, f.tid).push_back(Item{f.ts, 1, 0, f.ordinal, -1 - n_mem - static_cast<int>(k)});
    }
    std::vector<int>& probe_owner = t.probe_owner;
    probe_owner.assign(static_cast<size_t>(n_mem) + fwd_flows.size(), -1);
    std::vector<int> stack;
    std::vector<int>& sweep_order = t.sweep_order;
    sweep_order.reserve(static_cast<size_t>(n));
    for (auto& [key, items] : groups) {
        sort_items(items);
        stack.clear();
        for (const Item& item : items) {
            if (item.idx >= 0) {
                sweep_order.push_back(item.idx);
                const Event& e = ev[item.idx];
                while (!stack.empty()) {
                    const Event& top = ev[stack.back()];
                    if (e.start >= top.end || e.end > top.end) {
                        stack.pop_back();
                    } else {
                        break;
                    }
                }
                if (!stack.empty()) parent[item.idx] = stack.back();
                stack.push_back(item.idx);
            } else {
                while (!stack.empty() && item.t >= ev[stack.back()].end) stack.pop_back();
                probe_owner[static_cast<size_t>(-1 - item.idx)] = stack.empty() ? -1 : stack.back();
            }
        }
    }

}

// Device events under the runtime call that launched them, by correlation id; GPU annotations
// under the CPU annotation of the same external id (reference: tree.link_device_work).
// (The reader took each event's link_id from "External id" for annotations, "correlation" for the others.)
void attach_device_events(const Trace& trace, EventTree& t) {
    const std::vector<Event>& ev = trace.events;
    const int n = static_cast<int>(ev.size());
    std::vector<std::pair<int64_t, int>> launchers, annotations;  // (id, event), in event order
    for (int i = 0; i < n; ++i) {
        if (!ev[i].has(kHasLinkId)) continue;
        if (ev[i].kind == Kind::Runtime) launchers.emplace_back(ev[i].link_id, i);
        else if (ev[i].kind == Kind::Annotation) annotations.emplace_back(ev[i].link_id, i);
    }
    const EventById launcher_by_corr(launchers), annotation_by_ext(annotations);
    release(launchers);
    release(annotations);
    for (int i = 0; i < n; ++i) {
        if (!ev[i].device()) continue;
        int p = -1;
        if (ev[i].has(kHasLinkId))
            p = (ev[i].kind == Kind::GpuAnnotation ? annotation_by_ext : launcher_by_corr).find(ev[i].link_id);
        t.parent[i] = p;
        if (p < 0) ++t.device_events_unlinked;
    }

}

// The step that owns every event: the nearest step above it, else the step whose interval holds
// the start of its topmost ancestor (reference: tree.owners). Path compression keeps it linear.
void assign_owners(const Trace& trace, EventTree& t) {
    const std::vector<Event>& ev = trace.events;
    const int n = static_cast<int>(ev.size());
    std::vector<int>& owner = t.owner;
    owner.assign(n, kUnset);
    std::vector<int> chain;
    for (int i = 0; i < n; ++i) {
        chain.clear();
        int j = i;
        while (owner[j] == kUnset) {
            if (t.is_step(j)) {
                owner[j] = j;
                break;
            }
            int p = t.parent[j];
            if (p < 0) {
                owner[j] = t.step_at(ev[j].start);
                break;
            }
            chain.push_back(j);
            j = p;
        }
        for (int c : chain) owner[c] = owner[j];
    }
}

}  // namespace

int EventTree::step_at(int64_t ts) const {
    auto it = std::upper_bound(step_starts.begin(), step_starts.end(), ts);
    if (it == step_starts.begin()) return -1;
    int s = steps[static_cast<size_t>(it - step_starts.begin() - 1)];
    return ts < step_ends[static_cast<size_t>(it - step_starts.begin() - 1)] ? s : -1;
}

EventTree build_tree(const Trace& trace, bool two_threads, const std::function<void()>& also) {
    EventTree t;
    // the CPU side's nesting and the rest write apart: each its own events' parents, its own fields
    t.parent.assign(trace.events.size(), -1);
    auto cpu_side = [&] { nest_cpu_events(trace, t); };
    auto rest = [&] {
        attach_device_events(trace, t);
        find_steps(trace, t);
        if (also) also();
    };
    run_both(two_threads, cpu_side, rest);
    for (int s : t.steps) t.step_ends.push_back(trace.events[s].end);
    assign_owners(trace, t);
    return t;
}

}  // namespace otelprof
