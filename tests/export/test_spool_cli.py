"""``otelprof spool ls|replay|drop`` on a real spool and a real receiver."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from converter_helpers import shared_trace

from otelprof.cli import main
from otelprof.converter import convert
from otelprof.export.spool import SUFFIX, Spool

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


def test_replay_never_prints_the_endpoints_credentials(
    spooled: tuple[Path, list[bytes]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key in the query (some SaaS backends take one there) and user info stay off the screen."""
    directory, requests = spooled
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    with http_receiver() as rec:
        url = f"http://us3r:pa55@127.0.0.1:{rec.port}?api_key=S3KRIT"
        assert main(["spool", "--dir", str(directory), "-v", "replay", "--endpoint", url]) == 0
    out, err = capsys.readouterr()
    assert len(rec.requests) == len(requests)
    assert f"requests sent to http://127.0.0.1:{rec.port}/v1/traces?***" in out + err  # the user info went to Basic
    assert not any(secret in out + err for secret in ("us3r", "pa55", "S3KRIT"))


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


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder of another uid needs root")
@pytest.mark.parametrize("action", [["ls"], ["drop"], ["replay"]])
def test_a_spool_of_another_user_is_refused_in_one_line(
    tmp_path: Path, action: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``ls`` listed, ``drop`` deleted and ``replay`` sent (with this user's endpoint and
    headers) the records someone else planted in a folder they own."""
    folder = tmp_path / "shared"
    folder.mkdir()
    planted = folder / f"{time.time_ns():020d}-0000001-{0:09d}-none{SUFFIX}"
    planted.write_bytes(b"\x0a\x00")
    for path in (planted, folder):
        os.chown(path, 65534, 65534)
    with http_receiver() as rec:
        endpoint = ["--endpoint", f"http://127.0.0.1:{rec.port}"] if action == ["replay"] else []
        code = main(["spool", "--dir", str(folder), *action, *endpoint])
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and rec.requests == []
    assert err.splitlines() == [
        f"otelprof: error: spool folder refused: {folder} belongs to uid 65534, not to you (uid {os.geteuid()}): "
        "its owner could read your spans and plant requests sent with your credentials; set OTELPROF_SPOOL_DIR "
        "to a folder of your own"
    ]
    assert os.listdir(folder) == [planted.name]


def test_a_world_writable_spool_is_refused_and_a_private_one_is_not(
    spooled: tuple[Path, list[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, requests = spooled
    os.chmod(directory, 0o777)
    assert main(["spool", "--dir", str(directory), "ls"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and f"`chmod 700 {directory}`" in err
    os.chmod(directory, 0o700)  # what the message says to do
    assert main(["spool", "--dir", str(directory), "ls"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(requests)
