#include "otelprof/schema.hpp"

#include "otelprof/spans.hpp"

#include <string_view>
#include <utility>

namespace otelprof {

Kind classify_category(std::string_view& cat) {
    // a linear table beats hashing here: the common categories come first
    static constexpr std::pair<std::string_view, Kind> table[] = {
        {"cpu_op", Kind::CpuOp},
        {"cuda_runtime", Kind::Runtime},
        {"kernel", Kind::Kernel},
        {"python_function", Kind::Python},
        {"user_annotation", Kind::Annotation},
        {"gpu_memcpy", Kind::Memcpy},
        {"gpu_memset", Kind::Memset},
        {"Operator", Kind::CpuOp},
        {"Runtime", Kind::Runtime},
        {"Kernel", Kind::Kernel},
        {"Memcpy", Kind::Memcpy},
        {"Memset", Kind::Memset},
        {"cuda_driver", Kind::Runtime},
        {"cuda_sync", Kind::Sync},
        {"gpu_user_annotation", Kind::GpuAnnotation},
        {"Trace", Kind::TraceSpan},
        {"xpu_runtime", Kind::Runtime},
        {"xpu_driver", Kind::Runtime},
        {"mtia_runtime", Kind::Runtime},
        {"mtia_ccp_events", Kind::Kernel},
        {"privateuse1_runtime", Kind::Runtime},
        {"privateuse1_driver", Kind::Runtime},
    };
    for (const auto& [name, kind] : table) {
        if (name.size() == cat.size() && !cat.empty() && name[0] == cat[0] && name == cat) {
            cat = name;
            return kind;
        }
    }
    return Kind::Other;
}

Kind category_kind(std::string_view cat) { return classify_category(cat); }

bool is_filtered_name(std::string_view name) {
    return name == "[memory]" || name == "[OutOfMemory]" || name == "profiler::_record_function_enter" ||
           name == "profiler::_record_function_enter_new" || name == "profiler::_record_function_exit" ||
           name == "aten::is_leaf" || name == "aten::output_nr" || name == "aten::_version";
}

bool step_number(std::string_view name, int64_t& out) {
    constexpr std::string_view prefix = "ProfilerStep#";
    if (name.size() <= prefix.size() || name.size() > prefix.size() + 18 || name.substr(0, prefix.size()) != prefix) return false;
    int64_t v = 0;
    for (char c : name.substr(prefix.size())) {
        if (c < '0' || c > '9') return false;
        v = v * 10 + (c - '0');
    }
    out = v;
    return true;
}

bool is_correlation_flow(std::string_view cat) { return cat == "ac2g" || cat == "async" || cat == "async_cpu_to_gpu"; }

const ArgAttribute kArgAttributes[] = {  // its size must be kArgAttributeCount (schema.hpp)
    {"External id", "otelprof.external_id", ArgType::Int},
    {"external id", "otelprof.external_id", ArgType::Int},
    {"Sequence number", "otelprof.op.sequence_number", ArgType::Int},
    {"Fwd thread id", "otelprof.op.fwd_thread_id", ArgType::Int},
    {"Input Dims", "otelprof.op.input_dims", ArgType::Json},
    {"Input dims", "otelprof.op.input_dims", ArgType::Json},
    {"Input type", "otelprof.op.input_types", ArgType::Json},
    {"Input Strides", "otelprof.op.input_strides", ArgType::Json},
    {"Concrete Inputs", "otelprof.op.concrete_inputs", ArgType::Json},
    {"Module Hierarchy", "otelprof.op.module_hierarchy", ArgType::String},
    {"Call stack", "code.stacktrace", ArgType::String},
    {"flops", "otelprof.op.flops", ArgType::Int},
    {"correlation", "otelprof.gpu.correlation_id", ArgType::Int},
    {"cbid", "otelprof.gpu.cbid", ArgType::Int},
    {"device", "otelprof.gpu.device", ArgType::Int},
    {"stream", "otelprof.gpu.stream", ArgType::Int},
    {"context", "otelprof.gpu.context", ArgType::Int},
    {"grid", "otelprof.gpu.grid", ArgType::Json},
    {"block", "otelprof.gpu.block", ArgType::Json},
    {"registers per thread", "otelprof.gpu.registers_per_thread", ArgType::Int},
    {"shared memory", "otelprof.gpu.shared_memory_bytes", ArgType::Int},
    {"blocks per SM", "otelprof.gpu.blocks_per_sm", ArgType::Double},
    {"warps per SM", "otelprof.gpu.warps_per_sm", ArgType::Double},
    {"est. achieved occupancy %", "otelprof.gpu.achieved_occupancy_percent", ArgType::Double},
    {"bytes", "otelprof.gpu.bytes", ArgType::Int},
    {"memory bandwidth (GB/s)", "otelprof.gpu.memory_bandwidth_gbps", ArgType::Double},
    {"kind", "otelprof.gpu.kind", ArgType::String},
    {"cuda_sync_kind", "otelprof.gpu.sync_kind", ArgType::String},
    {"wait_on_stream", "otelprof.gpu.wait_on_stream", ArgType::Int},
    {"Collective name", "otelprof.collective.name", ArgType::String},
    {"dtype", "otelprof.collective.dtype", ArgType::String},
    {"In msg nelems", "otelprof.collective.in_nelems", ArgType::Int},
    {"Out msg nelems", "otelprof.collective.out_nelems", ArgType::Int},
    {"Group size", "otelprof.collective.group_size", ArgType::Int},
    {"Process Group Name", "otelprof.collective.process_group_name", ArgType::String},
};
static_assert(kArgAttributeCount <= 64, "the reader finds args as a 64-bit set");

namespace {
constexpr std::string_view kFixedKeyNames[kFixedKeyCount] = {
    "otelprof.event.category", "thread.id", "otelprof.aggregated_count", "otelprof.aggregated_duration_ns",
    "otelprof.hidden_spans", "otelprof.hidden", "otelprof.synthetic", "otelprof.step.number", "otelprof.distributed.rank",
    "otelprof.op.self_cpu_time_ns", "otelprof.op.self_device_time_ns", "otelprof.memory.peak_allocated_bytes",
    "otelprof.step.source", "otelprof.step.samples", "otelprof.step.tokens", "otelprof.step.dropped_phases",
    "otelprof.phase.name", "otelprof.step.micro_batches", "otelprof.step.window", "otelprof.phase.module",
    "otelprof.iteration.number", "otelprof.iteration.source",
    "otelprof.gpu.kernel_name", "otelprof.memory.device",
    "otelprof.window.trigger", "input.value", "input.mime_type", "output.value", "output.mime_type",
    "otelprof.step.skipped",
    "otelprof.memory.peak.allocated_bytes", "otelprof.memory.peak.reserved_bytes",
    "otelprof.memory.peak.resident_bytes",
    "otelprof.memory.oom_count",
    "otelprof.aggregated_self_ns", "otelprof.aggregated_min_ns", "otelprof.aggregated_max_ns",
    "otelprof.folded.op.count", "otelprof.folded.op.duration_ns",
    "otelprof.folded.python.count", "otelprof.folded.python.duration_ns",
    "otelprof.folded.runtime.count", "otelprof.folded.runtime.duration_ns",
    "otelprof.folded.kernel.count", "otelprof.folded.kernel.duration_ns",
    "otelprof.folded.memcpy.count", "otelprof.folded.memcpy.duration_ns",
    "otelprof.folded.memset.count", "otelprof.folded.memset.duration_ns",
    "otelprof.folded.device_other.count", "otelprof.folded.device_other.duration_ns",
    "otelprof.trace.hidden_events", "otelprof.trace.aggregated_events", "otelprof.source.file",
    "otelprof.window.part", "otelprof.window.parts", "otelprof.event.name",
    "code.function.name", "code.file.path", "code.line.number",
    "otelprof.memory.peak_bytes", "otelprof.memory.peak_device", "otelprof.execution_trace.file",
};
}  // namespace

const std::string_view kMemoryAttributes[][2] = {  // its size must be kMemoryAttributeCount
    {"Bytes", "otelprof.memory.bytes"},
    {"Total Allocated", "otelprof.memory.total_allocated_bytes"},
    {"Total Reserved", "otelprof.memory.total_reserved_bytes"},
    {"Device Type", "otelprof.memory.device_type"},
    {"Device Id", "otelprof.memory.device_id"},
    {"Addr", "otelprof.memory.addr"},
};
static_assert(kMemoryAttributeCount <= 8, "Instant::memory_present is 8 bits");

int arg_index(std::string_view key) {
    for (int a = 0; a < kArgAttributeCount; ++a)
        if (kArgAttributes[a].key == key) return a;
    return -1;
}

int memory_index(std::string_view key) {
    for (int a = 0; a < kMemoryAttributeCount; ++a)
        if (kMemoryAttributes[a][0] == key) return a;
    return -1;
}

AttrKey memory_key(int memory_attribute) { return static_cast<AttrKey>(kFixedKeyCount + kArgAttributeCount + memory_attribute); }
size_t key_count() { return kFixedKeyCount + kArgAttributeCount + kMemoryAttributeCount; }
std::string_view key_name(AttrKey key) {
    if (key < kFixedKeyCount) return kFixedKeyNames[key];
    if (key < kFixedKeyCount + kArgAttributeCount) return kArgAttributes[key - kFixedKeyCount].attr;
    return kMemoryAttributes[key - kFixedKeyCount - kArgAttributeCount][1];
}

}  // namespace otelprof
