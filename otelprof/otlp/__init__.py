"""The span model otelprof sends, whatever made the spans: ids, span and attribute types, the
one resource composer, the encoder on the official opentelemetry-proto classes, the Kineto
attribute table, and the OTLP file formats. The converters (``otelprof.converter``), the live
step spans (``otelprof.capture``) and the importers (``otelprof.importer``) all build on it.
"""

from __future__ import annotations

from .encoder import encode
from .resource import ResourceFacts, compose_resource
from .spans import Attrs, AttrValue, Span, millis

__all__ = ["AttrValue", "Attrs", "ResourceFacts", "Span", "compose_resource", "encode", "millis"]
