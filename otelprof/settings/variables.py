"""Every environment variable otelprof reads, defined once: name, parser, default and doc.

The variable tables of ``docs/`` and ``otelprof doctor``'s listing are generated from
these definitions (``python -m otelprof.settings`` prints the tables). Groups: ``live``
(instrumentation), ``windows`` (profiling windows), ``distributed``, ``convert`` (conversion
options), ``export`` (OTLP export).
"""

from __future__ import annotations

from ._kinds import Bool, Choice, Host, Int, Names, Number, PathKind, Text
from ._registry import define

_SPEC_BOOL = (
    " A boolean in the OpenTelemetry specification's dialect: ``true`` or ``false`` in any case;"
    " anything else (``1``, ``yes``, ``on`` included, which earlier versions took) warns and the"
    " default applies."
)

# --- conversion ------------------------------------------------------------------------------

OTEL_SERVICE_NAME = define(
    "OTEL_SERVICE_NAME",
    Text(),
    None,
    "``service.name`` of every exported span; wins over a ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``.",
    "convert",
    shown="unset (``unknown_service``)",
)
OTEL_RESOURCE_ATTRIBUTES = define(
    "OTEL_RESOURCE_ATTRIBUTES",
    Text(),
    None,
    "Extra resource attributes as the specification defines them: ``key=value,...``, values"
    " percent-encoded (``deployment.environment=prod,team=ml%20infra``); an entry that cannot be"
    " parsed is skipped with a warning, the others apply.",
    "convert",
)
OTELPROF_DETAIL = define(
    "OTELPROF_DETAIL",
    Choice(("full", "default")),
    "default",
    "How much of a trace becomes spans: ``default`` (short CPU spans dropped or aggregated within"
    " the span budget, span events and links capped) or ``full`` (every event).",
    "convert",
)
OTELPROF_REQUIRE_NATIVE = define(
    "OTELPROF_REQUIRE_NATIVE",
    Bool(),
    False,
    "``true``: a native core (``otelprof._native``) that does not load raises ``ImportError`` at"
    " the first conversion or live session instead of letting the Python reference engine and"
    " trackers take over (CI sets it, so a broken build fails the tests)." + _SPEC_BOOL,
    "convert",
)
OTELPROF_RUN_ID = define(
    "OTELPROF_RUN_ID",
    Text(),
    None,
    "Identifies one training run: trace ids derive from (run id, step), so every rank sharing it"
    " puts step N in one trace. Live: else the launcher's job id, else rank 0's random id;"
    " conversion: else each trace file gets its own.",
    "convert",
    shown="unset (launcher's job id, else random; per trace file when converting)",
)
OTELPROF_MAX_REQUEST_BYTES = define(
    "OTELPROF_MAX_REQUEST_BYTES",
    Int(1024, 2**31 - 1),  # protobuf refuses messages of 2 GiB or more
    3 * 1024 * 1024,
    "Largest serialized OTLP ``ExportTraceServiceRequest``, in bytes (at least 1024, under 2 GiB), for"
    " converted traces and live step spans alike; bigger ones are split.",
    "convert",
    shown="``3145728`` (3 MiB, under the Collector's 4 MiB gRPC limit)",
)
OTELPROF_MIN_DURATION_US = define(
    "OTELPROF_MIN_DURATION_US",
    Number(lambda v: 0 <= v <= 9e12, "a non-negative number of microseconds"),  # 9e12 us fits int64 ns
    10.0,
    "At ``default`` detail, CPU-side events shorter than this many microseconds (fractions"
    " allowed) do not become spans of their own.",
    "convert",
)
OTELPROF_SPAN_BUDGET = define(
    "OTELPROF_SPAN_BUDGET",
    Int(0),
    1000,
    "At ``default`` detail, the most spans one trace holds (``0``: no limit): past it, repeated"
    " sibling spans are aggregated, then the least significant dropped and named on their parent.",
    "convert",
)
OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT = define(
    "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    Int(0, 2**31 - 1),
    8192,
    "Characters kept of a converted span's string attribute value (cut values are counted in"
    ' ``stats["values_truncated"]``); resource values read from a trace file are also cut at'
    " 1/64 of ``OTELPROF_MAX_REQUEST_BYTES``. ``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`` wins when"
    " set. (The SDK default is no limit, but a trace file's strings are input.)",
    "convert",
)
OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT = define(
    "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    Int(0, 2**31 - 1),
    8192,
    "Span-specific ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` (wins when set).",
    "convert",
    general="OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
)
OTELPROF_SPOOL_DIR = define(
    "OTELPROF_SPOOL_DIR",
    PathKind(),
    None,
    "Where export requests wait while the backend is unreachable (and go when no endpoint is set).",
    "convert",
    shown="``~/.cache/otelprof/spool``",
)

# --- OTLP export (the specification's names; the TRACES_ variant wins) ----------------------

OTEL_EXPORTER_OTLP_ENDPOINT = define(
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    Text(),
    None,
    "Base URL of the OTLP receiver; ``http/protobuf`` appends ``v1/traces`` to it (not to the"
    " ``TRACES_`` form, used as is). A value that is not an http(s) URL is ignored after one"
    " warning. User info (``https://user:pass@host``) is sent as HTTP Basic authorization, never"
    " shown. otelprof does not assume the specification's localhost default: a job must not"
    " depend on a Collector nobody started.",
    "export",
    shown="unset: spool only (a value that is not an http(s) URL: one warning, then the same)",
    unset_means="none, spans go to the spool",
)
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = define(
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    Text(),
    None,
    "Full URL for traces, used as is.",
    "export",
    general=OTEL_EXPORTER_OTLP_ENDPOINT,
)
OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT = define(
    "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
    Text(),
    None,
    "Full URL for profiles (``with_stack`` windows), used as is. Unset: the traces endpoint's"
    " host with ``/v1development/profiles`` (HTTP), or the same gRPC endpoint.",
    "export",
    general=OTEL_EXPORTER_OTLP_ENDPOINT,
)
OTEL_EXPORTER_OTLP_PROTOCOL = define(
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    Choice(("grpc", "http/protobuf")),
    "http/protobuf",
    "``grpc`` or ``http/protobuf``.",
    "export",
)
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = define(
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    Choice(("grpc", "http/protobuf")),
    "http/protobuf",
    "Signal-specific ``OTEL_EXPORTER_OTLP_PROTOCOL``.",
    "export",
    general=OTEL_EXPORTER_OTLP_PROTOCOL,
)
OTEL_EXPORTER_OTLP_HEADERS = define(
    "OTEL_EXPORTER_OTLP_HEADERS",
    Text(),
    None,
    "Request headers, ``key=value,...``, values percent-encoded; values are never logged. A name"
    " that is not an HTTP token, or a value with control characters or non-ASCII, is refused"
    " (one warning naming the header).",
    "export",
)
OTEL_EXPORTER_OTLP_TRACES_HEADERS = define(
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    Text(),
    None,
    "Signal-specific ``OTEL_EXPORTER_OTLP_HEADERS`` (replaces it, not merged).",
    "export",
    general=OTEL_EXPORTER_OTLP_HEADERS,
)
OTEL_EXPORTER_OTLP_COMPRESSION = define(
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    Choice(("gzip", "none")),
    "none",
    "``gzip`` or ``none``.",
    "export",
)
OTEL_EXPORTER_OTLP_TRACES_COMPRESSION = define(
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
    Choice(("gzip", "none")),
    "none",
    "Signal-specific ``OTEL_EXPORTER_OTLP_COMPRESSION``.",
    "export",
    general=OTEL_EXPORTER_OTLP_COMPRESSION,
)
_TIMEOUT = Number(lambda v: 0 < v < 86_400_000, "a positive number of milliseconds")
OTEL_EXPORTER_OTLP_TIMEOUT = define(
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    _TIMEOUT,
    10000.0,
    "Time limit of one export request, in milliseconds.",
    "export",
)
OTEL_EXPORTER_OTLP_TRACES_TIMEOUT = define(
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    _TIMEOUT,
    10000.0,
    "Signal-specific ``OTEL_EXPORTER_OTLP_TIMEOUT``.",
    "export",
    general=OTEL_EXPORTER_OTLP_TIMEOUT,
)
OTEL_EXPORTER_OTLP_CERTIFICATE = define(
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    PathKind(),
    None,
    "PEM file of the CA certificates that verify the receiver (a file that is not there: one warning, ignored).",
    "export",
    shown="system roots",
)
OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE = define(
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
    PathKind(),
    None,
    "Signal-specific ``OTEL_EXPORTER_OTLP_CERTIFICATE``.",
    "export",
    general=OTEL_EXPORTER_OTLP_CERTIFICATE,
)
OTEL_EXPORTER_OTLP_CLIENT_KEY = define(
    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    PathKind(),
    None,
    "PEM file of the client's private key for mutual TLS.",
    "export",
)
OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY = define(
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
    PathKind(),
    None,
    "Signal-specific ``OTEL_EXPORTER_OTLP_CLIENT_KEY``.",
    "export",
    general=OTEL_EXPORTER_OTLP_CLIENT_KEY,
)
OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE = define(
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    PathKind(),
    None,
    "PEM file of the client's certificate chain for mutual TLS.",
    "export",
)
OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE = define(
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
    PathKind(),
    None,
    "Signal-specific ``OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE``.",
    "export",
    general=OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE,
)
OTEL_EXPORTER_OTLP_INSECURE = define(
    "OTEL_EXPORTER_OTLP_INSECURE",
    Bool(),
    False,
    "``true`` turns off TLS for a gRPC endpoint given without a scheme.",
    "export",
)
OTEL_EXPORTER_OTLP_TRACES_INSECURE = define(
    "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
    Bool(),
    False,
    "Signal-specific ``OTEL_EXPORTER_OTLP_INSECURE``.",
    "export",
    general=OTEL_EXPORTER_OTLP_INSECURE,
)
OTEL_TRACES_EXPORTER = define(
    "OTEL_TRACES_EXPORTER",
    Text(),
    None,
    "Comma-separated span exporters: ``otlp`` is otelprof's own OTLP path; any other name (``console``,"
    " ``zipkin_json``, a vendor's) is the OpenTelemetry SDK's exporter of that entry point, fed through"
    " the SDK route (docs/opentelemetry-sdk.md); ``none`` sends no spans.",
    "export",
    shown="``otlp``",
)
OTEL_TRACES_SAMPLER = define(
    "OTEL_TRACES_SAMPLER",
    Text(),
    None,
    "Which step and window traces are sent, one decision per trace id (every rank agrees):"
    " ``always_on``, ``always_off``, ``traceidratio``, ``parentbased_always_on``,"
    " ``parentbased_always_off``, ``parentbased_traceidratio``, or an ``opentelemetry_traces_sampler``"
    " entry point's name; anything else warns once and sends every trace.",
    "export",
    shown="``parentbased_always_on``",
)
OTEL_TRACES_SAMPLER_ARG = define(
    "OTEL_TRACES_SAMPLER_ARG",
    Text(),
    None,
    "The ratio of the ``*traceidratio`` samplers, 0 to 1 (unset or unusable: 1.0, with a warning"
    " when unusable); an entry point's sampler gets the text as it is.",
    "export",
)
OTEL_SDK_DISABLED = define(
    "OTEL_SDK_DISABLED",
    Bool(),
    False,
    "``true`` turns otelprof's exporting (requests are counted as dropped) and instrumentation off.",
    "export",
)

# --- live instrumentation -------------------------------------------------------------------

OTELPROF_ENABLED = define(
    "OTELPROF_ENABLED",
    Bool(),
    True,
    "``false`` turns the auto-instrumentor off (``import otelprof.auto`` and ``otelprof run`` then"
    " do nothing), as ``OTEL_SDK_DISABLED=true`` does." + _SPEC_BOOL,
    "live",
)
OTELPROF_QUIET = define(
    "OTELPROF_QUIET",
    Bool(),
    False,
    "``true`` silences the one line an instrumented process writes to stderr when its first step"
    " starts (local rank 0 only): where spans and metrics go and when windows profile."
    " ``otelprof run -q`` sets it." + _SPEC_BOOL,
    "live",
)
OTELPROF_CUDA_EVENTS = define(
    "OTELPROF_CUDA_EVENTS",
    Bool(),
    True,
    "With CUDA, step and phase times come from CUDA events read back without synchronizing"
    " (steps are reported a step or two late); ``false``: CPU wall time." + _SPEC_BOOL,
    "live",
)
OTELPROF_STEP_MEMORY = define(
    "OTELPROF_STEP_MEMORY",
    Bool(),
    True,
    "Every step's memory peaks (CUDA's allocated and reserved bytes when CUDA is initialised, the"
    " process's resident high-water mark) as step-span attributes and the"
    " ``otelprof_step_memory_peak_bytes`` gauge; the process's own peak readings stay as without"
    " otelprof." + _SPEC_BOOL,
    "live",
)
OTELPROF_OOM_WAIT = define(
    "OTELPROF_OOM_WAIT",
    Number(lambda v: 0 <= v <= 600, "0 to 600 seconds"),
    10.0,
    "When an out-of-memory error ends the training loop, the most seconds otelprof takes to deliver"
    " or spool the failed step and its metrics before the process exits.",
    "live",
)
OTELPROF_SIGTERM_GRACE = define(
    "OTELPROF_SIGTERM_GRACE",
    Number(lambda v: 0 <= v <= 600, "0 to 600 seconds"),
    10.0,
    "On SIGTERM (Kubernetes, Slurm, torchelastic preempting), the most seconds otelprof takes to"
    " close the step, stop a window and deliver or spool what it holds before the process ends"
    " as it would have (a handler of the program's own is called too); ``0`` leaves SIGTERM alone.",
    "live",
)
OTEL_METRICS_EXPORTER = define(
    "OTEL_METRICS_EXPORTER",
    Names(("prometheus", "otlp", "none")),
    ("prometheus",),
    "Comma-separated: ``prometheus`` serves ``/metrics``, ``otlp`` also pushes the same metrics"
    " through the OpenTelemetry SDK (``pip install 'otelprof[metrics]'``), ``none`` neither."
    " (The specification's default is ``otlp``; these metrics are made for scraping.)",
    "live",
    shown="``prometheus``",
)
OTEL_EXPORTER_OTLP_METRICS_PROTOCOL = define(
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    Text(),
    None,
    "Signal-specific ``OTEL_EXPORTER_OTLP_PROTOCOL`` for the OTLP metrics (the SDK's exporter"
    " reads the other ``OTEL_EXPORTER_OTLP_METRICS_*`` variables).",
    "live",
    general=OTEL_EXPORTER_OTLP_PROTOCOL,
)
OTEL_EXPORTER_PROMETHEUS_HOST = define(
    "OTEL_EXPORTER_PROMETHEUS_HOST",
    Host(),
    "localhost",
    "Address the ``/metrics`` endpoint (and ``POST /profile``) listens on: an IP address or a host"
    " name (anything else, a URL or a path: one warning, then ``localhost``).",
    "live",
)
OTEL_EXPORTER_PROMETHEUS_PORT = define(
    "OTEL_EXPORTER_PROMETHEUS_PORT",
    Int(0, 65535),
    9464,
    "Port of ``/metrics``, plus the local rank (ranks on one host do not collide); ``0`` picks a free one (logged).",
    "live",
)

# --- profiling windows ----------------------------------------------------------------------

OTELPROF_PROFILE = define(
    "OTELPROF_PROFILE",
    Bool(),
    True,
    "``false``: never start torch.profiler (steps and metrics only)." + _SPEC_BOOL,
    "windows",
)
OTELPROF_PROFILE_SKIP_FIRST = define(
    "OTELPROF_PROFILE_SKIP_FIRST",
    Int(0),
    10,
    "Steps before the schedule starts (torch.profiler.schedule's ``skip_first``).",
    "windows",
)
OTELPROF_PROFILE_WAIT = define(
    "OTELPROF_PROFILE_WAIT", Int(0), 500, "Unprofiled steps at the start of each cycle (``wait``).", "windows"
)
OTELPROF_PROFILE_WARMUP = define(
    "OTELPROF_PROFILE_WARMUP",
    Int(0),
    1,
    "Steps the profiler runs without keeping before each window (``warmup``).",
    "windows",
)
OTELPROF_PROFILE_ACTIVE = define(
    "OTELPROF_PROFILE_ACTIVE", Int(1), 2, "Steps recorded per window (``active``, at least 1).", "windows"
)
OTELPROF_PROFILE_REPEAT = define(
    "OTELPROF_PROFILE_REPEAT",
    Int(0),
    0,
    "Scheduled windows in all (``repeat``); ``0`` repeats for the whole run.",
    "windows",
)
OTELPROF_PROFILE_EARLY = define(
    "OTELPROF_PROFILE_EARLY",
    Int(0),
    10,
    "The early window's warmup step, counted from the run's first step (it records the"
    " ``OTELPROF_PROFILE_ACTIVE`` steps after it, so a short run still gets operator spans);"
    " ``0`` off; left out when the schedule's first window (``skip_first + wait``) comes before"
    " it ends. By default step 10 warms up, 11 and 12 are recorded, then the schedule records"
    " 511 and 512.",
    "windows",
)
#: The torch.profiler options a window can turn on (``execution_trace`` is otelprof's: an observer).
PROFILER_OPTIONS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules", "execution_trace")
OTELPROF_PROFILE_OPTIONS = define(
    "OTELPROF_PROFILE_OPTIONS",
    Names(PROFILER_OPTIONS),
    (),
    "Comma-separated torch.profiler options to turn on: ``record_shapes``, ``profile_memory``,"
    " ``with_stack``, ``with_flops``, ``with_modules``, and ``execution_trace`` (each window also"
    " records torch's ``ExecutionTraceObserver``: its tensor shapes, dtypes, strides, ids and"
    " producing ops go onto the op spans, its gzip file is kept beside the window's trace)"
    " (an unknown one: a warning, ignored)."
    " ``profile_memory`` turns on ``record_shapes`` and ``with_stack`` too: torch needs them to"
    " categorize memory (*Memory by category* in docs/profiling-windows.md).",
    "windows",
    shown="unset (all off)",
)
OTELPROF_PEAK_FLOPS = define(
    "OTELPROF_PEAK_FLOPS",
    Number(lambda v: 0 < v < 1e21, "a positive number of FLOP/s"),
    None,
    "The device's peak FLOP/s that model FLOPs utilisation (``otelprof_mfu_ratio``) is measured"
    " against, instead of the built-in table of NVIDIA and AMD parts by device name and dtype;"
    " on CPU, MFU is reported only with it. Needs ``with_flops`` in ``OTELPROF_PROFILE_OPTIONS``.",
    "windows",
    shown="unset (the device's dense peak for the window's matmul dtype)",
)
OTELPROF_TRIGGER_FILE = define(
    "OTELPROF_TRIGGER_FILE",
    Text(),
    None,
    "A path: when a file appears there, the next steps are profiled (the file is removed).",
    "windows",
)
OTELPROF_TRIGGER_SIGNAL = define(
    "OTELPROF_TRIGGER_SIGNAL",
    Text(),
    "SIGUSR2",
    "A signal name that profiles the next steps (``kill -USR2 PID``); not installed over a"
    " program's own handler; ``none`` installs nothing.",
    "windows",
)
OTELPROF_TRIGGER_HTTP = define(
    "OTELPROF_TRIGGER_HTTP",
    Bool(),
    True,
    "Whether ``curl -X POST 'http://HOST:PORT/profile?steps=N'`` on the metrics endpoint profiles"
    " the next steps (202; 409 when profiling is off, 400 for a bad ``steps``; 401, 403 and 429 as"
    " ``OTELPROF_PROFILE_TOKEN`` and ``OTELPROF_PROFILE_MIN_INTERVAL`` say)." + _SPEC_BOOL,
    "windows",
)
OTELPROF_PROFILE_TOKEN = define(
    "OTELPROF_PROFILE_TOKEN",
    Text(),
    None,
    "A secret that ``POST /profile`` must carry as ``Authorization: Bearer TOKEN`` (else 401);"
    " never logged. Unset, ``POST /profile`` answers only on a loopback address: on any other"
    " (``OTEL_EXPORTER_PROMETHEUS_HOST=0.0.0.0``) it is refused (403, one warning at start)."
    " ``/metrics`` stays open either way.",
    "windows",
    shown="unset (``POST /profile`` from loopback only)",
)
OTELPROF_PROFILE_MIN_INTERVAL = define(
    "OTELPROF_PROFILE_MIN_INTERVAL",
    Number(lambda v: 0 <= v <= 86400, "0 to 86400 seconds"),
    60.0,
    "Seconds a ``POST /profile`` waits after the last window ended (any trigger) or was last"
    " requested over HTTP; sooner, or while a window is requested or running, it answers 429"
    " with ``Retry-After``. ``0``: one window at a time, back to back.",
    "windows",
)
OTELPROF_PROFILE_MAX_STEPS = define(
    "OTELPROF_PROFILE_MAX_STEPS",
    Int(1, 1000),
    20,
    "The most steps ``POST /profile?steps=N`` may ask for (more: 400).",
    "windows",
)
OTELPROF_ON_DEMAND_STEPS = define(
    "OTELPROF_ON_DEMAND_STEPS", Int(1), 2, "Steps recorded by a triggered or slow-step window.", "windows"
)
OTELPROF_ANOMALY_FACTOR = define(
    "OTELPROF_ANOMALY_FACTOR",
    Number(lambda v: v == 0 or 1 < v < 1e6, "0 or a number above 1"),
    3.0,
    "A step slower than this many times the median of the last 50 starts a window (at most once"
    " per 10 minutes); ``0`` off.",
    "windows",
)

OTELPROF_KEEP_TRACES = define(
    "OTELPROF_KEEP_TRACES",
    Int(0, 1_000_000),
    5,
    "How many of otelprof's own profiling windows each rank keeps as raw Kineto traces"
    " (``.pt.trace.json.gz``, for Perfetto, TensorBoard, HTA or ``otelprof convert``; named on"
    " the window's trace roots as ``otelprof.source.file``), the oldest removed first; ``0``"
    " keeps none. Your own profiler's windows are never copied.",
    "windows",
)
OTELPROF_KEEP_TRACES_MAX_BYTES = define(
    "OTELPROF_KEEP_TRACES_MAX_BYTES",
    Int(1),
    512 * 1024 * 1024,
    "The most bytes of kept traces in ``OTELPROF_TRACE_DIR``, all ranks together; the oldest go"
    " first, and a trace bigger than this alone is not kept (counted).",
    "windows",
    shown="``536870912`` (512 MiB)",
)
OTELPROF_TRACE_DIR = define(
    "OTELPROF_TRACE_DIR",
    PathKind(),
    None,
    "Where the kept window traces go: a private folder (made 0700, files 0600; one that is a"
    " symbolic link, another user's or writable by others is refused, logged once). A trace not"
    " kept is counted in ``otelprof_window_traces_not_kept_total``; the window is sent all the same.",
    "windows",
    shown="``~/.cache/otelprof/traces``",
)
OTELPROF_PROFILES_EXPORT = define(
    "OTELPROF_PROFILES_EXPORT",
    Bool(),
    True,
    "With ``with_stack`` in ``OTELPROF_PROFILE_OPTIONS``, each of otelprof's own windows also becomes"
    " stack samples (CPU self time and device time on the stack that launched them), sent as an OTLP"
    " profile to the profiles endpoint (``/v1development/profiles``); ``false`` sends none (for a"
    " backend without a profiles pipeline). The pprof file and collapsed stacks beside the kept"
    " trace follow ``OTELPROF_KEEP_TRACES``.",
    "windows",
)

# --- distributed jobs ------------------------------------------------------------------------

OTELPROF_STRAGGLER_STEPS = define(
    "OTELPROF_STRAGGLER_STEPS",
    Int(0),
    100,
    "Every this many steps each rank shares its mean step time (one non-blocking ``all_gather``"
    " of one float on otelprof's own gloo group) for ``otelprof_straggler_ratio``; ``0`` off.",
    "distributed",
)
OTELPROF_SPLIT_WORLD_SIZE = define(
    "OTELPROF_SPLIT_WORLD_SIZE",
    Int(0),
    4,
    "From this world size on, a profiled step's operators and kernels go to a per-rank detail"
    " trace linked to the step trace, which holds one step span per rank; ``0`` never splits.",
    "distributed",
)
