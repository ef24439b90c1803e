"""Every attribute otelprof puts on what it sends: the registry the docs are generated from.

Attributes with an OpenTelemetry semantic convention use it (``origin="otel"``); those a trace
list reads (MLflow, Phoenix) use OpenInference's names; everything else is otelprof's own and
lives under ``otelprof.*``, a namespace no other project writes. No name is both an attribute and
the prefix of another (``otelprof.step.number`` beside ``otelprof.step.source``), as the
semantic conventions ask. ``docs/semantic-conventions.md`` holds the table :func:`render_registry`
writes between ``<!-- attribute-registry -->`` and ``<!-- /attribute-registry -->``
(``python -m otelprof.otlp.conventions --write`` rewrites it); tests/test_conventions.py fails
when the doc or the engines' output drift from it.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

OTEL, OTELPROF, OPENINFERENCE = "otel", "otelprof", "openinference"
STRING, INT, DOUBLE, BOOL, JSON = "string", "int", "double", "bool", "string (JSON)"

#: Where an attribute appears. Spans: ``step`` (``train.step``, ``ProfilerStep#N``, an evaluation
#: span, a detail root), ``phase`` (a live step's phase children), ``op`` (CPU-side events:
#: operators, annotations, python functions, runtime calls), ``device`` (kernels, memcpys,
#: memsets, syncs, device annotations), ``synthetic`` (lanes, iteration and window roots, detail
#: roots), ``root`` (a trace's root), ``aggregate`` (one span for a run of hidden siblings).
RESOURCE, STEP, PHASE, OP, DEVICE, SYNTHETIC, ROOT, AGGREGATE = (
    "resource",
    "step span",
    "phase span",
    "op span",
    "device span",
    "synthetic span",
    "trace root",
    "aggregate span",
)
MEMORY_EVENT, LINK = "memory event", "link"
#: A window's ``memory · <device>`` span per recorded step (capture/memory/spans.py), and its
#: events at the step's phase boundaries (named as the memory events, ``otelprof.memory``).
MEMORY_SPAN = "memory span"
#: torch's memory timeline categories (capture/memory/timeline.py CATEGORIES).
MEMORY_CATEGORIES = (
    "parameter",
    "optimizer_state",
    "input",
    "temporary",
    "activation",
    "gradient",
    "autograd_detail",
    "unknown",
)
_WITH_MEMORY = "a window with `profile_memory`"
_WITH_ET = "a window with the `execution_trace` profile option, or an import with an execution trace"
#: An execution trace node's attributes on the op span with its record function id
#: (converter/execution_trace.py): (name under ``otelprof.et.``, type, meaning).
ET_ATTRIBUTES = (
    ("node_id", INT, "the node's `id`"),
    ("op_schema", STRING, "the operator's schema"),
    *(
        (f"{side}_{what}", JSON, f"the {side}s' {label}")
        for side in ("input", "output")
        for what, label in (
            ("shapes", "`shapes`"),
            ("types", "`types` (dtype in a tensor's: `Tensor(float)`)"),
            ("strides", "`strides`"),
            ("tensor_ids", "tensor ids (null: not a tensor)"),
        )
    ),
    ("input_producers", JSON, "per input, the name of the node that output its tensor last (null: none)"),
)

#: The span event each Kineto ``[memory]`` instant becomes (its attributes: ``otelprof.memory.*``,
#: as OpenTelemetry's ``exception`` event carries ``exception.*``).
MEMORY_EVENT_NAME = "otelprof.memory"
#: The classes ``otelprof.folded.<class>.*`` counts, in emission order.
FOLD_CLASSES = ("op", "python", "runtime", "kernel", "memcpy", "memset", "device_other")


@dataclass(frozen=True)
class Attribute:
    name: str
    type: str
    on: tuple[str, ...]
    brief: str
    origin: str = OTELPROF
    #: Why the registry test may not see it on the shared traces, an import and a live CPU run.
    rare: str | None = None


def _a(
    name: str, type_: str, on: str | tuple[str, ...], brief: str, origin: str = OTELPROF, rare: str | None = None
) -> Attribute:
    return Attribute(name, type_, (on,) if isinstance(on, str) else on, brief, origin, rare)


_SPANS = (STEP, PHASE, OP, DEVICE, SYNTHETIC, AGGREGATE)

RESOURCE_ATTRIBUTES = (
    _a("service.name", STRING, RESOURCE, "`OTEL_SERVICE_NAME`, else `unknown_service`", origin=OTEL),
    _a("telemetry.sdk.name", STRING, RESOURCE, "`otelprof`", origin=OTEL),
    _a("telemetry.sdk.language", STRING, RESOURCE, "`python`", origin=OTEL),
    _a("telemetry.sdk.version", STRING, RESOURCE, "otelprof's version", origin=OTEL),
    _a("host.name", STRING, RESOURCE, "the trace's `host_name`, else the machine's", origin=OTEL),
    _a("process.pid", INT, RESOURCE, "the process that ran the steps or kernels", origin=OTEL),
    _a("process.executable.path", STRING, RESOURCE, "the profiled executable (Nsight Systems imports)", origin=OTEL),
    _a("otelprof.distributed.rank", INT, (RESOURCE, STEP), "the rank (`distributedInfo`, launcher, option)"),
    _a("otelprof.distributed.local_rank", INT, RESOURCE, "the rank on its host (live sessions)"),
    _a("otelprof.distributed.world_size", INT, RESOURCE, "the number of ranks"),
    _a("otelprof.distributed.backend", STRING, RESOURCE, "`nccl`, `gloo`, … (`distributedInfo`)"),
    _a(
        "otelprof.gpu.model",
        STRING,
        RESOURCE,
        "the first GPU's name (`deviceProperties`)",
    ),
    _a(
        "otelprof.gpu.count",
        INT,
        RESOURCE,
        "how many GPUs the trace lists",
    ),
    _a("otelprof.run.id", STRING, RESOURCE, "the run id every rank shares (step trace ids derive from it)"),
    _a("otelprof.source.format", STRING, RESOURCE, "what `otelprof import` read: `kineto-json`, `nsys-sqlite <v>`, …"),
)

SPAN_ATTRIBUTES = (
    _a(
        "otelprof.event.category",
        STRING,
        (STEP, *_SPANS[2:]),
        "the Kineto `cat` of a converted span (`otelprof`: synthetic)",
    ),
    _a("thread.id", INT, (STEP, OP), "the event's `tid`, when an integer", origin=OTEL),
    _a("otelprof.gpu.kernel_name", STRING, (DEVICE, AGGREGATE), "a kernel's whole name, where its span name is folded"),
    _a("otelprof.external_id", INT, (OP, DEVICE), "`External id`: joins an op to its device annotation"),
    _a("code.function.name", STRING, OP, "a python function span's function (`path(line): function`)", origin=OTEL),
    _a("code.file.path", STRING, OP, "its source file, as Kineto writes it", origin=OTEL),
    _a("code.line.number", INT, OP, "its line", origin=OTEL),
    _a("otelprof.op.sequence_number", INT, OP, "autograd's `Sequence number` (forward and backward ops)"),
    _a("otelprof.op.fwd_thread_id", INT, OP, "`Fwd thread id`: the forward op's thread, on a backward op"),
    _a("otelprof.op.input_dims", JSON, OP, "`Input Dims` (`record_shapes`)"),
    _a("otelprof.op.input_types", JSON, OP, "`Input type`"),
    _a("otelprof.op.input_strides", JSON, OP, "`Input Strides`"),
    _a("otelprof.op.concrete_inputs", JSON, OP, "`Concrete Inputs`"),
    _a(
        "otelprof.op.module_hierarchy",
        STRING,
        OP,
        "`Module Hierarchy` (`with_modules`)",
        rare="`with_modules` profiles of TorchScript; the shared traces hold only empty values, which are not sent",
    ),
    _a("code.stacktrace", STRING, OP, "`Call stack` (`with_stack`)", origin=OTEL),
    _a("otelprof.op.flops", INT, OP, "`flops` (`with_flops`)", rare="`with_flops` profiles; no shared trace has one"),
    _a("otelprof.gpu.correlation_id", INT, (OP, DEVICE), "`correlation`: joins a runtime call to its device work"),
    _a("otelprof.gpu.cbid", INT, OP, "the runtime call's CUPTI callback id"),
    _a("otelprof.gpu.device", INT, (DEVICE, SYNTHETIC), "the device (a GPU lane's: its events' pid)"),
    _a("otelprof.gpu.stream", INT, (DEVICE, SYNTHETIC), "the stream (a GPU lane's: its events' tid)"),
    _a("otelprof.gpu.context", INT, DEVICE, "the CUDA context"),
    _a("otelprof.gpu.grid", JSON, DEVICE, "a kernel's grid"),
    _a("otelprof.gpu.block", JSON, DEVICE, "a kernel's block"),
    _a("otelprof.gpu.registers_per_thread", INT, DEVICE, "`registers per thread`"),
    _a("otelprof.gpu.shared_memory_bytes", INT, DEVICE, "`shared memory`"),
    _a("otelprof.gpu.blocks_per_sm", DOUBLE, DEVICE, "`blocks per SM`"),
    _a("otelprof.gpu.warps_per_sm", DOUBLE, DEVICE, "`warps per SM`"),
    _a("otelprof.gpu.achieved_occupancy_percent", DOUBLE, DEVICE, "`est. achieved occupancy %`"),
    _a("otelprof.gpu.bytes", INT, DEVICE, "a memcpy's or memset's `bytes`"),
    _a("otelprof.gpu.memory_bandwidth_gbps", DOUBLE, DEVICE, "`memory bandwidth (GB/s)`"),
    _a("otelprof.gpu.kind", STRING, DEVICE, "`kind` of AMD device work"),
    _a("otelprof.gpu.sync_kind", STRING, DEVICE, "`cuda_sync_kind`"),
    _a("otelprof.gpu.wait_on_stream", INT, DEVICE, "`wait_on_stream` of a sync"),
    _a("otelprof.collective.name", STRING, OP, "`Collective name` of an NCCL op"),
    _a("otelprof.collective.dtype", STRING, OP, "`dtype` of an NCCL op"),
    _a("otelprof.collective.in_nelems", INT, OP, "`In msg nelems`"),
    _a("otelprof.collective.out_nelems", INT, OP, "`Out msg nelems`"),
    _a("otelprof.collective.group_size", INT, OP, "`Group size`"),
    _a("otelprof.collective.process_group_name", STRING, OP, "`Process Group Name`"),
    _a("otelprof.op.self_cpu_time_ns", INT, OP, "self CPU time, as `key_averages()` counts it"),
    _a("otelprof.op.self_device_time_ns", INT, OP, "device time of the work it launched itself"),
    _a(
        "otelprof.step.number",
        INT,
        (STEP, MEMORY_SPAN),
        "optimizer updates before the step; N of `ProfilerStep#N`",
    ),
    _a("otelprof.memory.peak_allocated_bytes", INT, STEP, "max `Total Allocated` of the step's memory events"),
    _a(
        "otelprof.memory.peak_bytes",
        INT,
        (OP, STEP),
        "the trace's max `Total Allocated` on a device: on the span holding that memory event",
    ),
    _a("otelprof.memory.peak_device", STRING, (OP, STEP), "that device: `cpu`, `cuda:0`, …"),
    *(
        _a(f"otelprof.et.{name}", type_, OP, f"execution trace: {brief}", rare=_WITH_ET)
        for name, type_, brief in ET_ATTRIBUTES
    ),
    _a("otelprof.event.name", STRING, (OP, AGGREGATE), "the whole name of an event whose span name was cut"),
    _a("otelprof.aggregated_count", INT, AGGREGATE, "members of the run"),
    _a("otelprof.aggregated_duration_ns", INT, AGGREGATE, "their summed duration"),
    _a("otelprof.aggregated_self_ns", INT, AGGREGATE, "that, less their CPU-side children"),
    _a("otelprof.aggregated_min_ns", INT, AGGREGATE, "the shortest member"),
    _a("otelprof.aggregated_max_ns", INT, AGGREGATE, "the longest member"),
    _a("otelprof.hidden_spans", INT, _SPANS, "events folded into this span"),
    _a("otelprof.hidden", STRING, _SPANS, "a sentence: why events were folded and the commonest of their names"),
    *(
        _a(f"otelprof.folded.{c}.{what}", INT, _SPANS, f"{label} of the folded `{c}` events")
        for c in FOLD_CLASSES
        for what, label in (("count", "count"), ("duration_ns", "summed duration"))
    ),
    _a("otelprof.trace.hidden_events", INT, ROOT, "events the trace folded into its spans"),
    _a("otelprof.trace.aggregated_events", INT, ROOT, "members of the trace's aggregate spans"),
    _a("otelprof.source.file", STRING, ROOT, "the kept raw trace a live window came from"),
    _a(
        "otelprof.execution_trace.file",
        STRING,
        ROOT,
        "the kept execution trace (gzip) recorded with the window, or the one imported",
        rare=_WITH_ET,
    ),
    _a("otelprof.iteration.number", INT, SYNTHETIC, "k of `Iteration#k`"),
    _a("otelprof.iteration.source", STRING, SYNTHETIC, "`optimizer_step`: what marked the iterations"),
    _a("otelprof.window.part", INT, SYNTHETIC, "k of `window part k/n`"),
    _a("otelprof.window.parts", INT, SYNTHETIC, "n of `window part k/n`"),
    _a("otelprof.synthetic", BOOL, SYNTHETIC, "the span stands for no event of its own"),
    _a("otelprof.step.source", STRING, STEP, "`live`: a step the instrumentor timed"),
    _a("otelprof.step.samples", INT, STEP, "samples in the step's batches, when known"),
    _a("otelprof.step.tokens", INT, STEP, "tokens in the step's batches, when known"),
    _a("otelprof.step.micro_batches", INT, STEP, "DataLoader batches the step took"),
    _a(
        "otelprof.step.dropped_phases",
        INT,
        STEP,
        "phase intervals past the per-step cap",
        rare="a step with over 64 phase intervals",
    ),
    _a(
        "otelprof.step.skipped",
        BOOL,
        STEP,
        "a gradient scaler skipped the update",
        rare="inf/NaN gradients under a GradScaler",
    ),
    _a("otelprof.step.window", STRING, STEP, "`warmup`, `recorded` or `after` a profiling window"),
    _a("otelprof.window.trigger", STRING, STEP, "what started the window: `early`, `schedule`, `on_demand`, `anomaly`"),
    _a("otelprof.phase.name", STRING, (PHASE, MEMORY_EVENT), "`data`, `forward`, `backward` or `optimizer`"),
    _a("otelprof.phase.module", STRING, PHASE, "the root module's class a `forward` timed"),
    _a("input.value", STRING, STEP, "JSON: step number, samples, tokens (trace lists show it)", origin=OPENINFERENCE),
    _a("input.mime_type", STRING, STEP, "`application/json`", origin=OPENINFERENCE),
    _a("output.value", STRING, STEP, "JSON: each phase's and the step's milliseconds", origin=OPENINFERENCE),
    _a("output.mime_type", STRING, STEP, "`application/json`", origin=OPENINFERENCE),
)

MEMORY_EVENT_ATTRIBUTES = (
    _a("otelprof.memory.bytes", INT, MEMORY_EVENT, "`Bytes` (negative: freed)"),
    _a("otelprof.memory.total_allocated_bytes", INT, MEMORY_EVENT, "`Total Allocated`"),
    _a("otelprof.memory.total_reserved_bytes", INT, MEMORY_EVENT, "`Total Reserved`"),
    _a("otelprof.memory.device_type", INT, MEMORY_EVENT, "`Device Type`, c10's `DeviceType` number"),
    _a("otelprof.memory.device_id", INT, MEMORY_EVENT, "`Device Id` (-1 on the CPU)"),
    _a("otelprof.memory.device", STRING, MEMORY_EVENT, "the device as torch writes it: `cpu`, `cuda:0`, …"),
    _a("otelprof.memory.addr", STRING, MEMORY_EVENT, "`Addr` in hex"),
    _a(
        "otelprof.phase.boundary",
        STRING,
        MEMORY_EVENT,
        "`start` or `end` of the phase named, on a memory span",
        rare=_WITH_MEMORY,
    ),
    *(
        _a(
            f"otelprof.memory.{c}.bytes",
            INT,
            MEMORY_EVENT,
            f"`{c}` bytes held (torch's memory timeline)",
            rare=_WITH_MEMORY,
        )
        for c in MEMORY_CATEGORIES
    ),
)

MEMORY_SPAN_ATTRIBUTES = (
    *(
        _a(f"otelprof.memory.{c}.peak_bytes", INT, MEMORY_SPAN, f"peak `{c}` bytes in the step", rare=_WITH_MEMORY)
        for c in MEMORY_CATEGORIES
    ),
    _a(
        "otelprof.memory.total.peak_bytes",
        INT,
        MEMORY_SPAN,
        "peak bytes of all categories in the step",
        rare=_WITH_MEMORY,
    ),
)

#: The ``exception`` event of a step an out-of-memory error ended (capture/memory/oom.py).
EXCEPTION_EVENT = "exception event"
_CUDA = "CUDA initialised"
_OOM = "an out-of-memory error ended the loop"
STEP_MEMORY_ATTRIBUTES = (
    _a(
        "otelprof.memory.peak.allocated_bytes",
        INT,
        (STEP, EXCEPTION_EVENT),
        "the caching allocator's peak bytes allocated over the step (the event: over the run)",
        rare=_CUDA,
    ),
    _a(
        "otelprof.memory.peak.reserved_bytes",
        INT,
        (STEP, EXCEPTION_EVENT),
        "the caching allocator's peak bytes reserved over the step (the event: over the run)",
        rare=_CUDA,
    ),
    _a(
        "otelprof.memory.peak.resident_bytes",
        INT,
        (STEP, EXCEPTION_EVENT),
        "the process's resident high-water mark over the step (the event: over the run)",
    ),
    _a("otelprof.memory.oom_count", INT, STEP, "CUDA out-of-memory errors the loop caught in the step", rare=_CUDA),
    _a("otelprof.memory.snapshot.file", STRING, STEP, "the CUDA memory snapshot written at the error", rare=_OOM),
)
OOM_EVENT_ATTRIBUTES = (
    _a("exception.type", STRING, EXCEPTION_EVENT, "the error's class", origin=OTEL, rare=_OOM),
    _a("exception.message", STRING, EXCEPTION_EVENT, "the error's message", origin=OTEL, rare=_OOM),
    _a("exception.stacktrace", STRING, EXCEPTION_EVENT, "the traceback, as Python prints it", origin=OTEL, rare=_OOM),
    _a("otelprof.oom.device", STRING, EXCEPTION_EVENT, "`cpu` or `cuda:N`", rare=_OOM),
    _a("otelprof.memory.allocated_bytes", INT, EXCEPTION_EVENT, "bytes the caching allocator held", rare=_OOM),
    _a("otelprof.memory.reserved_bytes", INT, EXCEPTION_EVENT, "bytes the caching allocator reserved", rare=_OOM),
    _a("otelprof.memory.alloc_retries", INT, EXCEPTION_EVENT, "`num_alloc_retries` of the allocator", rare=_OOM),
    _a("otelprof.memory.allocator_ooms", INT, EXCEPTION_EVENT, "`num_ooms` of the allocator", rare=_OOM),
    _a("otelprof.memory.summary", STRING, EXCEPTION_EVENT, "`torch.cuda.memory_summary()`", rare=_OOM),
    _a("otelprof.memory.resident_bytes", INT, EXCEPTION_EVENT, "the process's resident set", rare=_OOM),
    _a(
        "otelprof.memory.categories",
        JSON,
        EXCEPTION_EVENT,
        "the last window's peak bytes by category, and its device",
        rare=_OOM,
    ),
)

LINK_ATTRIBUTES = (_a("otelprof.link.kind", STRING, LINK, "`fwdbwd`, `window`, `rank_detail` or `step`"),)

REGISTRY: tuple[Attribute, ...] = (
    RESOURCE_ATTRIBUTES
    + SPAN_ATTRIBUTES
    + STEP_MEMORY_ATTRIBUTES
    + MEMORY_SPAN_ATTRIBUTES
    + MEMORY_EVENT_ATTRIBUTES
    + OOM_EVENT_ATTRIBUTES
    + LINK_ATTRIBUTES
)
BY_NAME = {a.name: a for a in REGISTRY}

_BLOCK = re.compile(r"(<!-- attribute-registry -->\n)(.*?)(<!-- /attribute-registry -->)", re.S)
_ORIGIN = {OTEL: "OpenTelemetry", OTELPROF: "otelprof", OPENINFERENCE: "OpenInference"}


def registry_table() -> str:
    """The registry as a Markdown table, in registry order."""
    rows = ["| attribute | type | on | origin | meaning |", "|---|---|---|---|---|"]
    for a in REGISTRY:
        brief = a.brief.replace("|", "\\|") + (f" ({a.rare})" if a.rare else "")
        rows.append(f"| `{a.name}` | {a.type} | {', '.join(a.on)} | {_ORIGIN[a.origin]} | {brief} |")
    return "\n".join(rows) + "\n"


def render_registry(document: str) -> str:
    """``document`` with the marked registry section replaced by :func:`registry_table`."""
    return _BLOCK.sub(lambda m: m.group(1) + registry_table() + m.group(3), document)


def main(argv: list[str] | None = None) -> int:
    """``python -m otelprof.otlp.conventions [--write] [FILE ...]``: exit 1 when a file's registry
    section differs (or cannot be read or written), rewriting it with ``--write``."""
    parser = argparse.ArgumentParser(
        prog="python -m otelprof.otlp.conventions",
        description="Check (or rewrite) the attribute registry section of Markdown files against"
        " otelprof/otlp/conventions.py: it sits between '<!-- attribute-registry -->' and"
        " '<!-- /attribute-registry -->' lines.",
    )
    parser.add_argument("--write", action="store_true", help="rewrite the sections that differ")
    parser.add_argument("files", nargs="*", type=Path, metavar="FILE", help="default: docs/semantic-conventions.md")
    args = parser.parse_args(argv)
    failed = 0
    for path in args.files or [Path("docs/semantic-conventions.md")]:
        try:
            old = path.read_text("utf-8")
            new = render_registry(old)
            if new != old and args.write:
                path.write_text(new, "utf-8")
                print(f"rewrote {path}")
            elif new != old:
                print(f"{path}: attribute registry differs from otelprof/otlp/conventions.py (--write fixes)")
                failed += 1
        except OSError as error:
            print(f"{path}: {error.strerror or error}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["BY_NAME", "MEMORY_EVENT_NAME", "REGISTRY", "Attribute", "registry_table", "render_registry"]
