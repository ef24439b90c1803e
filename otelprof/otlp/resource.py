"""The one resource composer: every OTLP request otelprof makes (converted traces in both
engines, live step spans, nsys/nvprof imports) describes its process through this function.

The environment's part (``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``) is parsed by
``otelprof.resource.resource_attributes_from_env`` and passed in as ``user``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ._text import clean
from .spans import Attrs, AttrValue

SERVICE_NAME = "service.name"
UNKNOWN_SERVICE = "unknown_service"


@dataclass(frozen=True)
class ResourceFacts:
    """What the caller knows of the process that made the spans; ``None``: not known, no
    attribute. Attributes come out in this field order."""

    host_name: str | None = None
    pid: int | None = None
    executable: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    gpu_models: Sequence[str] = ()
    run_id: str | None = None
    source_format: str | None = None

    def attributes(self) -> Attrs:
        out: Attrs = []
        if self.host_name:
            out.append(("host.name", clean(self.host_name)))
        if self.pid is not None:
            out.append(("process.pid", self.pid))
        if self.executable:
            out.append(("process.executable.path", clean(self.executable)))
        if self.rank is not None:
            out.append(("otelprof.distributed.rank", self.rank))
        if self.local_rank is not None:
            out.append(("otelprof.distributed.local_rank", self.local_rank))
        if self.world_size is not None:
            out.append(("otelprof.distributed.world_size", self.world_size))
        if self.backend:
            out.append(("otelprof.distributed.backend", clean(self.backend)))
        if self.gpu_models:
            out.append(("otelprof.gpu.model", clean(self.gpu_models[0])))
            out.append(("otelprof.gpu.count", len(self.gpu_models)))
        if self.run_id is not None:
            out.append(("otelprof.run.id", clean(self.run_id)))
        if self.source_format:
            out.append(("otelprof.source.format", self.source_format))
        return out


def compose_resource(
    user: Iterable[tuple[str, AttrValue]],
    scope_version: str | None,
    facts: ResourceFacts,
    value_limit: int | None = None,
) -> tuple[Attrs, int]:
    """A resource, and how many of its computed values were cut.

    The user's attributes first (``service.name`` defaulting to ``unknown_service``), kept
    whole as the OpenTelemetry specification exempts resources from length limits; then
    otelprof's SDK attributes (``telemetry.sdk.version`` only with a ``scope_version``) and the
    ``facts``, each unless the user set that key. A computed string value longer than
    ``value_limit`` characters is cut to it.
    """
    attrs: Attrs = [(clean(k), clean(v) if isinstance(v, str) else v) for k, v in user]
    keys = {k for k, _ in attrs}
    if SERVICE_NAME not in keys:
        attrs.insert(0, (SERVICE_NAME, UNKNOWN_SERVICE))
        keys.add(SERVICE_NAME)
    sdk: Attrs = [("telemetry.sdk.name", "otelprof"), ("telemetry.sdk.language", "python")]
    if scope_version:
        sdk.append(("telemetry.sdk.version", clean(scope_version)))
    cut = 0
    computed: Attrs = []
    for key, value in facts.attributes():
        if key in keys:
            continue
        if value_limit is not None and isinstance(value, str) and len(value) > value_limit:
            value = value[:value_limit]
            cut += 1
        computed.append((key, value))
    attrs.extend((k, v) for k, v in sdk if k not in keys)
    attrs.extend(computed)
    return attrs, cut


__all__ = ["ResourceFacts", "compose_resource"]
