"""Helpers for the import tests: run the CLI against a real receiver, decode what arrived."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import SHARED_TRACES as SHARED
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otelprof.cli import main

KINETO = SHARED / "kineto"
NSYS = SHARED / "nsys"


def run_id_of(path: Path) -> str:
    """The run id ``otelprof import`` gives a file imported on its own (discover.py)."""
    from otelprof.importer import find_sources

    (source,) = find_sources([path])
    return source.run_id


def shared(fragment: str, folder: Path = KINETO) -> Path:
    matches = [p for p in sorted(folder.glob("*")) if fragment in p.name]
    if len(matches) != 1:
        pytest.skip(f"shared trace {fragment!r} not found under {folder} ({len(matches)} matches)")
    return matches[0]


def value(kvs: Iterable[KeyValue], key: str) -> object:
    for kv in kvs:
        if kv.key == key:
            kind = kv.value.WhichOneof("value")
            return getattr(kv.value, kind) if kind else None
    return None


@dataclass(frozen=True)
class Got:
    """A received span with its resource's attributes."""

    span: Span
    resource: dict[str, object]

    @property
    def category(self) -> object:
        return value(self.span.attributes, "otelprof.event.category")

    def attr(self, key: str) -> object:
        return value(self.span.attributes, key)


def received(requests: Iterable[ExportTraceServiceRequest]) -> list[Got]:
    out: list[Got] = []
    for request in requests:
        for rs in request.resource_spans:
            resource = {kv.key: value([kv], kv.key) for kv in rs.resource.attributes}
            out.extend(Got(s, resource) for ss in rs.scope_spans for s in ss.spans)
    return out


def decode(requests: Iterable[bytes]) -> list[Got]:
    return received(ExportTraceServiceRequest.FromString(r) for r in requests)


def ids(spans: Iterable[Got]) -> list[tuple[bytes, bytes]]:
    return [(g.span.trace_id, g.span.span_id) for g in spans]


@contextmanager
def import_env(tmp_path: Path, port: int | None) -> Iterator[dict[str, str]]:
    """OTEL_* / OTELPROF_* cleared, the endpoint set to the receiver (or none), the spool and
    HOME (default ledger) under tmp_path."""
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith(("OTEL_", "OTELPROF_")):
                mp.delenv(name)
        if port is not None:
            mp.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        mp.setenv("OTELPROF_SPOOL_DIR", str(tmp_path / "spool"))
        mp.setenv("HOME", str(tmp_path / "home"))
        yield dict(os.environ)


def run_import(*args: str | Path) -> int:
    return main(["import", *map(str, args)])
