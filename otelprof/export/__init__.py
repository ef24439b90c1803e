"""OTLP export: configuration (this package grows the transports, retries and spool)."""

from .config import ExporterConfig, exporter_config_from_env

__all__ = ["ExporterConfig", "exporter_config_from_env"]
