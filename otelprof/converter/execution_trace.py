"""torch's execution trace (``ExecutionTraceObserver``, Chakra's schema), joined to a Kineto
trace's op spans by record function id.

An execution trace's ``nodes`` each hold an operator's inputs and outputs (``values``,
``shapes``, ``types``, ``strides``; a tensor's value is ``[tensor id, storage id, offset, numel,
item size, device]``) and, in ``attrs``, its ``rf_id``: the ``Record function id`` Kineto writes on
the same op's event. :func:`op_attributes` turns each node into the ``otelprof.et.*`` attributes
of ``ConvertOptions.op_attributes`` (registered in ``otlp/conventions.py``), including, for each
input tensor, the node that output it last before (not counting the op's own ancestors; of
nested nodes that all output it, the outermost). The join
is by id only: a node with no event of its id, or an event with no node, is counted by the
converter (``op_attributes_unmatched``, ``op_attributes_missing``), never matched by name or time.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..otlp.spans import AttrValue
from ._errors import TraceFormatError

#: Structural nodes torch writes (the process and thread roots): no operator, no Kineto event.
STRUCTURAL_PREFIX = "[pytorch|profiler|execution_trace|"
#: Bytes of a file's start that tell an execution trace from a Kineto trace: the root object's
#: first members (``schema``, ``pid``, ``time``, ``start_ts``) come before ``nodes``.
SNIFF_BYTES = 4096


@dataclass
class ExecutionTrace:
    """An execution trace's operator nodes: by id order, and by record function id."""

    nodes: list[dict[str, Any]]
    by_rf_id: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: Operator nodes with no record function id, or one another node also has (not joined).
    unjoinable: int = 0
    pid: int | None = None


def is_execution_trace(head: bytes) -> bool:
    """Whether a file's first bytes (inflated) are an execution trace's: a JSON object with a
    ``"schema"`` member and a ``"nodes"`` array early on (a Kineto trace has ``schemaVersion``
    and ``traceEvents``)."""
    text = head[:SNIFF_BYTES].lstrip()
    return text.startswith(b"{") and b'"schema":' in text and b'"nodes":' in text and b'"traceEvents"' not in text


def read_head(path: Path, size: int = SNIFF_BYTES) -> bytes:
    """A file's first ``size`` bytes, inflated where it is gzip (b"" where it cannot be read)."""
    try:
        with path.open("rb") as raw:
            magic = raw.read(2)
            raw.seek(0)
            if magic == b"\x1f\x8b":
                with gzip.GzipFile(fileobj=raw) as inflated:
                    return inflated.read(size)
            return raw.read(size)
    except (OSError, EOFError):
        return b""


def read_execution_trace(path: Path) -> ExecutionTrace:
    """Reads an execution trace (``.json`` or gzip); TraceFormatError where it is not one."""
    try:
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        doc = json.loads(data)
    except (OSError, EOFError, ValueError, gzip.BadGzipFile) as exc:
        raise TraceFormatError(f"{path}: not a readable execution trace: {exc}") from exc
    return parse_execution_trace(doc, str(path))


def parse_execution_trace(doc: Any, where: str = "execution trace") -> ExecutionTrace:
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise TraceFormatError(f"{where}: not an execution trace: no 'nodes' array")
    nodes = [n for n in doc["nodes"] if isinstance(n, dict) and isinstance(n.get("id"), int)]
    nodes.sort(key=lambda n: n["id"])
    ops = [n for n in nodes if not str(n.get("name", "")).startswith(STRUCTURAL_PREFIX)]
    pid = doc.get("pid")
    et = ExecutionTrace(ops, pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None)
    seen: dict[int, int] = {}
    for node in ops:
        rf = _attr(node, "rf_id")
        if isinstance(rf, int) and not isinstance(rf, bool):
            seen[rf] = seen.get(rf, 0) + 1
            et.by_rf_id[rf] = node
    for rf, count in seen.items():
        if count > 1:  # two nodes claim one op: neither is joined
            del et.by_rf_id[rf]
    et.unjoinable = len(ops) - len(et.by_rf_id)
    return et


def _attr(node: dict[str, Any], name: str) -> Any:
    """A node's attribute: in ``attrs`` (schema 1.1), else a member of its own (older ones)."""
    for a in node.get("attrs") or ():
        if isinstance(a, dict) and a.get("name") == name:
            return a.get("value")
    return node.get(name)


def _side(node: dict[str, Any], side: str) -> dict[str, Any]:
    """``inputs`` or ``outputs`` as {values, shapes, types, strides} (older schemas: the values
    as the list itself, ``input_shapes`` and ``input_types`` beside it)."""
    got = node.get(f"{side}s")
    if isinstance(got, dict):
        return got
    return {"values": got, "shapes": node.get(f"{side}_shapes"), "types": node.get(f"{side}_types")}


def _is_tensor_value(value: Any) -> bool:
    return isinstance(value, list) and len(value) >= 6 and isinstance(value[0], int) and not isinstance(value[0], bool)


def _tensor_ids(values: Any, types: Any) -> list[Any]:
    """Per value: its tensor id, a list of them for a list of tensors, else None."""
    if not isinstance(values, list):
        return []
    types = types if isinstance(types, list) and len(types) == len(values) else [""] * len(values)
    out: list[Any] = []
    for value, type_ in zip(values, types, strict=True):
        type_ = type_ if isinstance(type_, str) else ""
        if type_.startswith("Tensor") and _is_tensor_value(value):
            out.append(value[0])
        elif "Tensor" in type_ and isinstance(value, list) and not _is_tensor_value(value):
            out.append([v[0] if _is_tensor_value(v) else None for v in value])
        else:
            out.append(None)
    return out


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def op_attributes(et: ExecutionTrace) -> dict[int, list[tuple[str, AttrValue]]]:
    """``ConvertOptions.op_attributes`` of an execution trace: per record function id, its
    node's ``otelprof.et.*`` attributes."""
    parent = {n["id"]: n.get("ctrl_deps") for n in et.nodes}
    producers: dict[int, list[tuple[int, str]]] = {}  # tensor id -> (node id, name) that output it, in order
    joined = {id(n) for n in et.by_rf_id.values()}
    out: dict[int, list[tuple[str, AttrValue]]] = {}
    for node in et.nodes:
        inputs, outputs = _side(node, "input"), _side(node, "output")
        in_ids, out_ids = (
            _tensor_ids(inputs.get("values"), inputs.get("types")),
            _tensor_ids(outputs.get("values"), outputs.get("types")),
        )
        if id(node) in joined:
            ancestors = _ancestors(node["id"], parent)

            def producer(tid: Any, ancestors: set[int] = ancestors) -> Any:
                if isinstance(tid, list):
                    return [producer(t) for t in tid]
                made = producers.get(tid, []) if isinstance(tid, int) else []
                last = next((p for p in reversed(made) if p[0] not in ancestors), None)
                if last is None:
                    return None
                # a view's output is its inner ops' too (aten::t over aten::as_strided): the outermost
                outer = _ancestors(last[0], parent) - ancestors
                return min((p for p in made if p[0] in outer), default=last)[1]

            attrs: list[tuple[str, AttrValue]] = [("otelprof.et.node_id", node["id"])]
            schema = _attr(node, "op_schema")
            if isinstance(schema, str) and schema:
                attrs.append(("otelprof.et.op_schema", schema))
            for side, fields, ids in (("input", inputs, in_ids), ("output", outputs, out_ids)):
                for what in ("shapes", "types", "strides"):
                    if fields.get(what) is not None:
                        attrs.append((f"otelprof.et.{side}_{what}", _json(fields[what])))
                if fields.get("values") is not None:
                    attrs.append((f"otelprof.et.{side}_tensor_ids", _json(ids)))
            if inputs.get("values") is not None:
                attrs.append(("otelprof.et.input_producers", _json([producer(t) for t in in_ids])))
            out[_attr(node, "rf_id")] = attrs
        name = str(node.get("name", ""))
        for tid in _flat(out_ids):
            producers.setdefault(tid, []).append((node["id"], name))
    return out


def _flat(ids: list[Any]) -> list[int]:
    flat: list[int] = []
    for t in ids:
        flat.extend(x for x in (t if isinstance(t, list) else [t]) if isinstance(x, int))
    return flat


def _ancestors(node_id: int, parent: dict[int, Any]) -> set[int]:
    out: set[int] = set()
    p = parent.get(node_id)
    while isinstance(p, int) and p not in out:
        out.add(p)
        p = parent.get(p)
    return out
