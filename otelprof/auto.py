"""``import otelprof.auto`` at the top of a training script instruments the process from the
environment (``OTEL_EXPORTER_OTLP_*``, ``OTELPROF_*``); see ``otelprof.instrument``."""

from .instrumentation import instrument

instrument()
