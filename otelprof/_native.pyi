"""Type stubs for the compiled core (native/bindings)."""

from collections.abc import Callable, Sequence
from typing import Any, Final, final

from _typeshed import structseq

from otelprof.capture.spans.step_spans import StepRecord

class TraceError(ValueError):
    """Input that cannot be read as a Kineto trace."""

class GzipError(TraceError):
    """Gzip input that does not inflate to a trace (corrupt, truncated, too large, empty)."""

class OpRow:
    """One ``key_averages()`` row; times in nanoseconds."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def input_shapes(self) -> str: ...
    @property
    def calls(self) -> int: ...
    @property
    def cpu_total_ns(self) -> int: ...
    @property
    def self_cpu_ns(self) -> int: ...
    @property
    def device_total_ns(self) -> int: ...
    @property
    def self_device_ns(self) -> int: ...

class ConvertOutput:
    """What ``convert`` returns."""

    @property
    def requests(self) -> list[bytes]: ...
    @property
    def ops(self) -> list[OpRow]: ...
    @property
    def stats(self) -> dict[str, int]: ...
    @property
    def phases(self) -> dict[str, int]:
        """Wall time of parse / read / build / free / encode in ns, for benchmarks; parse_tail: the
        second thread's part of the parse (``options["threads"]`` 2), 0 where none was taken."""
    @property
    def window_id(self) -> str: ...

def convert(data: bytes | bytearray | memoryview, options: dict[str, Any]) -> ConvertOutput:
    """Kineto JSON bytes -> ConvertOutput. ``options``: ``ConvertOptions.as_native()``, whose
    ``resource`` is called once (with the GIL) to compose the resource. Releases the GIL."""

def convert_gzip(data: bytes | bytearray | memoryview, options: dict[str, Any], limit: int) -> ConvertOutput:
    """Gzip bytes inflated on a second thread while parsed; absent without zlib."""

streaming_inflater: str  # "isa-l" or "zlib": what convert_gzip inflates with

def gunzip(data: bytes | bytearray | memoryview, limit: int) -> bytearray:
    """Every gzip member inflated into one bytearray (absent when built without zlib). Corrupt or
    truncated data, or more than ``limit`` bytes out, raise TraceError. Releases the GIL."""

class StackSamples:
    """What ``stack_samples`` returns: frames and stacks once each, then the sums by stack."""

    @property
    def frames(self) -> list[tuple[str, str, int]]: ...  # (name, file, line), distinct
    @property
    def stacks(self) -> list[tuple[int, int]]: ...  # (parent stack or -1, frame), parents first
    @property
    def cpu(self) -> list[tuple[int, int | None, int]]: ...  # (stack, step, ns)
    @property
    def device(self) -> list[tuple[int, int | None, int]]: ...
    @property
    def start_ns(self) -> int: ...
    @property
    def end_ns(self) -> int: ...

def stack_samples(data: bytes | bytearray | memoryview, base_time_ns: int | None = None) -> StackSamples:
    """The stack samples of Kineto JSON bytes (capture/profiles/stacks.py's ``samples``, in
    the reference's order), read as ``convert`` reads them. Releases the GIL."""

def schema() -> dict[str, list[tuple[str, ...]]]:
    """The argument and memory attribute tables, for consistency tests."""

def category_kind(category: str) -> int:
    """The Kind a Kineto category maps to (same numbering as otelprof.otlp.schema.Kind)."""

def fold_kernel_name(name: str) -> str:
    """A kernel's span name (otlp.names.fold_kernel_name), for consistency tests."""

def device_name(device_type: int, device_id: int | None) -> str | None:
    """``cpu``, ``cuda:0``, … (otlp.names.device_name), for consistency tests."""

class StepSpanEncoder:
    """Live step records -> ExportTraceServiceRequest bytes (capture/spans/step_spans.py)."""

    def __init__(
        self, resource: list[tuple[str, Any]], scope_version: str, trace_prefix: str, span_base: int
    ) -> None: ...
    def encode(self, steps: Sequence[StepRecord], max_bytes: int) -> list[bytes]:
        """Releases the GIL while encoding."""

@final
class StepHistogram(structseq[Any], tuple[list[int], float]):
    __match_args__: Final = (
        "counts",
        "sum",
    )
    @property
    def counts(self) -> list[int]: ...  # per bucket, not cumulated; the last is +Inf
    @property
    def sum(self) -> float: ...

@final
class StepExemplar(structseq[Any], tuple[int, bytes | None, float, float]):
    __match_args__: Final = (
        "number",
        "trace_id",
        "value",
        "at",
    )
    @property
    def number(self) -> int: ...
    @property
    def trace_id(self) -> bytes | None: ...  # the application span's; None: the step's own
    @property
    def value(self) -> float: ...  # seconds
    @property
    def at(self) -> float: ...  # Unix time of the step's end

@final
class StepSinkMetrics(
    structseq[Any],
    tuple[
        StepHistogram,
        list[StepExemplar | None],
        list[StepHistogram],
        int,
        int,
        int,
        int,
        float | None,
        float | None,
        float | None,
        int,
        int,
    ],
):
    """The step metrics a StepSink folded (one snapshot)."""

    __match_args__: Final = (
        "duration",
        "exemplars",
        "phases",
        "steps",
        "samples",
        "tokens",
        "spans_dropped",
        "last_step",
        "samples_rate",
        "tokens_rate",
        "micro_batches",
        "skipped",
    )
    @property
    def duration(self) -> StepHistogram: ...
    @property
    def exemplars(self) -> list[StepExemplar | None]: ...  # per duration bucket
    @property
    def phases(self) -> list[StepHistogram]: ...  # in PHASES order
    @property
    def steps(self) -> int: ...
    @property
    def samples(self) -> int: ...
    @property
    def tokens(self) -> int: ...
    @property
    def spans_dropped(self) -> int: ...
    @property
    def last_step(self) -> float | None: ...
    @property
    def samples_rate(self) -> float | None: ...
    @property
    def tokens_rate(self) -> float | None: ...
    @property
    def micro_batches(self) -> int: ...
    @property
    def skipped(self) -> int: ...  # steps whose optimizer update was skipped

@final
class LastStep(structseq[Any], tuple[int, int, bytes | None, list[tuple[int, int]]]):
    __match_args__: Final = (
        "number",
        "ordinal",
        "trace_id",
        "phases",
    )
    @property
    def number(self) -> int: ...
    @property
    def ordinal(self) -> int: ...  # the step span's id ordinal
    @property
    def trace_id(self) -> bytes | None: ...
    @property
    def phases(self) -> list[tuple[int, int]]: ...  # (start ns, end ns) of its phase spans
    @property
    def phase_names(self) -> tuple[str, ...]: ...  # their names (an attribute, not in the tuple)

@final
class FoldedStep(
    structseq[Any], tuple[int, float, list[tuple[str, float]], int | None, int | None, int, int, bytes | None]
):
    """The training step a StepSink folded last."""

    __match_args__: Final = (
        "number",
        "seconds",
        "phases",
        "samples",
        "tokens",
        "micro_batches",
        "ordinal",
        "trace_id",
    )
    @property
    def number(self) -> int: ...
    @property
    def seconds(self) -> float: ...
    @property
    def phases(self) -> list[tuple[str, float]]: ...  # (phase, seconds) of those it has a total of, in PHASES order
    @property
    def samples(self) -> int | None: ...
    @property
    def tokens(self) -> int | None: ...
    @property
    def micro_batches(self) -> int: ...
    @property
    def ordinal(self) -> int: ...  # its span's id ordinal
    @property
    def trace_id(self) -> bytes | None: ...  # the application span's; None: the step's own

class StepSink:
    """Closed steps folded into the step metrics and queued for their spans, in C++."""

    def __init__(self, max_pending: int, batch_steps: int) -> None: ...
    def metrics(self) -> StepSinkMetrics: ...
    def encode(self, encoder: StepSpanEncoder, max_bytes: int) -> list[bytes]:
        """The queued steps' spans as requests (the queue empties); releases the GIL to encode."""
    @property
    def pending(self) -> int: ...
    @property
    def spans_dropped(self) -> int: ...
    def clear_queue(self) -> None: ...
    def set_memory(self, memory: tuple[int | None, int | None, int | None, int] | None) -> None:
        """The memory of the training step closing next (StepRecord.memory)."""
    def start_resident(self) -> str:
        """Each training step's resident peak read natively from now on; '' or why not."""
    def stop_resident(self) -> None: ...
    def read_resident(self) -> int | None: ...
    @property
    def resident_exact(self) -> bool: ...
    @staticmethod
    def resident_kept_kib() -> int: ...
    @staticmethod
    def vm_hwm_kib(status: bytes) -> int | None: ...
    def last_memory(self) -> tuple[int | None, int | None, int | None, int] | None: ...
    def reserve(self, count: int) -> int:
        """Span id ordinals for ``count`` spans made outside the sink: the first."""
    def last(self) -> LastStep | None: ...
    def folded(self) -> FoldedStep | None: ...
    def hold(self, max_held: int) -> None:
        """Device-timed steps: each closed step is held until release() (past max_held, the
        oldest is released with its CPU times)."""
    def held(self) -> tuple[int, int, int, list[tuple[int, int]], int] | None:
        """The oldest held step: (number, start ns, end ns, [(start ns, end ns)] of its phases,
        dropped phases), CPU times."""
    def release(self, end: int | None = None, phases: list[tuple[int, int]] | None = None) -> tuple[bool, bool]:
        """Folds and queues the oldest held step with its device times (end None: its CPU
        times); returns (training step, wake the encoder)."""
    @property
    def held_count(self) -> int: ...
    @property
    def held_overflows(self) -> int: ...

class StepTracker:
    """The step rules of capture/steps/tracker.py (native_tracker.py's NativeStepTracker wraps it)."""

    def __init__(
        self,
        on_step: Callable[[Any], None],
        step_type: Callable[..., Any],
        first_step: int = 0,
        clock: Callable[[], int] | None = None,
        on_first_open: Callable[[int], object] | None = None,  # returns the step's window mark
        on_error: Callable[[BaseException], None] | None = None,
        grad_enabled: Callable[[], bool] | None = None,
        on_hint: Callable[[int], None] | None = None,
    ) -> None: ...
    @property
    def failed(self) -> bool: ...
    @property
    def eval_forwards(self) -> int: ...
    def phase_begin(self, phase: str, key: int = 0) -> None: ...
    def phase_end(self, phase: str) -> None: ...
    def set_batch(self, samples: int | None = None, tokens: int | None = None) -> None: ...
    def step(
        self,
        number: int | None = None,
        samples: int | None = None,
        tokens: int | None = None,
        micro_batches: int | None = None,
    ) -> None: ...
    def begin_scope(self, name: str, evaluation: bool = False) -> None: ...
    def end_scope(self) -> None: ...
    def finish(self) -> None: ...
    def abandon(self) -> int:
        """Drops the open step whose span an error made elsewhere; the number it takes."""
    def fail(self, exc: BaseException) -> None: ...
    def release(self) -> None:
        """Drops the callbacks; later events are ignored."""
    def hook(self, name: str) -> Callable[..., None]:
        """A C function torch calls as hook ``name`` (capture/steps/step.py's HOOKS)."""
    def attach(
        self,
        sink: StepSink,
        on_boundary: Callable[[int, float], str | None] | None = None,
        parent: Callable[[], tuple[bytes, bytes] | None] | None = None,
        context_var: Any = None,
        notify: Callable[[], None] | None = None,
        on_held: Callable[[], None] | None = None,
        probe: Callable[[], tuple[int | None, int | None, int | None, int] | None] | None = None,
        probe_when: dict[str, Any] | None = None,
    ) -> None:
        """Closed steps go to ``sink`` (capture/steps/native_tracker.py's NativeStepTracker.attach)."""
