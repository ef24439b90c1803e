// Options::op_attributes on the op spans (reference/_op_attrs.py): the attributes given for a
// "Record function id" (an execution trace's join) go on the span of the event with that id; an
// event that is no span of its own (aggregated, folded into the span above it) is counted as
// unplaced, never moved onto another op; an id no event had is counted as unmatched, an event
// whose id has none as missing (only when any are given). And the
// device memory peaks that memory_span_events found, on the op spans holding them.
#include <unordered_map>
#include <unordered_set>
#include <variant>

#include "build_state.hpp"

namespace otelprof::detail {

void op_attributes(BuildState& st) {
    const auto& given = st.opts.op_attributes;
    if (given.empty()) return;
    std::unordered_map<uint32_t, int64_t> id_of;  // by ordinal
    id_of.reserve(st.trace.record_ids.size());
    for (const auto& [ordinal, id] : st.trace.record_ids) id_of[ordinal] = id;
    std::unordered_set<int64_t> seen;
    st.op_attrs.assign(static_cast<size_t>(st.n), nullptr);
    for (int i = 0; i < st.n; ++i) {
        const auto found = id_of.find(st.ev[i].ordinal);
        if (found == id_of.end()) continue;
        const auto attrs = given.find(found->second);
        if (attrs == given.end()) {
            ++st.stats[OP_ATTRIBUTES_MISSING];
            continue;
        }
        seen.insert(found->second);
        if (!st.keep[i]) {
            ++st.stats[OP_ATTRIBUTES_UNPLACED];
            continue;
        }
        ++st.stats[OP_ATTRIBUTES_JOINED];
        st.op_attrs[static_cast<size_t>(i)] = &attrs->second;
        for (const auto& [key, value] : attrs->second) {
            if (st.extra_key_of.count(key)) continue;
            const size_t k = key_count() + st.out.extra_keys.size();
            if (k > UINT16_MAX) throw std::length_error("op_attributes: too many distinct keys");
            st.out.extra_keys.push_back(key);
            st.extra_key_of.emplace(key, static_cast<AttrKey>(k));
        }
    }
    st.stats[OP_ATTRIBUTES_UNMATCHED] = static_cast<int64_t>(given.size() - seen.size());
}

void add_op_attributes(BuildState& st, Span& sp, int i) {
    if (!st.op_attrs.empty())
        if (const auto* attrs = st.op_attrs[static_cast<size_t>(i)])
            for (const auto& [key, value] : *attrs) {
                AttrValue v;
                if (const auto* s = std::get_if<std::string>(&value)) v = AttrValue::str(st.keep_str(*s));
                else if (const auto* n = std::get_if<int64_t>(&value)) v = AttrValue::integer(*n);
                else if (const auto* d = std::get_if<double>(&value)) v = AttrValue::dbl(*d);
                else v = AttrValue::boolean(std::get<bool>(value));
                st.add(sp, st.extra_key_of.at(key), v);
            }
    for (const BuildState::MemoryPeak& peak : st.memory_peaks)
        if (peak.slot == i) {  // a span holds one device's peak: the first device's
            st.add(sp, kMemoryPeakBytesKey, AttrValue::integer(peak.bytes));
            st.add(sp, kMemoryPeakDeviceKey, AttrValue::str(peak.device));
            break;
        }
}

}  // namespace otelprof::detail
