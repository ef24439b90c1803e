"""Metrics of the live side: per-step metrics for Prometheus (``step_metrics``) and over OTLP
(``otlp_metrics``), the last profiling window's findings (``window_metrics``) and the
/metrics endpoint with ``POST /profile`` (``server``)."""
