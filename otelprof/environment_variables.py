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

__all__ = [
    "OTELPROF_DETAIL",
    "OTELPROF_MAX_REQUEST_BYTES",
    "OTELPROF_MIN_DURATION_US",
    "OTELPROF_RUN_ID",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_SERVICE_NAME",
]
