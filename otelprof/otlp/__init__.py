"""The span model otelprof sends, whatever made the spans: ids (``ids``), span and attribute
types (``spans``), the one resource composer (``resource``), the encoder on the official
opentelemetry-proto classes (``encoder``), the Kineto attribute table (``schema``) and the OTLP
file formats (``file``, ``jsonl``). The converters (``otelprof.converter``), the live step spans
(``otelprof.capture``) and the importers (``otelprof.importer``) all build on it.

Only the light modules are re-exported here; ``encoder`` (protobuf) is imported where it is used.
"""

from __future__ import annotations

from .resource import ResourceFacts, compose_resource
from .spans import Attrs, AttrValue, Span, millis

__all__ = ["AttrValue", "Attrs", "ResourceFacts", "Span", "compose_resource", "millis"]
