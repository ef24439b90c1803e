"""Text helpers: moved to ``otelprof.otlp._text``; re-exported for the converter."""

from ..otlp._text import clean

__all__ = ["clean"]
