#include "otelprof/step_spans.hpp"

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "otelprof/ids.hpp"

namespace otelprof {

StepSpanEncoder::StepSpanEncoder(std::vector<std::pair<std::string, ResourceValue>> resource, std::string scope_version,
                                 std::string trace_prefix, uint64_t span_base)
    : resource_(std::move(resource)),
      scope_version_(std::move(scope_version)),
      trace_prefix_(std::move(trace_prefix)),
      span_base_(span_base) {}

std::vector<Request> StepSpanEncoder::encode(const std::vector<StepRecord>& steps, size_t max_bytes) const {
    // The span model's containers, so that the converter's encoder writes the bytes.
    Built built;
    for (const auto& [key, value] : resource_) {
        AttrValue v;
        if (const auto* s = std::get_if<std::string>(&value)) v = AttrValue::str(*s);
        else if (const auto* i = std::get_if<int64_t>(&value)) v = AttrValue::integer(*i);
        else if (const auto* d = std::get_if<double>(&value)) v = AttrValue::dbl(*d);
        else v = AttrValue::boolean(std::get<bool>(value));
        built.resource.emplace_back(key, v);
    }
    size_t span_count = 0;
    for (const StepRecord& step : steps) span_count += 1 + step.phases.size();
    built.spans.reserve(span_count);
    built.order.reserve(span_count);
    built.attrs.reserve((span_count * 2 + steps.size() * 10) * 13);
    auto attr = [&](Span& sp, AttrKey key, AttrValue v) {
        v.key = key;
        built.attrs.push_back(v);
        ++sp.attrs.count;
    };
    auto add = [&](Span&& sp) {
        built.order.push_back(static_cast<uint32_t>(built.spans.size()));
        built.spans.push_back(std::move(sp));
    };
    std::string key = trace_prefix_;
    for (const StepRecord& step : steps) {
        Span sp;
        if (step.trace_id) {
            sp.trace_id = *step.trace_id;
        } else {
            key.resize(trace_prefix_.size());
            key += std::to_string(step.number);
            sp.trace_id = make_trace_id(key);
        }
        sp.span_id = make_span_id(span_base_, step.ordinal);
        if (step.parent_id) {
            sp.parent_id = *step.parent_id;
            sp.has_parent = true;
        }
        sp.name = step.name;
        sp.start = step.start;
        sp.end = step.end;
        sp.attrs.begin = static_cast<uint32_t>(built.attrs.size());
        attr(sp, kStepKey, AttrValue::integer(step.number));
        attr(sp, kStepSourceKey, AttrValue::str("live"));
        if (step.samples) attr(sp, kStepSamplesKey, AttrValue::integer(*step.samples));
        if (step.tokens) attr(sp, kStepTokensKey, AttrValue::integer(*step.tokens));
        if (step.dropped_phases) attr(sp, kDroppedPhasesKey, AttrValue::integer(step.dropped_phases));
        if (step.micro_batches > 0) attr(sp, kStepMicroBatchesKey, AttrValue::integer(step.micro_batches));
        if (step.skipped) attr(sp, kStepSkippedKey, AttrValue::boolean(true));
        if (!step.window.empty()) {
            // Windows.mark(): "recorded:early" is the mark, then the window's trigger
            const std::string_view mark(step.window);
            const size_t colon = mark.find(':');
            attr(sp, kStepWindowKey, AttrValue::str(mark.substr(0, colon)));
            if (colon != std::string_view::npos && colon + 1 < mark.size())
                attr(sp, kWindowTriggerKey, AttrValue::str(mark.substr(colon + 1)));
        }
        const StepMemory& mem = step.memory;
        if (mem.allocated) attr(sp, kStepPeakAllocatedKey, AttrValue::integer(*mem.allocated));
        if (mem.reserved) attr(sp, kStepPeakReservedKey, AttrValue::integer(*mem.reserved));
        if (mem.resident) attr(sp, kStepPeakResidentKey, AttrValue::integer(*mem.resident));
        if (mem.ooms) attr(sp, kStepOomsKey, AttrValue::integer(mem.ooms));
        {
            // what a trace list shows (step_spans.py trace_list_attrs; append_millis: spans.hpp)
            std::string& in = built.strings.emplace_back("{\"step\": " + std::to_string(step.number));
            if (step.samples) in += ", \"samples\": " + std::to_string(*step.samples);
            if (step.tokens) in += ", \"tokens\": " + std::to_string(*step.tokens);
            in += '}';
            std::vector<std::pair<std::string_view, int64_t>> totals;  // first-seen order
            for (const StepPhase& phase : step.phases) {
                const int64_t d = std::max<int64_t>(0, phase.end - phase.start);
                auto it = std::find_if(totals.begin(), totals.end(), [&](const auto& t) { return t.first == phase.name; });
                if (it == totals.end()) totals.emplace_back(phase.name, d);
                else it->second = it->second > INT64_MAX - d ? INT64_MAX : it->second + d;  // saturates
            }
            std::string& out = built.strings.emplace_back("{");
            for (const auto& [phase, ns] : totals) {
                out += '"';
                out += phase;
                out += "_ms\": ";
                append_millis(out, ns);
                out += ", ";
            }
            out += "\"step_ms\": ";
            append_millis(out, step.end - step.start);
            out += '}';
            attr(sp, kInputValueKey, AttrValue::str(in));
            attr(sp, kInputMimeTypeKey, AttrValue::str("application/json"));
            attr(sp, kOutputValueKey, AttrValue::str(out));
            attr(sp, kOutputMimeTypeKey, AttrValue::str("application/json"));
        }
        const TraceId trace_id = sp.trace_id;
        const SpanId step_id = sp.span_id;
        add(std::move(sp));
        uint64_t ordinal = step.ordinal;
        for (const StepPhase& phase : step.phases) {
            Span child;
            child.trace_id = trace_id;
            child.span_id = make_span_id(span_base_, ++ordinal);
            child.parent_id = step_id;
            child.has_parent = true;
            // "forward GPT2LMHeadModel": the phase, then its module's class name when known
            child.name = phase.module.empty() ? std::string_view(phase.name)
                                              : std::string_view(built.strings.emplace_back(phase.name + ' ' + phase.module));
            child.start = phase.start;
            child.end = phase.end;
            child.attrs.begin = static_cast<uint32_t>(built.attrs.size());
            attr(child, kPhaseKey, AttrValue::str(phase.name));
            if (!phase.module.empty()) attr(child, kPhaseModuleKey, AttrValue::str(phase.module));
            add(std::move(child));
        }
    }
    return encode_requests(built, scope_version_, max_bytes);
}

}  // namespace otelprof
