"""``otelprof spool ls|replay|drop`` on a real spool and a real receiver."""

from __future__ import annotations

from pathlib import Path

import pytest
from converter_helpers import shared_trace

from otelprof.cli import main
from otelprof.converter import convert
from otelprof.export.spool import Spool

from .receivers import HttpReceiver, Reply, http_receiver


@pytest.fixture
def spooled(tmp_path: Path) -> tuple[Path, list[bytes]]:
    requests = convert(shared_trace("amd_trace"), detail="full", max_request_bytes=16 * 1024).requests
    spool = Spool(tmp_path / "spool")
    for r in requests:
        spool.write(r)
    return tmp_path / "spool", requests


def test_ls_lists_every_request(spooled: tuple[Path, list[bytes]], capsys: pytest.CaptureFixture[str]) -> None:
    directory, requests = spooled
    assert main(["spool", "--dir", str(directory), "ls"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == len(requests)
    assert all(line.split("\t")[2].endswith(" spans") and line.split("\t")[3] == "none" for line in lines)
    assert err.startswith(f"{len(requests)} requests, ")
    assert "destination none: " in err


def test_replay_sends_oldest_first_and_empties_the_spool(
    spooled: tuple[Path, list[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, requests = spooled
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    with http_receiver() as rec:
        code = main(["spool", "--dir", str(directory), "replay", "--endpoint", f"http://127.0.0.1:{rec.port}"])
    assert code == 0
    assert [r.SerializeToString() for r in rec.requests] == requests
    assert Spool(directory).records() == []


def test_replay_stops_and_keeps_the_rest_on_failure(
    spooled: tuple[Path, list[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, requests = spooled
    with http_receiver(HttpReceiver(script=[Reply(), Reply(503, message="busy")])) as rec:
        code = main(["spool", "--dir", str(directory), "replay", "--endpoint", f"http://127.0.0.1:{rec.port}"])
    assert code == 1
    assert "HTTP 503: busy; 1 sent, stopping" in capsys.readouterr().err
    assert [data for _p, data in Spool(directory)] == requests[1:]


def test_replay_without_endpoint_is_an_error(
    spooled: tuple[Path, list[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, _ = spooled
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert main(["spool", "--dir", str(directory), "replay"]) == 1


def test_drop_empties_the_spool(spooled: tuple[Path, list[bytes]]) -> None:
    directory, _ = spooled
    assert main(["spool", "--dir", str(directory), "drop"]) == 0
    assert Spool(directory).records() == []


def test_replay_waits_for_another_replayer(
    spooled: tuple[Path, list[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, requests = spooled
    with Spool(directory).replay_lock() as mine, http_receiver() as rec:
        assert mine
        code = main(["spool", "--dir", str(directory), "replay", "--endpoint", f"http://127.0.0.1:{rec.port}"])
    assert code == 1
    assert f"another process is replaying {directory}" in capsys.readouterr().err
    assert rec.requests == [] and len(Spool(directory).records()) == len(requests)
