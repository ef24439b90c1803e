"""``otelprof run``'s bootstrap is lazy: a process that never imports torch gets nothing of
otelprof (not even its package), one that does is instrumented once torch's import is done, on
whichever thread imports it, in every Python process the command starts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        OTELPROF_SPOOL_DIR=str(tmp_path / "spool"),
        OTEL_EXPORTER_PROMETHEUS_PORT="0",
        OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
        **extra,
    )
    command = [sys.executable, "-m", "otelprof", "run", "--", sys.executable, "-c", code]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert "Error in sitecustomize" not in out.stderr and "not instrumenting" not in out.stderr, out.stderr
    return out


def test_a_process_that_never_imports_torch_gets_nothing(tmp_path: Path) -> None:
    out = _run(
        textwrap.dedent(
            """
        import sys
        assert "torch" not in sys.modules, "torch imported"
        assert not [m for m in sys.modules if m.startswith("otelprof")], "otelprof imported"
        assert [type(f).__name__ for f in sys.meta_path][0] == "_TorchFinder"
        print("clean")
        """
        ),
        tmp_path,
    )
    assert out.stdout.strip() == "clean"


CHECK = textwrap.dedent(
    """
    import torch
    import otelprof.instrumentation as instrumentation
    from torch.utils.data import dataloader

    assert instrumentation.session() is not None, "not instrumented"
    assert hasattr(torch.autograd.backward, "__wrapped__"), "backward not hooked"
    assert hasattr(dataloader._BaseDataLoaderIter.__next__, "__wrapped__"), "DataLoader not hooked"
    assert not [f for f in sys.meta_path if type(f).__name__ == "_TorchFinder"], "the finder stayed"
    """
)


def _train(steps: int) -> str:
    return textwrap.dedent(f"""
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn({steps} * 2, 4))
    for (batch,) in torch.utils.data.DataLoader(data, batch_size=2):
        model(batch).sum().backward()
        opt.step()
        opt.zero_grad()
    otelprof.uninstrument()
    from otelprof.export.spool import Spool
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    spans = [s for _p, data in Spool(os.environ["OTELPROF_SPOOL_DIR"])
             for rs in ExportTraceServiceRequest.FromString(data).resource_spans
             for ss in rs.scope_spans for s in ss.spans]
    print("steps", len([s for s in spans if s.name == "train.step"]))
    """)


def test_a_torch_program_is_instrumented_when_it_imports_torch(tmp_path: Path) -> None:
    out = _run("import os, sys\nimport otelprof\n" + CHECK + _train(3), tmp_path)
    assert out.stdout.split()[-2:] == ["steps", "3"]


@pytest.mark.slow  # subprocesses that import torch
def test_torch_imported_on_threads_at_once(tmp_path: Path) -> None:
    """Four threads import torch together: each finds otelprof's hooks in place when its
    import returns (the import system holds them until the hook has run), and there is one
    session."""
    code = """
    import sys, threading
    errors = []
    def check():
        try:
            exec(compile(CHECK, "check", "exec"), {"sys": sys})
        except BaseException as exc:
            errors.append(repr(exc))
    threads = [threading.Thread(target=check) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    print("ok")
    """
    out = _run(f"CHECK = {CHECK!r}\n" + textwrap.dedent(code), tmp_path)
    assert out.stdout.strip() == "ok"


@pytest.mark.slow  # subprocesses that import torch
def test_a_subprocess_that_imports_torch_is_instrumented(tmp_path: Path) -> None:
    """A launcher that never imports torch starts a trainer that does: the launcher stays
    clean, the trainer is instrumented."""
    child = "import os, sys\nimport otelprof\n" + CHECK + _train(2)
    code = f"""
    import subprocess, sys
    done = subprocess.run([sys.executable, "-c", {child!r}], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "torch" not in sys.modules
    print(done.stdout.split()[-1])
    """
    out = _run(textwrap.dedent(code), tmp_path)
    assert out.stdout.strip() == "2"


@pytest.mark.slow  # subprocesses that import torch
@pytest.mark.parametrize("variable", ["OTELPROF_ENABLED=false", "OTEL_SDK_DISABLED=true"])
def test_disabled_by_environment(tmp_path: Path, variable: str) -> None:
    name, value = variable.split("=")
    out = _run(
        "import torch, otelprof.instrumentation as i\nassert i.session() is None\nprint('off')",
        tmp_path,
        **{name: value},
    )
    assert out.stdout.strip() == "off"
