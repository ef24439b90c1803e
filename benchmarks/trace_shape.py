"""What a person sees in a trace UI: the shape of every converted trace of the shared GPU traces.

    python benchmarks/trace_shape.py [TRACE ...] [--detail default|full] [--json OUT]

For each Kineto trace (default: every file in ../shared/traces/kineto, which includes the 2021
ResNet traces without ``ProfilerStep`` markers) it converts with the given detail and decodes
the OTLP requests with the official classes, then prints per file:

- traces, and spans per trace (largest, median);
- children of each step root (largest), and of the largest trace's root;
- kernels (device work with a launch: a ``correlation`` id) whose parent is a trace root;
- fwdbwd links that touch a step span (from or to it), and links in all.

These are the figures issue 15 asks for before and after; no target is asserted here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otelprof.converter import convert

ROOT = Path(__file__).resolve().parents[1]
KINETO = ROOT.parent / "shared" / "traces" / "kineto"
DEVICE = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}


def _link_kind(link: Any) -> str:
    return next((kv.value.string_value for kv in link.attributes if kv.key == "otelprof.link.kind"), "")


def shape(path: Path, detail: str) -> dict[str, Any]:
    result = convert(path, detail=detail)
    spans: list[Any] = []
    for raw in result.requests:
        req = ExportTraceServiceRequest.FromString(raw)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                spans.extend(ss.spans)
    per_trace: Counter[bytes] = Counter(sp.trace_id for sp in spans)
    roots = {sp.span_id for sp in spans if not sp.parent_span_id}
    children: Counter[bytes] = Counter(sp.parent_span_id for sp in spans if sp.parent_span_id)
    attrs = {sp.span_id: {kv.key: kv.value for kv in sp.attributes} for sp in spans}
    step_roots = [sid for sid in roots if "otelprof.step.number" in attrs[sid]]
    off_root = 0
    for sp in spans:
        a = attrs[sp.span_id]
        cat = a["otelprof.event.category"].string_value if "otelprof.event.category" in a else ""
        if cat in DEVICE and "otelprof.gpu.correlation_id" in a and sp.parent_span_id in roots:
            off_root += 1
    links_total = sum(len(sp.links) for sp in spans)
    step_ids = set(step_roots)
    step_links = sum(
        1
        for sp in spans
        for link in sp.links
        if _link_kind(link) == "fwdbwd" and (sp.span_id in step_ids or link.span_id in step_ids)
    )
    largest = max(per_trace.values(), default=0)
    names = Counter(sp.name for sp in spans if sp.span_id in roots)
    return {
        "file": path.name[:60],
        "traces": len(per_trace),
        "spans": len(spans),
        "max_spans_per_trace": largest,
        "median_spans_per_trace": statistics.median(per_trace.values()) if per_trace else 0,
        "step_roots": len(step_roots),
        "max_step_root_children": max((children[s] for s in step_roots), default=0),
        "kernels_off_root": off_root,
        "links": links_total,
        "links_touching_step": step_links,
        "root_names": dict(names.most_common(3)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--detail", default="default", choices=["default", "full"])
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    paths = args.traces or sorted(KINETO.glob("*.json.gz"))
    if not paths:
        print(f"no traces (looked in {KINETO})", file=sys.stderr)
        return 1
    rows = [shape(p, args.detail) for p in paths]
    cols = [
        ("traces", "traces"),
        ("max_spans_per_trace", "max/trace"),
        ("median_spans_per_trace", "med/trace"),
        ("max_step_root_children", "root kids"),
        ("kernels_off_root", "kern@root"),
        ("links_touching_step", "links@step"),
        ("links", "links"),
    ]
    print(f"detail={args.detail}")
    print(f"{'trace':48} " + " ".join(f"{h:>10}" for _, h in cols))
    totals: defaultdict[str, float] = defaultdict(float)
    for r in rows:
        print(f"{r['file'][:48]:48} " + " ".join(f"{r[k]:>10}" for k, _ in cols))
        for k, _ in cols:
            totals[k] += r[k]
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
