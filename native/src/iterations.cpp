// Iterations: a window without ProfilerStep#N still splits into traces, one per iteration
// (mirrors the iterations stage of reference/builder.py and tree.iteration_owners). An iteration
// ends at each top-level Optimizer.step#<Name>.step; without those, and when the window holds
// more spans than one trace's budget, consecutive top-level CPU events are chunked under it.
#include "otelprof/iterations.hpp"

#include <algorithm>
#include <climits>
#include <string_view>

#include "otelprof/schema.hpp"

#include "build_common.hpp"

namespace otelprof {

using namespace detail;

Iterations find_iterations(const Trace& trace, const EventTree& tree, const std::vector<char>& keep,
                           int64_t span_budget, int it_base, std::vector<int>& owner) {
    const std::vector<Event>& ev = trace.events;
    const std::vector<int>& parent = tree.parent;
    const int n = static_cast<int>(ev.size());
    Iterations out;
    std::vector<int64_t>& it_lo = out.lo;
    std::vector<int64_t>& it_hi = out.hi;
    const char*& it_source = out.source;
    std::vector<int> chain;  // scratch: a walk up the tree
    constexpr std::string_view kOptPrefix = "Optimizer.step#", kOptSuffix = ".step";
    std::vector<char> marked(n, 0);
    for (int i = 0; i < n; ++i) {
        const std::string_view name = trace.name(ev[i]);
        marked[i] = !ev[i].device() && name.size() > kOptPrefix.size() + kOptSuffix.size() &&
                    name.substr(0, kOptPrefix.size()) == kOptPrefix &&
                    name.substr(name.size() - kOptSuffix.size()) == kOptSuffix;
    }
    std::vector<int> marks;
    for (int i = 0; i < n; ++i) {
        if (!marked[i]) continue;
        int j = parent[i];
        while (j >= 0 && !marked[j]) j = parent[j];
        if (j < 0) marks.push_back(i);  // not nested in another
    }
    std::sort(marks.begin(), marks.end(), [&](int a, int b) {
        return ev[a].end != ev[b].end ? ev[a].end < ev[b].end : ev[a].ordinal < ev[b].ordinal;
    });
    std::vector<int> chunk_of;  // span_budget: chunk of each top-level CPU event, or -1
    const int64_t budget = span_budget;
    int64_t n_keep = 0;
    for (int i = 0; i < n; ++i) n_keep += keep[i];
    if (!marks.empty()) {
        it_source = "optimizer_step";
        int64_t lo = INT64_MAX;
        for (const Event& e : ev)
            if (!e.device()) lo = std::min(lo, e.start);
        for (int m : marks) {
            it_lo.push_back(it_hi.empty() ? lo : it_hi.back());
            it_hi.push_back(ev[m].end);
        }
    } else if (budget > 0 && n_keep > budget) {
        std::vector<int> top(n, -1);  // top-level ancestor (device work through its launch)
        for (int i = 0; i < n; ++i) {
            chain.clear();
            int j = i;
            while (top[j] < 0) {
                if (parent[j] < 0) {
                    top[j] = j;
                    break;
                }
                chain.push_back(j);
                j = parent[j];
            }
            for (int c : chain) top[c] = top[j];
        }
        std::vector<int64_t> size(n, 0);
        for (int i = 0; i < n; ++i) size[top[i]] += keep[i];
        std::vector<int> tops;
        for (int i = 0; i < n; ++i)
            if (parent[i] < 0 && !ev[i].device() && ev[i].kind != Kind::TraceSpan) tops.push_back(i);
        std::sort(tops.begin(), tops.end(), [&](int a, int b) {
            return ev[a].start != ev[b].start ? ev[a].start < ev[b].start : ev[a].ordinal < ev[b].ordinal;
        });
        chunk_of.assign(n, -1);
        int64_t held = 0;
        for (int i : tops) {
            if (it_lo.empty() || (held && held + size[i] > budget)) {
                it_lo.push_back(ev[i].start);
                it_hi.push_back(ev[i].end);
                held = 0;
            }
            held += size[i];
            chunk_of[i] = static_cast<int>(it_lo.size()) - 1;
        }
        if (!it_lo.empty()) it_source = "span_budget";
    }
    auto own_at = [&](int i) -> int {
        if (!chunk_of.empty()) return chunk_of[i] >= 0 ? it_base + chunk_of[i] : -1;
        const Event& e = ev[i];
        const size_t k = static_cast<size_t>(std::upper_bound(it_hi.begin(), it_hi.end(), e.start) - it_hi.begin());
        if (e.kind == Kind::TraceSpan || e.start < it_lo[0] || k == it_hi.size() || e.end > it_hi[k]) return -1;
        return it_base + static_cast<int>(k);
    };
    if (it_source) {
        // the iteration of the parent, or when the parent is in none (or there is none), own_at
        std::fill(owner.begin(), owner.end(), kUnset);
        for (int i = 0; i < n; ++i) {
            chain.clear();
            int j = i;
            while (owner[j] == kUnset) {
                chain.push_back(j);
                j = parent[j];
                if (j < 0) break;
            }
            for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
                const int p = parent[*it];
                const int o = p >= 0 ? owner[p] : -1;
                owner[*it] = o >= 0 ? o : own_at(*it);
            }
        }
        for (int i = 0; i < n; ++i) {
            if (owner[i] < it_base) continue;
            const size_t k = static_cast<size_t>(owner[i] - it_base);
            it_lo[k] = std::min(it_lo[k], ev[i].start);
            it_hi[k] = std::max(it_hi[k], ev[i].end);
        }
    }
    return out;
}

}  // namespace otelprof
