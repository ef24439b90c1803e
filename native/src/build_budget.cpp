// build_spans's volume control (build_state.hpp; reference/_budget.py's stages of the same names):
// gpu_lanes, aggregate_sibling_runs, apply_budget, window_root_rule, aggregate_spans, hidden_counts.
#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "build_state.hpp"

namespace otelprof::detail {

namespace {

// The children of every event in the order of `order` (which lists each child once): those of p
// are kids[begin[p]] .. kids[begin[p + 1] - 1]. One array, not a list per event.
struct Children {
    std::vector<size_t> begin;
    std::vector<int> kids;
};

Children children_in_order(const std::vector<int>& parent, const std::vector<int>& order) {
    Children out;
    out.begin.assign(parent.size() + 1, 0);
    for (int c : order)
        if (parent[c] >= 0) ++out.begin[static_cast<size_t>(parent[c]) + 1];
    for (size_t p = 0; p < parent.size(); ++p) out.begin[p + 1] += out.begin[p];
    out.kids.resize(out.begin.back());
    std::vector<size_t> next(out.begin.begin(), out.begin.end() - 1);
    for (int c : order)
        if (parent[c] >= 0) out.kids[next[static_cast<size_t>(parent[c])]++] = c;
    return out;
}

// Runs of two or more consecutive hidden siblings (not Python, not outside their live step) with
// one name and category, all in one trace, become one aggregate span each (reference: builder.py,
// the same stage). Returns the runs (the first member leads) and marks their members in `aggregated`.
std::vector<std::vector<int>> find_sibling_runs(const std::vector<Event>& ev, const EventTree& tree,
                                                const std::vector<char>& keep, const std::vector<uint8_t>& reason,
                                                std::vector<char>& aggregated) {
    const int n = static_cast<int>(ev.size());
    std::vector<std::vector<int>> aggs;
    const Children children = children_in_order(tree.parent, tree.sweep_order);
    std::vector<int> run;
    for (int p = 0; p < n; ++p) {
        if (!keep[p] || ev[p].device()) continue;
        run.clear();
        const int* kids = children.kids.data() + children.begin[p];
        const size_t n_kids = children.begin[p + 1] - children.begin[p];
        for (size_t idx = 0; idx <= n_kids; ++idx) {
            int c = idx < n_kids ? kids[idx] : -1;
            bool cand = c >= 0 && !keep[c] && ev[c].kind != Kind::Python && reason[c] != kHiddenOutsideStep;
            const bool same = cand && !run.empty() && tree.owner[c] == tree.owner[run[0]];  // one trace per run
            if (same && ev[c].name_id == ev[run[0]].name_id && ev[c].cat == ev[run[0]].cat) {
                run.push_back(c);
                continue;
            }
            if (run.size() >= 2) {
                for (int r : run) aggregated[r] = 1;
                aggs.push_back(run);
            }
            run.clear();
            if (cand) run.push_back(c);
        }
    }
    return aggs;
}

// Why an event is hidden (reference: volume.HIDDEN_*), and the counter each reason adds to.
const StatKey kHiddenStat[] = {DROPPED_SHORT, DROPPED_SHORT, DROPPED_PYTHON, DROPPED_BUDGET, DROPPED_STEP_COPIES, DROPPED_WINDOW_ROOTS, DROPPED_OUTSIDE_STEP};

// Scratch of the span budget, per event (has_child: per slot), allocated once for all traces.
struct BudgetScratch {
    std::vector<char> has_child, member;
    std::vector<int> parents, depth;
};

// Over budget, first: the leaf siblings of one name and category (two or more, consecutive or
// not) become one aggregate (reference: volume.Budget._aggregate_leaves).
void budget_aggregate_leaves(BuildState& st, const std::vector<int>& events, std::vector<int>& trace_aggs, BudgetScratch& scratch) {
    const std::vector<Event>& ev = st.ev;
    std::vector<std::vector<int>>& aggs = st.aggs;
    std::vector<char>& has_child = scratch.has_child;
    std::vector<int>& parents = scratch.parents;
    for (int i : events) {
        parents[i] = st.parent_of(i);
        if (parents[i] >= 0) has_child[static_cast<size_t>(parents[i])] = 1;
    }
    for (int a : trace_aggs) {
        const int ps = st.parent_of(aggs[static_cast<size_t>(a)][0]);
        if (ps >= 0) has_child[static_cast<size_t>(ps)] = 1;
    }
    std::vector<int> order;  // the leaves, by parent, name, category, then time
    for (int i : events)
        if (!has_child[static_cast<size_t>(i)]) order.push_back(i);
    std::sort(order.begin(), order.end(), [&](int a, int b) {
        if (parents[a] != parents[b]) return parents[a] < parents[b];
        if (ev[a].name_id != ev[b].name_id) return ev[a].name_id < ev[b].name_id;
        if (ev[a].cat != ev[b].cat) return ev[a].cat < ev[b].cat;
        return ev[a].start != ev[b].start ? ev[a].start < ev[b].start : ev[a].ordinal < ev[b].ordinal;
    });
    std::vector<int> run;
    for (size_t idx = 0; idx <= order.size(); ++idx) {
        const int c = idx < order.size() ? order[idx] : -1;
        const bool leaf = c >= 0;
        if (leaf && !run.empty() && parents[c] == parents[run[0]] && ev[c].name_id == ev[run[0]].name_id &&
            ev[c].cat == ev[run[0]].cat) {
            run.push_back(c);
            continue;
        }
        if (run.size() >= 2) {
            for (int r : run) {
                st.keep[r] = 0;
                st.aggregated[r] = 1;
            }
            trace_aggs.push_back(static_cast<int>(aggs.size()));
            aggs.push_back(run);
        }
        run.clear();
        if (leaf) run.push_back(c);
    }
    std::fill(has_child.begin(), has_child.end(), 0);
}

// Then, still over budget: the least significant spans go, by (worth, -depth, -order)
// (reference: volume.Budget._drop).
void budget_drop(BuildState& st, const std::vector<int>& kept, int64_t n_roots, const std::vector<int>& trace_aggs,
                 BudgetScratch& scratch) {
    const std::vector<Event>& ev = st.ev;
    const int n = st.n;
    std::vector<std::vector<int>>& aggs = st.aggs;
    const std::vector<int64_t>& launched = st.launched;
    std::vector<char>& member = scratch.member;
    std::vector<int>& parents = scratch.parents;
    std::vector<int>& depth = scratch.depth;
    int64_t live_aggs = 0;
    for (int a : trace_aggs) live_aggs += !aggs[static_cast<size_t>(a)].empty();
    const int64_t excess = n_roots + static_cast<int64_t>(kept.size()) + live_aggs - st.span_budget;
    if (excess <= 0) return;
    for (int i : kept) {
        member[i] = 1;
        parents[i] = st.parent_of(i);
    }
    auto depth_of = [&](int i) -> int {
        std::vector<int> walk;
        int j = i;
        while (j >= 0 && depth[j] < 0) {
            walk.push_back(j);
            const int ps = parents[j];
            j = ps >= 0 && ps < n && member[ps] ? ps : -1;
        }
        int d = j < 0 ? 0 : depth[j];
        for (auto it = walk.rbegin(); it != walk.rend(); ++it) depth[*it] = ++d;
        return depth[i];
    };
    struct Cand {
        int64_t worth;
        int neg_depth;
        int64_t neg_order;
        int who;  // event, or -1 - aggregate
    };
    std::vector<Cand> cands;
    for (int i : kept) {
        const int64_t worth = ev[i].device() ? ev[i].dur() : std::max(ev[i].dur(), launched[i]);
        cands.push_back(Cand{worth, -depth_of(i), -static_cast<int64_t>(ev[i].ordinal), i});
    }
    for (int a : trace_aggs) {
        const std::vector<int>& run_a = aggs[static_cast<size_t>(a)];
        if (run_a.empty()) continue;
        const int ps = st.parent_of(run_a[0]);
        const int d = 1 + (ps >= 0 && ps < n && member[ps] ? depth_of(ps) : 0);
        int64_t worth = 0;
        for (int r : run_a) worth += ev[r].dur();
        cands.push_back(Cand{worth, -d, -static_cast<int64_t>(ev[run_a[0]].ordinal), -1 - a});
    }
    std::sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
        if (a.worth != b.worth) return a.worth < b.worth;
        if (a.neg_depth != b.neg_depth) return a.neg_depth < b.neg_depth;
        if (a.neg_order != b.neg_order) return a.neg_order < b.neg_order;
        return a.who < b.who;
    });
    for (int64_t k = 0; k < excess; ++k) {
        const int c = cands[static_cast<size_t>(k)].who;
        if (c >= 0) {
            st.keep[c] = 0;
            st.reason[c] = kHiddenBudget;
        } else {
            for (int r : aggs[static_cast<size_t>(-1 - c)]) {
                st.aggregated[r] = 0;
                st.reason[r] = kHiddenBudget;
            }
            aggs[static_cast<size_t>(-1 - c)].clear();
        }
    }
    for (int i : kept) {
        member[i] = 0;
        depth[i] = -1;
    }
}

}  // namespace

// Device work whose launch is not a span (not in the trace, or hidden with no op above it) goes
// under one synthetic lane span per trace, device and stream, never straight under a root
// (parent_of). A lane is set aside for every (owner, device, stream) of device work but a step's
// device copy, in order of its first event, lane j in slot lane_base + j; it is sent when
// anything goes under it (reference: gpu_lanes).
void gpu_lanes(BuildState& st) {
    const std::vector<Event>& ev = st.ev;
    const std::vector<int>& owner = st.tree.owner;
    st.lane_base = st.it_base + st.n_iter;
    std::map<std::tuple<int, bool, int64_t, bool, int64_t>, int> index;
    for (int i = 0; i < st.n; ++i) {
        const Event& e = ev[i];
        if (!e.device() || (e.kind == Kind::GpuAnnotation && st.is_step(st.tree.parent[i]))) continue;
        const auto [it, added] = index.try_emplace({owner[i], e.pid.is_str, e.pid.value, e.tid.is_str, e.tid.value},
                                                   static_cast<int>(st.lanes.size()));
        if (added) st.lanes.push_back(BuildState::Lane{owner[i], i});
        if (st.lane_of.empty()) st.lane_of.assign(static_cast<size_t>(st.n), -1);
        st.lane_of[i] = it->second;
    }
    st.n_slots += st.lanes.size();
}

// Runs of identical hidden siblings become one aggregate span each (default detail).
void aggregate_sibling_runs(BuildState& st) {
    st.aggregated.assign(static_cast<size_t>(st.n), 0);
    if (!st.full) st.aggs = find_sibling_runs(st.ev, st.tree, st.keep, st.reason, st.aggregated);
}

// The span budget per trace (reference: volume.Budget.apply): a trace over it has its repeated
// leaves aggregated, then loses its least significant spans.
void apply_budget(BuildState& st) {
    const int64_t budget = st.span_budget;
    if (budget <= 0) return;
    const int n = st.n;
    const std::vector<char>& keep = st.keep;
    const std::vector<std::vector<int>>& aggs = st.aggs;
    auto is_root = [&](int i) { return st.is_step(i) || i == st.window_root_ev; };
    std::map<TraceId, int64_t> roots;
    std::map<TraceId, std::vector<int>> members, agg_of;
    for (int i = 0; i < n; ++i) {
        if (!keep[i]) continue;
        if (is_root(i)) ++roots[st.trace_of(i)];
        else members[st.trace_of(i)].push_back(i);
    }
    for (const Span& sp : st.synthetic) ++roots[sp.trace_id];  // the synthetic window root
    for (const TraceId& it : st.iteration_trace) ++roots[it];
    // lanes in use count; a trace that is trimmed keeps room for each of its other lanes too (a
    // launching op the budget drops leaves its device work to a lane)
    std::map<TraceId, int64_t> spare;
    if (!st.lanes.empty()) {
        std::vector<char> used(st.lanes.size(), 0);
        for (int i = 0; i < n; ++i) {
            if (st.lane_of[i] < 0) continue;
            const int j = st.parent_of(i) - st.lane_base;
            if (j >= 0 && j < static_cast<int>(st.lanes.size())) used[static_cast<size_t>(j)] = 1;
        }
        for (size_t j = 0; j < st.lanes.size(); ++j) ++(used[j] ? roots : spare)[st.trace_of(st.lanes[j].first)];
        st.forget();
    }
    if (st.split)
        for (int s : st.tree.steps) ++roots[st.detail_trace[st.tree.step_index[s]]];
    for (size_t a = 0; a < aggs.size(); ++a) agg_of[st.trace_of(aggs[a][0])].push_back(static_cast<int>(a));
    BudgetScratch scratch{std::vector<char>(st.n_slots, 0), std::vector<char>(n, 0), std::vector<int>(n, -1), std::vector<int>(n, -1)};
    for (auto& [tid, events] : members) {
        std::vector<int>& trace_aggs = agg_of[tid];
        const int64_t n_roots = roots[tid];
        if (n_roots + static_cast<int64_t>(events.size() + trace_aggs.size()) <= budget) continue;
        st.forget();
        budget_aggregate_leaves(st, events, trace_aggs, scratch);
        st.forget();
        std::vector<int> kept;
        for (int i : events)
            if (keep[i]) kept.push_back(i);
        budget_drop(st, kept, n_roots + spare[tid], trace_aggs, scratch);
    }
    st.forget();
}

// A window trace that would hold its root alone, nothing folded into it, is not sent (default detail).
void window_root_rule(BuildState& st) {
    const int root = st.window_root_ev;
    if (st.full || st.n_iter != 0 || root < 0 || !st.keep[root]) return;
    const std::vector<int>& owner = st.tree.owner;
    // anything else of the window, hidden or not, keeps it: a hidden event folds into the root
    bool alone = true;
    for (int i = 0; i < st.n && alone; ++i) alone = !(owner[i] == -1 && i != root);
    if (alone) {
        st.keep[root] = 0;
        st.reason[root] = kHiddenWindowRoot;
        st.window_root = -1;
        st.forget();
    }
}

// One span per surviving aggregate, under its leader's parent; built in place in the output.
void aggregate_spans(BuildState& st) {
    const std::vector<Event>& ev = st.ev;
    const std::vector<int>& owner = st.tree.owner;
    BigVector<Span>& by_order = st.out.spans;
    // every span: kept events and aggregates (at most one per event), then the synthetic roots
    // (order_spans): the window's, one per iteration, one per step's detail trace (split)
    by_order.reserve(static_cast<size_t>(st.n) + 1 + static_cast<size_t>(st.n_iter) + 2 * st.tree.steps.size());
    std::vector<int64_t> children_cpu;  // CPU-side time of each event's CPU-side children
    if (!st.aggs.empty()) {
        children_cpu.assign(static_cast<size_t>(st.n), 0);
        for (int i = 0; i < st.n; ++i)
            if (!ev[i].device() && st.tree.parent[i] >= 0) children_cpu[st.tree.parent[i]] += ev[i].dur();
    }
    std::string label;
    for (const std::vector<int>& run : st.aggs) {
        if (run.empty()) continue;
        const Event& first = ev[run[0]];
        int64_t total = 0, self = 0, end = first.end, shortest = first.dur(), longest = first.dur();
        for (int r : run) {
            total += ev[r].dur();
            self += ev[r].dur() - children_cpu[r];
            shortest = std::min(shortest, ev[r].dur());
            longest = std::max(longest, ev[r].dur());
            end = std::max(end, ev[r].end);
        }
        Span sp;
        sp.order = first.ordinal;
        sp.trace_id = st.trace_of(run[0]);
        sp.span_id = st.sid(first.ordinal);
        const int ps = st.parent_of(run[0]);
        sp.parent_id = st.slot_id(ps);
        if (ps == owner[run[0]] && st.live_step(ps)) sp.parent_id = st.under_phase(ps, run[0], end);
        sp.has_parent = true;
        const std::string_view name = st.name_of(first);
        const std::string suffix = " \xc3\x97" + std::to_string(run.size());
        label = shown_name(first.kind, name, kSpanNameChars - static_cast<int64_t>(suffix.size()) + 1);  // "×": one character, two bytes
        const bool renamed = label != name;
        label += suffix;
        sp.name = st.keep_str(label);
        sp.start = first.start;
        sp.end = end;
        st.add(sp, kCategoryKey, AttrValue::str(first.cat));
        if (!first.device() && !first.tid.is_str) st.add(sp, kThreadIdKey, AttrValue::integer(first.tid.value));
        if (renamed) st.add(sp, first.kind == Kind::Kernel ? kKernelNameKey : kEventNameKey, AttrValue::str(name));
        st.add(sp, kAggregatedCountKey, AttrValue::integer(static_cast<int64_t>(run.size())));
        st.add(sp, kAggregatedDurationKey, AttrValue::integer(total));
        st.add(sp, kAggregatedSelfKey, AttrValue::integer(self));
        st.add(sp, kAggregatedMinKey, AttrValue::integer(shortest));
        st.add(sp, kAggregatedMaxKey, AttrValue::integer(longest));
        by_order.push_back(std::move(sp));
        st.stats[AGGREGATED_EVENTS] += static_cast<int64_t>(run.size());
    }
    st.stats[AGGREGATE_SPANS] = static_cast<int64_t>(by_order.size());
    st.n_aggregates = by_order.size();
}

// What each parent says of the spans hidden under it (reference: volume.hidden_attributes).
void hidden_counts(BuildState& st) {
    const int n = st.n;
    const std::vector<Event>& ev = st.ev;
    const std::vector<char>& keep = st.keep;
    const std::vector<char>& aggregated = st.aggregated;
    const std::vector<uint8_t>& reason = st.reason;
    int64_t* stats = st.stats;
    const size_t n_slots = st.n_slots;
    const Options& opts = st.opts;
    std::vector<uint32_t>& hidden_at = st.hidden_at;
    std::vector<std::pair<int, int>> hidden;  // (target slot, event)
    // why event i is hidden: the reason recorded, else what the keep rule saw (python, short)
    auto why_hidden = [&](int i) -> int {
        if (reason[i]) return reason[i];
        return ev[i].kind == Kind::Python ? kHiddenPython : kHiddenShort;
    };
    // what each trace root says its trace folded: hidden and aggregated events, per owner
    st.root_folded.assign(n_slots, {0, 0});
    const std::vector<int>& owner = st.tree.owner;
    for (int i = 0; i < n; ++i) {
        if (keep[i]) continue;
        if (aggregated[i]) {
            if (const int root = st.level_target(owner[i]); root >= 0) ++st.root_folded[static_cast<size_t>(root)].second;
            continue;
        }
        const int why = why_hidden(i);
        ++stats[kHiddenStat[why]];
        if (why == kHiddenWindowRoot) continue;
        const int target = st.parent_of(i);
        if (target >= 0) {
            hidden.emplace_back(target, i);
            if (const int root = st.level_target(owner[i]); root >= 0) ++st.root_folded[static_cast<size_t>(root)].first;
        }
    }
    hidden_at.assign(n_slots, 0);
    {
        auto name_of = [&](int i) { return st.name_of(ev[i]); };
        std::sort(hidden.begin(), hidden.end(), [&](const auto& a, const auto& b) {
            if (a.first != b.first) return a.first < b.first;
            return name_of(a.second) < name_of(b.second);
        });
        std::string text;
        std::vector<std::pair<int64_t, std::string_view>> counts;
        for (size_t lo = 0; lo < hidden.size();) {
            const int slot = hidden[lo].first;
            size_t hi = lo;
            unsigned why = 0;
            counts.clear();
            BuildState::Hidden h{};
            while (hi < hidden.size() && hidden[hi].first == slot) {
                const int i = hidden[hi].second;
                why |= 1u << why_hidden(i);
                int64_t* held = h.folded[fold_class(ev[i].kind)];
                ++held[0];
                held[1] += ev[i].dur();
                if (counts.empty() || counts.back().second != name_of(i)) counts.emplace_back(0, name_of(i));
                ++counts.back().first;
                ++hi;
            }
            const size_t shown = std::min<size_t>(counts.size(), 3);
            std::partial_sort(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(shown), counts.end(),
                              [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
            const int64_t total = static_cast<int64_t>(hi - lo);
            text = std::to_string(total) + " hidden (";
            bool sep = false;
            auto reason_text = [&](const std::string& t) {
                if (sep) text += ", ";
                text += t;
                sep = true;
            };
            if (why >> kHiddenShort & 1) {
                const int64_t m = opts.min_duration_ns;
                reason_text(m % 1000 == 0 ? "shorter than " + std::to_string(m / 1000) + " \xc2\xb5s"
                                          : "shorter than " + std::to_string(m) + " ns");
            }
            if (why >> kHiddenPython & 1) reason_text("python functions");
            if (why >> kHiddenBudget & 1) reason_text("over the " + std::to_string(opts.span_budget) + "-span budget");
            if (why >> kHiddenStepCopy & 1) reason_text("device copy of the step");
            if (why >> kHiddenOutsideStep & 1) reason_text("outside the live step");
            text += "): ";
            int64_t listed = 0;
            for (size_t k = 0; k < shown; ++k) {
                if (k) text += ", ";
                text += cut_chars(counts[k].second, 64);
                text += " \xc3\x97" + std::to_string(counts[k].first);
                listed += counts[k].first;
            }
            if (total > listed) text += " and " + std::to_string(total - listed) + " more";
            h.count = total;
            h.text = st.keep_str(text);
            st.hidden.push_back(h);
            hidden_at[static_cast<size_t>(slot)] = static_cast<uint32_t>(st.hidden.size());
            lo = hi;
        }
    }
}

}  // namespace otelprof::detail
