"""Every environment variable otelprof reads, defined once.

An unset or empty variable means "use the default". A value that cannot be used logs one
warning naming the variable and the value used instead, and the default applies; a bad
environment never raises.
"""

OTEL_SERVICE_NAME = "OTEL_SERVICE_NAME"
"""
.. envvar:: OTEL_SERVICE_NAME

The ``service.name`` resource attribute of every exported span. Takes precedence over a
``service.name`` given in :envvar:`OTEL_RESOURCE_ATTRIBUTES`.
Default: unset, in which case ``service.name`` is ``unknown_service``.
"""

OTEL_RESOURCE_ATTRIBUTES = "OTEL_RESOURCE_ATTRIBUTES"
"""
.. envvar:: OTEL_RESOURCE_ATTRIBUTES

Extra resource attributes, as the OpenTelemetry specification defines them: comma-separated
``key=value`` pairs, values percent-encoded (``deployment.environment=prod,team=ml%20infra``).
An entry that cannot be parsed is skipped with a warning; the others still apply.
Default: unset (no extra attributes).
"""

OTELPROF_DETAIL = "OTELPROF_DETAIL"
"""
.. envvar:: OTELPROF_DETAIL

How much of a trace becomes spans: ``default`` (CPU spans shorter than the minimum duration
are dropped or aggregated, span events and links are capped) or ``full`` (every event).
Default: ``default``.
"""

OTELPROF_RUN_ID = "OTELPROF_RUN_ID"
"""
.. envvar:: OTELPROF_RUN_ID

Identifies one training run. Trace ids derive from (run id, step), so every rank of a run
that shares it puts step N's spans in the same trace.
Default: unset, in which case each trace file gets its own id (from its metadata, else its
name and start time).
"""

OTELPROF_MAX_REQUEST_BYTES = "OTELPROF_MAX_REQUEST_BYTES"
"""
.. envvar:: OTELPROF_MAX_REQUEST_BYTES

Largest serialized OTLP ``ExportTraceServiceRequest``, in bytes (at least 1024); bigger
conversions are split into several requests.
Default: ``3145728`` (3 MiB, under the Collector's 4 MiB gRPC receive limit).
"""

OTELPROF_MIN_DURATION_US = "OTELPROF_MIN_DURATION_US"
"""
.. envvar:: OTELPROF_MIN_DURATION_US

At ``default`` detail, CPU-side events shorter than this many microseconds (a non-negative
number, fractions allowed) do not become spans of their own. Ignored at ``full`` detail.
Default: ``10``.
"""

OTELPROF_SPAN_BUDGET = "OTELPROF_SPAN_BUDGET"
"""
.. envvar:: OTELPROF_SPAN_BUDGET

At ``default`` detail, the most spans one trace holds (a non-negative integer; ``0`` is no
limit): past it, runs of repeated sibling spans are aggregated, then the least significant
spans are dropped and named on their parent. Ignored at ``full`` detail.
Default: ``1000``.
"""

OTELPROF_SPLIT_WORLD_SIZE = "OTELPROF_SPLIT_WORLD_SIZE"
"""
.. envvar:: OTELPROF_SPLIT_WORLD_SIZE

From this world size on, a profiled step's operators and kernels go to a per-rank detail trace
linked to the step trace, which then holds one step span per rank (a non-negative integer;
``0`` never splits). Default: ``4``.
"""

__all__ = [
    "OTELPROF_DETAIL",
    "OTELPROF_MAX_REQUEST_BYTES",
    "OTELPROF_MIN_DURATION_US",
    "OTELPROF_RUN_ID",
    "OTELPROF_SPAN_BUDGET",
    "OTELPROF_SPLIT_WORLD_SIZE",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_SERVICE_NAME",
]

# --- OTLP exporter (OpenTelemetry specification names; the TRACES_ variant wins) -----------

OTEL_SDK_DISABLED = "OTEL_SDK_DISABLED"
"""
.. envvar:: OTEL_SDK_DISABLED

``true`` (any case) disables otelprof's exporting entirely. Default: ``false``.
"""

OTEL_EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
"""
.. envvar:: OTEL_EXPORTER_OTLP_ENDPOINT

Base URL of the OTLP receiver. For ``http/protobuf`` the path ``v1/traces`` is appended to it.
A value that is not an http(s) URL is ignored after one warning, as if unset.
Default: none, spans go to the spool (otelprof does not assume the specification's
``http://localhost:4318`` or ``:4317``: a job must not depend on a Collector nobody started).
"""

OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
"""
.. envvar:: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT

Full URL for traces, used as is (no path appended). Default: derived from the general endpoint.
"""

OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
"""
.. envvar:: OTEL_EXPORTER_OTLP_PROTOCOL

``grpc`` or ``http/protobuf``. Default: ``http/protobuf`` (the specification's default).
"""

OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
"""Signal-specific :envvar:`OTEL_EXPORTER_OTLP_PROTOCOL`."""

OTEL_EXPORTER_OTLP_HEADERS = "OTEL_EXPORTER_OTLP_HEADERS"
"""
.. envvar:: OTEL_EXPORTER_OTLP_HEADERS

Request headers, ``key=value`` pairs separated by commas, values percent-encoded. Values are
never logged. Default: none.
"""

OTEL_EXPORTER_OTLP_TRACES_HEADERS = "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
"""Signal-specific :envvar:`OTEL_EXPORTER_OTLP_HEADERS` (replaces it, not merged)."""

OTEL_EXPORTER_OTLP_COMPRESSION = "OTEL_EXPORTER_OTLP_COMPRESSION"
"""
.. envvar:: OTEL_EXPORTER_OTLP_COMPRESSION

``gzip`` or ``none``. Default: ``none``.
"""

OTEL_EXPORTER_OTLP_TRACES_COMPRESSION = "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"
"""Signal-specific :envvar:`OTEL_EXPORTER_OTLP_COMPRESSION`."""

OTEL_EXPORTER_OTLP_TIMEOUT = "OTEL_EXPORTER_OTLP_TIMEOUT"
"""
.. envvar:: OTEL_EXPORTER_OTLP_TIMEOUT

Time limit of one export request, in milliseconds. Default: ``10000``.
"""

OTEL_EXPORTER_OTLP_TRACES_TIMEOUT = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"
"""Signal-specific :envvar:`OTEL_EXPORTER_OTLP_TIMEOUT`."""

OTEL_EXPORTER_OTLP_CERTIFICATE = "OTEL_EXPORTER_OTLP_CERTIFICATE"
"""
.. envvar:: OTEL_EXPORTER_OTLP_CERTIFICATE

PEM file of the CA certificates that verify the receiver's certificate. Default: system roots.
"""

OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE = "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE"
"""Signal-specific :envvar:`OTEL_EXPORTER_OTLP_CERTIFICATE`."""

OTEL_EXPORTER_OTLP_CLIENT_KEY = "OTEL_EXPORTER_OTLP_CLIENT_KEY"
"""
.. envvar:: OTEL_EXPORTER_OTLP_CLIENT_KEY

PEM file of the client's private key for mutual TLS. Default: none.
"""

OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY = "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY"
"""Signal-specific :envvar:`OTEL_EXPORTER_OTLP_CLIENT_KEY`."""

OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE = "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"
"""
.. envvar:: OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE

PEM file of the client's certificate chain for mutual TLS. Default: none.
"""

OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE = "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE"
"""Signal-specific :envvar:`OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`."""

OTEL_EXPORTER_OTLP_INSECURE = "OTEL_EXPORTER_OTLP_INSECURE"
"""
.. envvar:: OTEL_EXPORTER_OTLP_INSECURE

``true`` turns off TLS for a gRPC endpoint given without a scheme. Default: ``false``.
"""

OTEL_EXPORTER_OTLP_TRACES_INSECURE = "OTEL_EXPORTER_OTLP_TRACES_INSECURE"
"""Signal-specific :envvar:`OTEL_EXPORTER_OTLP_INSECURE`."""

OTELPROF_SPOOL_DIR = "OTELPROF_SPOOL_DIR"
"""
.. envvar:: OTELPROF_SPOOL_DIR

Where export requests wait while the backend is unreachable (and where they go when no
endpoint is configured). Default: ``~/.cache/otelprof/spool``.
"""

# --- live instrumentation -------------------------------------------------------------------

OTELPROF_ENABLED = "OTELPROF_ENABLED"
"""
.. envvar:: OTELPROF_ENABLED

``false`` turns the auto-instrumentor off (``import otelprof.auto`` and ``otelprof run`` then do
nothing), as ``OTEL_SDK_DISABLED=true`` does. Default: ``true``.
"""

OTEL_EXPORTER_PROMETHEUS_HOST = "OTEL_EXPORTER_PROMETHEUS_HOST"
"""
.. envvar:: OTEL_EXPORTER_PROMETHEUS_HOST

Address the ``/metrics`` endpoint listens on (OpenTelemetry specification name).
Default: ``localhost``.
"""

OTEL_EXPORTER_PROMETHEUS_PORT = "OTEL_EXPORTER_PROMETHEUS_PORT"
"""
.. envvar:: OTEL_EXPORTER_PROMETHEUS_PORT

Port of the ``/metrics`` endpoint; each local rank adds its local rank to it, so ranks on one
host do not collide. ``0`` picks a free port (logged). Default: ``9464``.
"""

OTELPROF_CUDA_EVENTS = "OTELPROF_CUDA_EVENTS"
"""
.. envvar:: OTELPROF_CUDA_EVENTS

With CUDA in use, time steps and phases with CUDA events read back without synchronizing the
device (steps are then reported a step or two late); ``false`` keeps CPU wall time. Default:
``true``.
"""

OTEL_METRICS_EXPORTER = "OTEL_METRICS_EXPORTER"
"""
.. envvar:: OTEL_METRICS_EXPORTER

Comma-separated: ``prometheus`` serves ``/metrics``, ``otlp`` also pushes the same metrics
through the OpenTelemetry SDK (``pip install 'otelprof[metrics]'``), ``none`` neither.
Default: ``prometheus`` (the specification's default is ``otlp``; otelprof's always-on
metrics are made for scraping, so pushing is opt-in).
"""

OTEL_EXPORTER_OTLP_METRICS_PROTOCOL = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
"""Signal-specific :envvar:`OTEL_EXPORTER_OTLP_PROTOCOL` for the OTLP metrics (read with the
other ``OTEL_EXPORTER_OTLP_METRICS_*`` variables by the SDK's exporter)."""

# --- distributed jobs ------------------------------------------------------------------------

OTELPROF_STRAGGLER_STEPS = "OTELPROF_STRAGGLER_STEPS"
"""
.. envvar:: OTELPROF_STRAGGLER_STEPS

With torch.distributed initialized and more than one rank, every this many steps each rank
shares its mean step time with the others (one non-blocking all_gather of one float on
otelprof's own gloo group) for ``otelprof_straggler_ratio``; ``0`` turns it off.
Default: ``100``.
"""

# --- profiling windows ----------------------------------------------------------------------

OTELPROF_PROFILE = "OTELPROF_PROFILE"
"""
.. envvar:: OTELPROF_PROFILE

``false`` keeps torch.profiler off entirely (steps and metrics only). Default: ``true``.
"""

OTELPROF_PROFILE_SKIP_FIRST = "OTELPROF_PROFILE_SKIP_FIRST"
"""
.. envvar:: OTELPROF_PROFILE_SKIP_FIRST

Steps before the schedule starts (torch.profiler.schedule's ``skip_first``). Default: ``10``.
"""

OTELPROF_PROFILE_WAIT = "OTELPROF_PROFILE_WAIT"
"""
.. envvar:: OTELPROF_PROFILE_WAIT

Unprofiled steps at the start of each cycle (``wait``). Default: ``500``.
"""

OTELPROF_PROFILE_WARMUP = "OTELPROF_PROFILE_WARMUP"
"""
.. envvar:: OTELPROF_PROFILE_WARMUP

Steps the profiler runs without keeping before each window (``warmup``). Default: ``1``.
"""

OTELPROF_PROFILE_ACTIVE = "OTELPROF_PROFILE_ACTIVE"
"""
.. envvar:: OTELPROF_PROFILE_ACTIVE

Steps recorded per window (``active``, at least 1). Default: ``2``.
"""

OTELPROF_PROFILE_REPEAT = "OTELPROF_PROFILE_REPEAT"
"""
.. envvar:: OTELPROF_PROFILE_REPEAT

Scheduled windows in all (``repeat``); ``0`` repeats for the whole run. Default: ``0``.
"""

OTELPROF_PROFILE_EARLY = "OTELPROF_PROFILE_EARLY"
"""
.. envvar:: OTELPROF_PROFILE_EARLY

One early window before the schedule's first: its warmup step is this many steps after the
run's first step, and it records :envvar:`OTELPROF_PROFILE_ACTIVE` steps, so a short run still
gets operator spans. ``0`` turns it off; it is also left out when it would not end before the
schedule's first window begins (``skip_first + wait``). Default: ``10`` (steps numbered from 0:
step 10 warms the profiler up, steps 11 and 12 are recorded; the schedule's first window then
records steps 511 and 512).
"""

OTELPROF_PROFILE_OPTIONS = "OTELPROF_PROFILE_OPTIONS"
"""
.. envvar:: OTELPROF_PROFILE_OPTIONS

Comma-separated torch.profiler options to turn on: ``record_shapes``, ``profile_memory``,
``with_stack``, ``with_flops``, ``with_modules``. Default: unset (all off).
"""

OTELPROF_TRIGGER_FILE = "OTELPROF_TRIGGER_FILE"
"""
.. envvar:: OTELPROF_TRIGGER_FILE

A path: when a file appears there, the next steps are profiled (the file is removed).
Default: unset.
"""

OTELPROF_TRIGGER_SIGNAL = "OTELPROF_TRIGGER_SIGNAL"
"""
.. envvar:: OTELPROF_TRIGGER_SIGNAL

A signal name (``SIGUSR2``) that profiles the next steps; installed only when the program has
no handler of its own for it; ``none`` installs nothing. Default: ``SIGUSR2``.
"""

OTELPROF_TRIGGER_HTTP = "OTELPROF_TRIGGER_HTTP"
"""
.. envvar:: OTELPROF_TRIGGER_HTTP

Whether ``POST /profile[?steps=N]`` on the metrics endpoint profiles the next steps (it binds
where ``/metrics`` does: ``OTEL_EXPORTER_PROMETHEUS_HOST``). Default: ``true``.
"""

OTELPROF_ON_DEMAND_STEPS = "OTELPROF_ON_DEMAND_STEPS"
"""
.. envvar:: OTELPROF_ON_DEMAND_STEPS

Steps recorded by a window a trigger or a slow step starts. Default: ``2``.
"""

OTELPROF_ANOMALY_FACTOR = "OTELPROF_ANOMALY_FACTOR"
"""
.. envvar:: OTELPROF_ANOMALY_FACTOR

A step slower than this many times the median of the last 50 profiles the next steps, at
most once per 10 minutes; ``0`` turns it off. Default: ``3``.
"""

# --- attribute limits (OpenTelemetry specification names; the SPAN_ variant wins) ----------

OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT = "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"
"""
.. envvar:: OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT

Characters kept of a string attribute value of a converted span (longer values are cut, as
the OpenTelemetry SDKs do); resource values read from a trace file are cut at it too, and at
1/64 of :envvar:`OTELPROF_MAX_REQUEST_BYTES`. A non-negative integer. Default: ``8192`` (the
SDK default is no limit, but a trace file's strings are input and could fill every request).
"""

OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT = "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT"
"""Span-specific :envvar:`OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT` (wins when set)."""
