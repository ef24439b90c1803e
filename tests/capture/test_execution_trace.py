"""The ``execution_trace`` profile option on a real torch CPU training loop: each window records
torch's ExecutionTraceObserver, its nodes join the window's op spans by record function id (the
shapes and dtypes the receiver gets are the execution trace's own), and the gzip file is kept
beside the window's Kineto trace and named on its trace roots. No temp file is left behind."""

from __future__ import annotations

import gzip
import json
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from export.receivers import HttpReceiver, http_receiver

from capture import live_session
from otelprof.capture.windows.keep import EXECUTION_TRACE, SUFFIX, companion

torch = pytest.importorskip("torch")

ONE_WINDOW = {  # step 2 warms up, 3 and 4 are recorded
    **live_session.ONE_WINDOW,
    "OTELPROF_RUN_ID": "et",
}


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    with http_receiver() as rec:
        yield rec


def _attrs(span: Any) -> dict[str, Any]:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value") or "string_value") for kv in span.attributes}


def _temp_ets() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("otelprof-window-*.et.json"))


def _run(rec: HttpReceiver, tmp_path: Path, **env: str) -> Any:
    session = live_session.start(rec.port, tmp_path / "spool", **{**ONE_WINDOW, **env})
    live_session.train(7)
    live_session.stop(session)
    return session


def test_a_windows_execution_trace_joins_its_op_spans(receiver: HttpReceiver, tmp_path: Path) -> None:
    before = _temp_ets()
    folder = tmp_path / "traces"
    session = _run(
        receiver,
        tmp_path,
        OTELPROF_PROFILE_OPTIONS="execution_trace",
        OTELPROF_DETAIL="full",
        OTELPROF_TRACE_DIR=str(folder),
    )
    [kineto] = folder.glob("*" + SUFFIX)
    et_file = Path(companion(str(kineto), EXECUTION_TRACE))
    assert sorted(folder.iterdir()) == sorted([kineto, et_file])
    assert stat.S_IMODE(et_file.stat().st_mode) == 0o600
    et = json.loads(gzip.decompress(et_file.read_bytes()))
    nodes = {n["id"]: n for n in et["nodes"]}
    # every op of the kept Kineto trace with a record function id has a node, and is a span
    events = json.loads(gzip.decompress(kineto.read_bytes()))["traceEvents"]
    with_rf = [e for e in events if e.get("ph") == "X" and "Record function id" in e.get("args", {})]
    joined = [s for s in receiver.spans if "otelprof.et.node_id" in _attrs(s)]
    assert with_rf and len(joined) == len(with_rf)
    conversions = session.windows.conversions
    assert (conversions.et_ops_missing, conversions.et_nodes_unmatched) == (0, 0)
    for span in joined:
        a = _attrs(span)
        node = nodes[a["otelprof.et.node_id"]]
        rf = next(x["value"] for x in node["attrs"] if x["name"] == "rf_id")
        assert span.name == node["name"] and rf in {e["args"]["Record function id"] for e in with_rf}
        assert json.loads(a["otelprof.et.input_shapes"]) == node["inputs"]["shapes"]
        assert json.loads(a["otelprof.et.input_types"]) == node["inputs"]["types"]  # dtypes: Tensor(float)
        assert json.loads(a["otelprof.et.output_shapes"]) == node["outputs"]["shapes"]
        assert json.loads(a["otelprof.et.output_strides"]) == node["outputs"]["strides"]
        ids = json.loads(a["otelprof.et.input_tensor_ids"])
        tensors = [
            v[0] if t.startswith("Tensor(") else None
            for v, t in zip(node["inputs"]["values"], node["inputs"]["types"], strict=True)
        ]
        assert [i if not isinstance(i, list) else None for i in ids] == tensors
    addmm = [_attrs(s) for s in joined if s.name == "aten::addmm"]
    assert addmm and all("Tensor(float)" in a["otelprof.et.input_types"] for a in addmm)
    roots = [s for s in receiver.spans if "otelprof.execution_trace.file" in _attrs(s)]
    assert {_attrs(s)["otelprof.execution_trace.file"] for s in roots} == {str(et_file)}
    assert {s.trace_id for s in joined} <= {s.trace_id for s in roots}
    assert _temp_ets() <= before  # the observer's temp file is gone


def test_without_the_option_no_execution_trace(receiver: HttpReceiver, tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    _run(receiver, tmp_path, OTELPROF_TRACE_DIR=str(folder))
    assert [p.name.endswith(SUFFIX) for p in folder.iterdir()] == [True]
    assert not [s for s in receiver.spans if "otelprof.et.node_id" in _attrs(s)]
