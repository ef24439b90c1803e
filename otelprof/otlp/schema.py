"""Kineto categories and argument keys, mapped once (mirrors native/src/schema.cpp).

Three generations of category names are covered: 2021 (``Operator``/``Runtime``/``Kernel``),
2022+ (``cpu_op``/``cuda_runtime``/``kernel``) and vendor variants (AMD, MTIA, XPU).
Unknown categories become generic CPU-side spans.
"""

from __future__ import annotations

from enum import IntEnum


class Kind(IntEnum):
    OTHER = 0
    CPU_OP = 1
    ANNOTATION = 2
    PYTHON = 3
    RUNTIME = 4
    TRACE = 5
    KERNEL = 6
    MEMCPY = 7
    MEMSET = 8
    SYNC = 9
    GPU_ANNOTATION = 10


CATEGORY_KIND: dict[str, Kind] = {
    "cpu_op": Kind.CPU_OP,
    "Operator": Kind.CPU_OP,
    "user_annotation": Kind.ANNOTATION,
    "python_function": Kind.PYTHON,
    "cuda_runtime": Kind.RUNTIME,
    "Runtime": Kind.RUNTIME,
    "cuda_driver": Kind.RUNTIME,
    "xpu_runtime": Kind.RUNTIME,
    "xpu_driver": Kind.RUNTIME,
    "mtia_runtime": Kind.RUNTIME,
    "privateuse1_runtime": Kind.RUNTIME,
    "privateuse1_driver": Kind.RUNTIME,
    "Trace": Kind.TRACE,
    "kernel": Kind.KERNEL,
    "Kernel": Kind.KERNEL,
    "mtia_ccp_events": Kind.KERNEL,
    "gpu_memcpy": Kind.MEMCPY,
    "Memcpy": Kind.MEMCPY,
    "gpu_memset": Kind.MEMSET,
    "Memset": Kind.MEMSET,
    "cuda_sync": Kind.SYNC,
    "gpu_user_annotation": Kind.GPU_ANNOTATION,
}

#: Kinds that run on a device timeline (pid = device, tid = stream).
DEVICE_KINDS = frozenset({Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET, Kind.SYNC, Kind.GPU_ANNOTATION})
#: Device work whose duration counts as device time (as ``key_averages`` counts it).
DEVICE_TIME_KINDS = frozenset({Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET})
#: CPU-side kinds that take part in the ``key_averages`` event tree.
AGGREGATE_KINDS = frozenset({Kind.CPU_OP, Kind.ANNOTATION, Kind.PYTHON, Kind.RUNTIME})
#: Names torch's ``_filter_name`` leaves out of ``key_averages``.
FILTERED_NAMES = frozenset(
    {
        "[memory]",
        "[OutOfMemory]",
        "profiler::_record_function_enter",
        "profiler::_record_function_enter_new",
        "profiler::_record_function_exit",
        "aten::is_leaf",
        "aten::output_nr",
        "aten::_version",
    }
)

FLOW_CATEGORIES_CORRELATION = frozenset({"ac2g", "async", "async_cpu_to_gpu"})
FLOW_CATEGORY_FWDBWD = "fwdbwd"
MEMORY_EVENT_NAME = "[memory]"
STEP_PREFIX = "ProfilerStep#"

INT, DOUBLE, STRING, JSON = "int", "double", "string", "json"

#: (Kineto argument key, attribute name, value type), in emission order. Aliases share a name;
#: the first key present wins.
ARG_ATTRIBUTES: tuple[tuple[str, str, str], ...] = (
    ("External id", "otelprof.external_id", INT),
    ("external id", "otelprof.external_id", INT),
    ("Sequence number", "otelprof.op.sequence_number", INT),
    ("Fwd thread id", "otelprof.op.fwd_thread_id", INT),
    ("Input Dims", "otelprof.op.input_dims", JSON),
    ("Input dims", "otelprof.op.input_dims", JSON),
    ("Input type", "otelprof.op.input_types", JSON),
    ("Input Strides", "otelprof.op.input_strides", JSON),
    ("Concrete Inputs", "otelprof.op.concrete_inputs", JSON),
    ("Module Hierarchy", "otelprof.op.module_hierarchy", STRING),
    ("Call stack", "code.stacktrace", STRING),
    ("flops", "otelprof.op.flops", INT),
    ("correlation", "otelprof.gpu.correlation_id", INT),
    ("cbid", "otelprof.gpu.cbid", INT),
    ("device", "otelprof.gpu.device", INT),
    ("stream", "otelprof.gpu.stream", INT),
    ("context", "otelprof.gpu.context", INT),
    ("grid", "otelprof.gpu.grid", JSON),
    ("block", "otelprof.gpu.block", JSON),
    ("registers per thread", "otelprof.gpu.registers_per_thread", INT),
    ("shared memory", "otelprof.gpu.shared_memory_bytes", INT),
    ("blocks per SM", "otelprof.gpu.blocks_per_sm", DOUBLE),
    ("warps per SM", "otelprof.gpu.warps_per_sm", DOUBLE),
    ("est. achieved occupancy %", "otelprof.gpu.achieved_occupancy_percent", DOUBLE),
    ("bytes", "otelprof.gpu.bytes", INT),
    ("memory bandwidth (GB/s)", "otelprof.gpu.memory_bandwidth_gbps", DOUBLE),
    ("kind", "otelprof.gpu.kind", STRING),
    ("cuda_sync_kind", "otelprof.gpu.sync_kind", STRING),
    ("wait_on_stream", "otelprof.gpu.wait_on_stream", INT),
    ("Collective name", "otelprof.collective.name", STRING),
    ("dtype", "otelprof.collective.dtype", STRING),
    ("In msg nelems", "otelprof.collective.in_nelems", INT),
    ("Out msg nelems", "otelprof.collective.out_nelems", INT),
    ("Group size", "otelprof.collective.group_size", INT),
    ("Process Group Name", "otelprof.collective.process_group_name", STRING),
)

#: Memory instant event argument -> span event attribute (all integers).
MEMORY_ATTRIBUTES: tuple[tuple[str, str], ...] = (
    ("Bytes", "otelprof.memory.bytes"),
    ("Total Allocated", "otelprof.memory.total_allocated_bytes"),
    ("Total Reserved", "otelprof.memory.total_reserved_bytes"),
    ("Device Type", "otelprof.memory.device_type"),
    ("Device Id", "otelprof.memory.device_id"),
    ("Addr", "otelprof.memory.addr"),
)
