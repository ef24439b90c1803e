"""Hostile settings (issue 31): every registered variable, given every hostile value, at every
entry point. A bad value warns and falls back; nothing raises, no command fails, and a job keeps
measuring its steps (otelprof does not switch itself off).

The variables come from the registry (``VARIABLES``), so a new one is covered as it is defined.
The entry points run in real processes: one driver interpreter (``python THIS_FILE``) imports
otelprof and torch once, then forks one child per (entry point, hostile value) whose environment
holds that value in every registered variable (set as bytes, through ``os.environb``); each child
runs the command as the console script does and exits normally (atexit handlers included).
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import math
import os
import re
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from otelprof import settings
from otelprof.capture.config import settings_from_env, windows_from_env
from otelprof.capture.distributed.identity import identity_from_env
from otelprof.capture.distributed.ranks import straggler_steps
from otelprof.capture.metrics import otlp_metrics
from otelprof.capture.windows.keep import keep_from_env
from otelprof.export import exporter_config_from_env
from otelprof.export.exporter import spool_dir_from_env
from otelprof.resource import options_from_env, resource_attributes_from_env
from otelprof.settings import VARIABLES, Bool, Choice, Host, Int, Names, Number, PathKind, Text

ROOT = Path(__file__).resolve().parents[1]
CPU_ONLY = "cpu_only__rank-34"  # a small shared trace

#: Values no variable takes. Environment values cannot hold NUL, so none does.
HOSTILE: dict[str, str] = {
    "huge": "99999999999999999999999999",
    "int64-max-plus-1": "9223372036854775808",
    "huge-negative": "-99999999999999999999999999",
    "negative": "-1",
    "nan": "nan",
    "inf": "inf",
    "minus-zero": "-0",
    "overflowing-float": "1e999",
    "empty": "",
    "whitespace": " \t ",
    "long": "9" * 100_000,  # long text, and an integer parser's worst case
    "control": "\x01\x1b[31m\x7f\n",
    "not-utf8": os.fsdecode(b"\xff\xfe"),  # what Python makes of environment bytes that are not UTF-8
    "broken-url": "http://[::1",
    "traversal": "../../etc/passwd",
    "unicode-digits": "١٢٣",
    "no-such-user": "~otelprof-no-such-user/x",
    # an IP address sockets refuse (their IDNA codec: a label past 63 characters): /metrics raised
    "long-ipv6-zone": "fe80::1%" + "x" * 70,
    "signal-module-constant": "SIG_DFL",  # an integer of the signal module, no signal: it raised
}

#: Every reader of the process environment (a ``*_from_env`` function, or one taking ``environ``).
READERS: dict[str, Callable[[Mapping[str, str]], Any]] = {
    "settings_from_env": settings_from_env,
    "windows_from_env": windows_from_env,
    "keep_from_env": keep_from_env,
    "exporter_config_from_env": exporter_config_from_env,
    "spool_dir_from_env": spool_dir_from_env,
    "options_from_env": options_from_env,
    "resource_attributes_from_env": resource_attributes_from_env,
    "identity_from_env": identity_from_env,
    "straggler_steps": straggler_steps,
    "otlp_metrics.exporters": otlp_metrics.exporters,
}


def _of_its_kind(var: settings.Variable, got: Any) -> bool:
    """Whether ``got`` is a value ``var``'s consumers take: its default, or one its kind allows."""
    kind = var.kind
    if got == var.default and type(got) is type(var.default):
        return True
    if isinstance(kind, Bool):
        return isinstance(got, bool)
    if isinstance(kind, Int):
        return type(got) is int and kind.low <= got <= kind.high
    if isinstance(kind, Number):
        return type(got) is float and math.isfinite(got) and kind.accept(got)
    if isinstance(kind, Choice):
        return got in kind.values
    if isinstance(kind, Names):
        return type(got) is tuple and len(set(got)) == len(got) and all(v in kind.values for v in got)
    if isinstance(kind, PathKind):
        return isinstance(got, Path)
    if isinstance(kind, Host):
        return isinstance(got, str) and bool(got) and got.isascii() and len(got) <= 253
    if isinstance(kind, Text):
        return isinstance(got, str) and bool(got) and settings._kinds.is_utf8(got)
    raise AssertionError(f"{var.name}: a kind this test does not know ({type(kind).__name__}): add it here")


# --- in process: the registry and every reader ----------------------------------------------------


@pytest.mark.parametrize("raw", HOSTILE.values(), ids=HOSTILE.keys())
def test_every_variable_reads_a_value_of_its_kind(raw: str, caplog: pytest.LogCaptureFixture) -> None:
    for name, var in VARIABLES.items():
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            got = settings.value({name: raw}, name)
        assert _of_its_kind(var, got), (name, got)
        # at most one warning, naming the variable and the default used; a long value cut short
        messages = [r.getMessage() for r in caplog.records]
        assert len(messages) <= 1, messages
        for message in messages:
            assert message.startswith((f"{name}=", f"{name} has bytes")) and "; using " in message, message
            assert len(message) < 400, message


@pytest.mark.parametrize("raw", HOSTILE.values(), ids=HOSTILE.keys())
def test_every_reader_takes_every_variable(raw: str) -> None:
    for name in VARIABLES:
        for reader in READERS.values():
            reader({name: raw})
    # and all of them at once
    for reader in READERS.values():
        reader(dict.fromkeys(VARIABLES, raw))


def test_the_readers_are_every_from_env_function() -> None:
    """A new ``*_from_env`` reader must join READERS (and so the hostile values)."""
    defined = set()
    for path in (ROOT / "otelprof").rglob("*.py"):
        defined.update(re.findall(r"^def (\w+_from_env)\(", path.read_text("utf-8"), re.M))
    assert defined == {name for name in READERS if name.endswith("_from_env")}


def test_numbers_and_integers_have_finite_ranges_the_converter_takes() -> None:
    """int64 (the native core's option fields, ConvertOptions') bounds every integer; each
    number's check refuses the largest floats."""
    for name, var in VARIABLES.items():
        if isinstance(var.kind, Int):
            assert -(2**63) <= var.kind.low <= var.kind.high <= 2**63 - 1, name
            with pytest.raises(ValueError):
                var.kind.parse(str(2**63))
        if isinstance(var.kind, Number):
            for raw in ("1e308", "-1e308"):
                with pytest.raises(ValueError):
                    var.kind.parse(raw)
    with pytest.raises(ValueError):
        Int(0, 2**63)  # an unbounded kind cannot even be defined


@pytest.mark.parametrize("name", ["OTELPROF_SPAN_BUDGET", "OTELPROF_SPLIT_WORLD_SIZE"])
def test_an_integer_past_int64_warns_and_converts_with_the_default(name: str, caplog: pytest.LogCaptureFixture) -> None:
    """The attack: these raised in ConvertOptions (a job switched otelprof off, convert failed)."""
    with caplog.at_level(logging.WARNING):
        options = options_from_env({name: HOSTILE["huge"]})
    assert getattr(options, name.removeprefix("OTELPROF_").lower()) == VARIABLES[name].default
    assert [r.getMessage() for r in caplog.records] == [
        f"{name}='{HOSTILE['huge']}' is not an integer from 0 to 9223372036854775807; using {VARIABLES[name].default}"
    ]


def test_a_long_value_is_quoted_cut_short(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert settings.value({"OTELPROF_SPAN_BUDGET": HOSTILE["long"]}, "OTELPROF_SPAN_BUDGET") == 1000
    assert [r.getMessage() for r in caplog.records] == [
        f"OTELPROF_SPAN_BUDGET='{'9' * 80}'... (100000 characters) is not an integer from 0 to"
        " 9223372036854775807; using 1000"
    ]


def test_text_that_is_not_utf8_warns_without_the_value(caplog: pytest.LogCaptureFixture) -> None:
    """Undecodable bytes could not go into OTLP strings or headers (resource attributes raised);
    a header's value may be a credential, so the warning names only the variable."""
    env = {"OTEL_RESOURCE_ATTRIBUTES": "team=" + HOSTILE["not-utf8"], "OTEL_SERVICE_NAME": HOSTILE["not-utf8"]}
    with caplog.at_level(logging.WARNING):
        assert options_from_env(env).resource_attributes == ()
    assert [r.getMessage() for r in caplog.records] == [
        "OTEL_RESOURCE_ATTRIBUTES has bytes that are not UTF-8; ignored",
        "OTEL_SERVICE_NAME has bytes that are not UTF-8; ignored",
    ]


def test_a_secret_that_is_not_utf8_is_never_quoted(caplog: pytest.LogCaptureFixture) -> None:
    secret = "s3cr3t" + HOSTILE["not-utf8"]
    with caplog.at_level(logging.WARNING):
        assert settings.value({"OTELPROF_PROFILE_TOKEN": secret}, "OTELPROF_PROFILE_TOKEN") is None
    assert [r.getMessage() for r in caplog.records] == [
        "OTELPROF_PROFILE_TOKEN has bytes that are not UTF-8; using unset"
    ]


def test_a_home_folder_that_cannot_be_found_warns(caplog: pytest.LogCaptureFixture) -> None:
    """``~user`` of no such user raised RuntimeError out of every path variable."""
    with caplog.at_level(logging.WARNING):
        assert spool_dir_from_env({"OTELPROF_SPOOL_DIR": HOSTILE["no-such-user"]}) == spool_dir_from_env({})
    assert [r.getMessage() for r in caplog.records] == [
        f"OTELPROF_SPOOL_DIR={HOSTILE['no-such-user']!r} is not usable; using unset"
    ]


# --- entry points, as processes -------------------------------------------------------------------

ENTRY_POINTS = ("convert", "import", "doctor", "spool-ls", "job")


@pytest.fixture(scope="module")
def entry_point_runs(tmp_path_factory: pytest.TempPathFactory, kineto_trace: Callable[[str], Path]) -> dict[str, Any]:
    """Every (entry point, hostile value) run: {"ENTRY/VALUE-ID": {"rc", "stdout", "stderr"}}."""
    tmp = tmp_path_factory.mktemp("hostile")
    # relative hostile paths ("../../etc/passwd", "-1") stay under tmp; the default spool under HOME
    cwd = tmp / "a" / "b" / "c"
    cwd.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
    env.update(HOME=str(tmp / "home"), PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, __file__, str(kineto_trace(CPU_ONLY)), str(tmp / "out")],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    runs: dict[str, Any] = json.loads(proc.stdout)
    return runs


#: What ``otelprof doctor`` rightly fails on: a host name that does not resolve ("nan" is one).
_UNRESOLVED_METRICS_HOST = re.compile(r"\[FAIL\] prometheus: .*: cannot resolve .*OTEL_EXPORTER_PROMETHEUS_HOST")


@pytest.mark.slow  # about a hundred child processes, one fixture
@pytest.mark.parametrize(("entry", "raw_id"), [(entry, raw_id) for entry in ENTRY_POINTS for raw_id in HOSTILE])
def test_entry_point_takes_hostile_values(entry: str, raw_id: str, entry_point_runs: dict[str, Any]) -> None:
    run = entry_point_runs[f"{entry}/{raw_id}"]
    why = run["stdout"][-2000:] + run["stderr"][-3000:]
    assert "Traceback" not in run["stderr"] and "an otelprof bug" not in run["stdout"], why
    if entry == "doctor":  # it ran every check; a failed one is only a host name that does not resolve
        assert "] spool: " in run["stdout"], why
        failed = [line for line in run["stdout"].splitlines() if line.startswith("[FAIL]")]
        assert all(_UNRESOLVED_METRICS_HOST.match(line) for line in failed), why
        assert run["rc"] == (1 if failed else 0), why
    else:
        assert run["rc"] == 0, why
    if entry == "job":  # otelprof kept measuring: it did not switch itself off
        assert "otelprof could not start" not in run["stderr"], why
        assert run["stdout"].splitlines()[-1:] == ["steps 3"], why


#: A warning line a variable's name starts: the log's, or doctor's configuration check's.
_NAMED = re.compile(r"(?:otelprof: warning: |\[warn\] config: )([A-Z][A-Z0-9_]*)(?=[=: ])")


@pytest.mark.slow  # about a hundred child processes, one fixture
@pytest.mark.parametrize(("entry", "raw_id"), [(entry, raw_id) for entry in ENTRY_POINTS for raw_id in HOSTILE])
def test_entry_point_warns_once_per_variable_in_short_lines(
    entry: str, raw_id: str, entry_point_runs: dict[str, Any]
) -> None:
    """Each variable is read once per process, so it warns once (a job read OTEL_SDK_DISABLED,
    OTEL_RESOURCE_ATTRIBUTES and OTELPROF_MAX_REQUEST_BYTES twice; import the endpoint); and a
    value is quoted cut short, never whole (the 100k-character value made 100k-character lines)."""
    run = entry_point_runs[f"{entry}/{raw_id}"]
    for stream in ("stdout", "stderr"):
        lines = run[stream].splitlines()
        assert [line[:200] for line in lines if len(line) > 600] == [], stream
        named = Counter(m.group(1) for m in map(_NAMED.match, lines) if m and m.group(1) in VARIABLES)
        assert {name: n for name, n in named.items() if n > 1} == {}, run[stream][-3000:]


# --- the driver: `python tests/test_hostile_settings.py TRACE OUT` ----------------------------------

_CHILD_DEADLINE_S = 60.0


def _job() -> int:
    import torch
    from prometheus_client import REGISTRY

    import otelprof.auto  # noqa: F401 - the one-line integration: instruments this process now

    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    steps = sum(s.value for m in REGISTRY.collect() for s in m.samples if s.name == "otelprof_steps_total")
    print(f"steps {steps:g}")
    return 0


def _child(entry: str, raw: str, trace: str, out: Path) -> int:
    from otelprof._launch import main

    for name in VARIABLES:
        os.environb[name.encode()] = os.fsencode(raw)
    argv = {
        "convert": ["convert", trace, "-o", str(out / "converted.bin")],
        "import": ["import", trace],
        "doctor": ["doctor"],
        "spool-ls": ["spool", "ls"],
    }
    return _job() if entry == "job" else main(argv[entry])


def _exit(run: Callable[[], int]) -> None:
    """Exits as the interpreter would after ``run`` (an uncaught exception's traceback, the
    atexit handlers: otelprof's flush), without unloading torch's modules (seconds per child)."""
    code = 1
    try:
        code = run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        threading._shutdown()  # type: ignore[attr-defined]  # joins the non-daemon threads, as an exit does
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _wait(pid: int) -> int:
    deadline = time.monotonic() + _CHILD_DEADLINE_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return -9


def _drive(trace: str, out: Path) -> None:
    import torch  # noqa: F401 - the job and doctor import it: once here, not in each child

    out.mkdir(parents=True, exist_ok=True)
    runs = {}
    for raw_id, raw in HOSTILE.items():
        for entry in ENTRY_POINTS:
            key = f"{entry}/{raw_id}"
            files = [out / f"{entry}-{raw_id}.{stream}" for stream in ("out", "err")]
            started = time.monotonic()
            pid = os.fork()
            if pid == 0:  # the child: its own environment and streams
                for fd, path in zip((1, 2), files, strict=True):
                    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
                _exit(functools.partial(_child, entry, raw, trace, out))
            rc = _wait(pid)
            stdout, stderr = (p.read_text("utf-8", errors="replace") for p in files)
            runs[key] = {"rc": rc, "stdout": stdout, "stderr": stderr, "s": time.monotonic() - started}
    print(json.dumps(runs))


if __name__ == "__main__":
    _drive(sys.argv[1], Path(sys.argv[2]))


def test_a_second_instrument_does_not_warn_again(tmp_path: Path) -> None:
    """instrument() twice (a framework callback and the user's own line): the second is ignored
    before it reads anything, so each bad value is still warned about once."""
    code = "import otelprof\notelprof.instrument()\notelprof.instrument()\notelprof.uninstrument()\n"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))},
        "OTELPROF_PROFILE_WAIT": "soon",
        "OTELPROF_SPOOL_DIR": str(tmp_path / "spool"),
        "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
    }
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("OTELPROF_PROFILE_WAIT='soon'") == 1, out.stderr
    assert "ignoring the second instrument()" in out.stderr
