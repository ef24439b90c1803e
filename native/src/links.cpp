// Forward -> backward links (mirrors reference/tree.py fwdbwd_pairs): which backward op ran for
// which forward op. Newer traces say it with fwdbwd flow events; older ones only with matching
// "Sequence number" args, the backward op carrying a "Fwd thread id".
#include "otelprof/links.hpp"

#include <algorithm>
#include <unordered_map>

#include "otelprof/schema.hpp"

#include "build_common.hpp"

namespace otelprof {

using namespace detail;

namespace {

// From the fwdbwd flows: each flow end binds to the CPU op that starts exactly there on its
// thread (the last with a sequence number, else the last), else to the op around it; a start
// and an end with one id make a pair, in the order of the ends (reference: _flow_pairs).
std::vector<std::pair<int, int>> flow_pairs(const Trace& trace, const EventTree& tree) {
    const std::vector<Event>& ev = trace.events;
    const std::vector<const Flow*>& fwd_flows = tree.fwd_flows;
    std::vector<std::pair<int, int>> pairs;
    struct ExactKey {
        Ident pid, tid;
        int64_t ts;
        bool operator==(const ExactKey& o) const { return pid == o.pid && tid == o.tid && ts == o.ts; }
    };
    struct ExactHash {
        size_t operator()(const ExactKey& k) const {
            return IdentPairHash()({k.pid, k.tid}) ^ static_cast<size_t>(static_cast<uint64_t>(k.ts) * 0xC2B2AE3D27D4EB4FULL);
        }
    };
    std::unordered_map<ExactKey, std::vector<int>, ExactHash> exact;
    // sweep_order lists each thread's CPU events in the nesting sweep's order
    for (int i : tree.sweep_order) {
        const Event& e = ev[i];
        exact[ExactKey{e.pid, e.tid, e.start}].push_back(i);
    }
    auto bind = [&](size_t k) -> int {
        const Flow& f = *fwd_flows[k];
        auto it = exact.find(ExactKey{f.pid, f.tid, f.ts});
        if (it != exact.end() && !it->second.empty()) {
            int last_seq = -1;
            for (int c : it->second)
                if (ev[c].has(kHasSequence)) last_seq = c;
            return last_seq >= 0 ? last_seq : it->second.back();
        }
        return tree.probe_owner[trace.memory.size() + k];
    };
    struct FlowKeyHash {
        size_t operator()(const Ident& i) const { return static_cast<size_t>(static_cast<uint64_t>(i.value) * 31 + i.is_str); }
    };
    std::unordered_map<Ident, size_t, FlowKeyHash> starts, ends;
    for (size_t k = 0; k < fwd_flows.size(); ++k) {
        const Flow& f = *fwd_flows[k];
        if (f.ph == 's') starts.try_emplace(f.id, k);
        else if (f.ph == 'f') ends.try_emplace(f.id, k);
    }
    std::vector<std::pair<Ident, size_t>> ends_sorted(ends.begin(), ends.end());
    std::sort(ends_sorted.begin(), ends_sorted.end(),
              [&](const auto& a, const auto& b) { return fwd_flows[a.second]->ordinal < fwd_flows[b.second]->ordinal; });
    for (const auto& [key, k_end] : ends_sorted) {
        auto it = starts.find(key);
        if (it == starts.end()) continue;
        int fw = bind(it->second), bw = bind(k_end);
        if (fw >= 0 && bw >= 0) pairs.emplace_back(fw, bw);
    }
    return pairs;
}

// Without flows: per process, the forward op of each sequence number (the last one seen, in start
// order) and the first backward op with it; pairs in the order of the backward ops
// (reference: _sequence_pairs).
std::vector<std::pair<int, int>> sequence_pairs(const Trace& trace) {
    const std::vector<Event>& ev = trace.events;
    const int n = static_cast<int>(ev.size());
    std::vector<std::pair<int, int>> pairs;
    struct SeqKeyHash {
        size_t operator()(const std::pair<Ident, int64_t>& k) const {
            return static_cast<size_t>(static_cast<uint64_t>(k.first.value) * 0x9E3779B97F4A7C15ULL ^ static_cast<uint64_t>(k.second) ^ k.first.is_str);
        }
    };
    struct SeqKeyEq {
        bool operator()(const std::pair<Ident, int64_t>& a, const std::pair<Ident, int64_t>& b) const {
            return a.first == b.first && a.second == b.second;
        }
    };
    std::unordered_map<std::pair<Ident, int64_t>, int, SeqKeyHash, SeqKeyEq> fwd_by_seq, bwd_by_seq;
    std::vector<Item> order;  // (start, -end, ordinal) inline: no indirection while sorting
    for (int i = 0; i < n; ++i)
        if (ev[i].kind == Kind::CpuOp) order.push_back(Item{ev[i].start, 0, -ev[i].end, ev[i].ordinal, i});
    sort_items(order);
    for (const Item& item : order) {
        const int i = item.idx;
        if (!ev[i].has(kSequenceInt) || ev[i].seq < 0) continue;
        std::pair<Ident, int64_t> key{ev[i].pid, ev[i].seq};
        // a non-zero "Fwd thread id": backward; none, or 0: forward; any other value: neither
        if (ev[i].has(kFwdThreadSet)) {
            bwd_by_seq.try_emplace(key, i);
        } else if (!ev[i].has(kFwdThreadOther)) {
            fwd_by_seq[key] = i;
        }
    }
    std::vector<std::pair<std::pair<Ident, int64_t>, int>> bwd(bwd_by_seq.begin(), bwd_by_seq.end());
    std::sort(bwd.begin(), bwd.end(), [&](const auto& a, const auto& b) { return ev[a.second].ordinal < ev[b.second].ordinal; });
    for (const auto& [key, bw] : bwd) {
        auto it = fwd_by_seq.find(key);
        if (it != fwd_by_seq.end()) pairs.emplace_back(it->second, bw);
    }
    return pairs;
}

}  // namespace

std::vector<std::pair<int, int>> fwdbwd_pairs(const Trace& trace, const EventTree& tree) {
    return tree.fwd_flows.empty() ? sequence_pairs(trace) : flow_pairs(trace, tree);
}

}  // namespace otelprof
