// Per-op aggregates: torch's key_averages() rows (mirrors tree.self_times and
// builder._aggregate_ops of the reference). Operators and annotations nest in their own tree
// (filtered names and other kinds skipped); each row sums calls, total and self CPU time, and the
// device time of the kernels its calls launched.
#include "otelprof/aggregates.hpp"

#include <cstdint>
#include <string>
#include <unordered_map>

#include "otelprof/schema.hpp"

namespace otelprof {

// The key_averages tree: each operator's nearest operator ancestor, its children's CPU time, and
// the device time it launched (through runtime calls, charged to the op above them).
SelfTimes self_times(const Trace& trace, const std::vector<int>& parent) {
    const std::vector<Event>& ev = trace.events;
    const std::vector<Name>& names = trace.names;
    const int n = static_cast<int>(ev.size());
    SelfTimes t;
    std::vector<char>& in_a = t.in_aggregate;
    in_a.assign(n, 0);
    for (int i = 0; i < n; ++i)
        in_a[i] = !ev[i].device() && in_aggregate_kinds(ev[i].kind) && !names[ev[i].name_id].filtered;
    std::vector<int>& a_parent = t.parent;
    std::vector<int>& a_children = t.children;
    std::vector<int64_t>& child_dur = t.child_dur;
    std::vector<int64_t>& self_dev = t.self_device;
    a_parent.assign(n, -1);
    a_children.assign(n, 0);
    child_dur.assign(n, 0);
    self_dev.assign(n, 0);
    for (int i = 0; i < n; ++i) {
        if (!in_a[i]) continue;
        int p = parent[i];
        while (p >= 0 && !in_a[p]) p = parent[p];
        a_parent[i] = p;
        if (p >= 0) {
            ++a_children[p];
            child_dur[p] += ev[i].dur();
        }
    }
    for (int i = 0; i < n; ++i) {
        if (!is_device_time(ev[i].kind) || parent[i] < 0) continue;
        int o = parent[i];
        while (o >= 0 && !in_a[o]) o = parent[o];
        int first_a = o;
        while (o >= 0 && ev[o].kind == Kind::Runtime) o = a_parent[o];
        if (o < 0) o = first_a;
        if (o >= 0) self_dev[o] += ev[i].dur();
    }
    return t;
}

// One row per (name, kind[, input shapes]) in first-seen order, as torch's key_averages(): a
// child that repeats its only parent's name folds into it (torch's _remove_dup_nodes); device
// events are rows of their own.
std::vector<OpRow> aggregate_ops(const Trace& trace, const SelfTimes& self,
                                 const std::vector<int>& sweep_order, bool group_by_input_shapes) {
    const std::vector<Event>& ev = trace.events;
    const std::vector<Name>& names = trace.names;
    const int n = static_cast<int>(ev.size());
    const std::vector<char>& in_a = self.in_aggregate;
    const std::vector<int>& a_parent = self.parent;
    const std::vector<int>& a_children = self.children;
    const std::vector<int64_t>& child_dur = self.child_dur;
    const std::vector<int64_t>& self_dev = self.self_device;
    static const AttrKey input_dims = arg_key(arg_index("Input Dims")), input_dims_lower = arg_key(arg_index("Input dims"));
    std::vector<OpRow> ops;
    {
        std::vector<char> merged(n, 0);
        for (int i = 0; i < n; ++i)
            merged[i] = in_a[i] && a_parent[i] >= 0 && a_children[a_parent[i]] == 1 && ev[a_parent[i]].name_id == ev[i].name_id;
        // the sweep order puts every parent before its children (a parent is on the child's thread)
        std::vector<int> sorted_a;
        for (int i : sweep_order)
            if (in_a[i]) sorted_a.push_back(i);
        std::vector<int> survivor(n);
        for (int i = 0; i < n; ++i) survivor[i] = i;
        for (int i : sorted_a)
            if (merged[i]) survivor[i] = survivor[a_parent[i]];
        std::vector<int64_t> self_cpu(n, 0), self_device(n, 0), device_total(n, 0);
        for (int i = 0; i < n; ++i) {
            if (!in_a[i]) continue;
            self_cpu[survivor[i]] += ev[i].dur() - child_dur[i];
            self_device[survivor[i]] += self_dev[i];
        }
        for (auto it = sorted_a.rbegin(); it != sorted_a.rend(); ++it) {
            int i = *it;
            device_total[i] += self_dev[i];
            if (a_parent[i] >= 0) device_total[a_parent[i]] += device_total[i];
        }
        // rows keyed by (name, kind[, shapes]): by name id (see Name::row) and kind, or by text with shapes
        constexpr size_t kNoRow = SIZE_MAX;
        std::vector<size_t> row_index[3];
        for (auto& rows : row_index) rows.assign(names.size(), kNoRow);
        std::unordered_map<std::string, size_t> shaped_index;
        std::string key;
        for (int i = 0; i < n; ++i) {
            const Event& e = ev[i];
            bool a_row = in_a[i] && !merged[i];
            if (!a_row && !is_device_time(e.kind)) continue;
            const uint32_t name_id = a_row ? names[e.name_id].row : e.name_id;
            const std::string_view name = names[name_id].text;
            const char* kind = "device";
            std::string shapes;
            if (a_row) {
                kind = e.kind == Kind::Annotation ? "annotation" : "op";
                if (group_by_input_shapes) {
                    // the input dims attribute: "Input Dims" rendered, else "Input dims" ("null": none)
                    trace.args.visit(e.args, [&](const AttrValue& v) {
                        if (v.key == input_dims || v.key == input_dims_lower) shapes.assign(v.s, v.len);
                    });
                    if (shapes == "null") shapes.clear();
                }
            }
            size_t row_at;
            bool inserted;
            if (group_by_input_shapes && a_row) {
                key.assign(name);
                key.push_back('\0');
                key.append(kind);
                key.push_back('\0');
                key.append(shapes);
                auto res = shaped_index.try_emplace(key, ops.size());
                row_at = res.first->second;
                inserted = res.second;
            } else {
                int slot = kind[0] == 'd' ? 0 : kind[0] == 'a' ? 1 : 2;
                size_t& at = row_index[slot][name_id];
                inserted = at == kNoRow;
                if (inserted) at = ops.size();
                row_at = at;
            }
            if (inserted) ops.push_back(OpRow{std::string(name), kind, shapes});
            OpRow& row = ops[row_at];
            ++row.calls;
            if (a_row) {
                row.cpu_total_ns += e.dur();
                row.self_cpu_ns += self_cpu[i];
                row.device_total_ns += device_total[i];
                row.self_device_ns += self_device[i];
            } else {
                row.device_total_ns += e.dur();
                row.self_device_ns += e.dur();
            }
        }
    }
    return ops;
}

}  // namespace otelprof
