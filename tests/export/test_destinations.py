"""Spooled requests go only where they were going (issue 14, item 4).

Each record names its destination: a digest of protocol, URL and headers (an MLflow experiment
id, a tenant, a token). A later process with another endpoint or other headers leaves them in the
spool; ``otelprof spool ls`` shows the destinations; ``otelprof spool replay`` sends another
destination's records only when it is named (``--destination``). The secrets themselves (header
values, URL credentials and query) are nowhere on disk.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from converter_helpers import shared_trace
from prometheus_client import CollectorRegistry

from otelprof.cli import main
from otelprof.converter import convert
from otelprof.export import ExporterConfig, exporter_config_from_env
from otelprof.export.destination import NO_DESTINATION, destination_id, public_url
from otelprof.export.exporter import Exporter
from otelprof.export.spool import Spool, record_destination

from .receivers import HttpReceiver, free_port, http_receiver, wait_until

SECRET = "Bearer s3cr3t-t0ken"


@pytest.fixture(scope="module")
def requests() -> list[bytes]:
    return convert(shared_trace("critical_path"), detail="full", max_request_bytes=8 * 1024).requests[:9]


def _config(port: int, headers: str = "", protocol: str = "http/protobuf") -> ExporterConfig:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_EXPORTER_OTLP_PROTOCOL": protocol}
    if headers:
        env["OTEL_EXPORTER_OTLP_HEADERS"] = headers
    return exporter_config_from_env(env)


def _exporter(config: ExporterConfig, spool_dir: Path) -> Exporter:
    return Exporter(
        config,
        spool_dir=spool_dir,
        backoff_s=0.01,
        max_backoff_s=0.05,
        probe_interval_s=0.05,
        registry=CollectorRegistry(),
    )


def _spool_while_down(config: ExporterConfig, spool_dir: Path, requests: list[bytes]) -> None:
    """A job whose backend is unreachable: everything goes to the spool."""
    exporter = _exporter(config, spool_dir)
    for r in requests:
        exporter.submit(r)
    assert exporter.flush(30)
    exporter.shutdown()
    assert exporter.counters.requests_spooled == len(requests)


def _received(rec: HttpReceiver) -> list[bytes]:
    with rec.lock:
        return [r.SerializeToString() for r in rec.requests]


A_HEADERS = "x-mlflow-experiment-id=1,authorization=" + SECRET.replace(" ", "%20")
B_HEADERS = "x-mlflow-experiment-id=2,authorization=" + SECRET.replace(" ", "%20")


@pytest.mark.parametrize("other", ["endpoint", "headers"])
def test_a_process_with_another_destination_leaves_the_records_alone(
    other: str, tmp_path: Path, requests: list[bytes]
) -> None:
    """Tenant A's job spools while its backend is down; the next process, for B (another
    endpoint, or the same one with another experiment id), sends only its own requests. A's
    come back to A once A's process runs again with its backend up."""
    a_port = free_port()
    a = _config(a_port, A_HEADERS)
    _spool_while_down(a, tmp_path, requests[:5])
    b_port = free_port() if other == "endpoint" else a_port
    b = _config(b_port, B_HEADERS if other == "headers" else A_HEADERS)
    assert destination_id(b) != destination_id(a)
    with http_receiver(HttpReceiver(port=b_port)) as rec:
        exporter = _exporter(b, tmp_path)
        for r in requests[5:]:
            exporter.submit(r)
        assert exporter.flush(30)
        wait_until(lambda: len(_received(rec)) >= len(requests) - 5)
        exporter.shutdown()
        assert _received(rec) == requests[5:]  # B's own, and nothing of A's
    left = Spool(tmp_path).records()
    assert len(left) == 5 and {record_destination(p) for p in left} == {destination_id(a)}
    with http_receiver(HttpReceiver(port=a_port)) as a_rec:  # A again, its backend up
        exporter = _exporter(a, tmp_path)
        wait_until(lambda: len(_received(a_rec)) == 5)
        exporter.shutdown()
        assert _received(a_rec) == requests[:5]
        assert [h["x-mlflow-experiment-id"] for h in a_rec.headers_seen] == ["1"] * 5
    assert Spool(tmp_path).records() == []


def test_the_destination_is_protocol_url_and_every_header() -> None:
    base = _config(4318, A_HEADERS)
    assert destination_id(base) == destination_id(_config(4318, A_HEADERS))  # the next process agrees
    others = [_config(4319, A_HEADERS), _config(4318, B_HEADERS), _config(4318, ""), _config(4318, A_HEADERS, "grpc")]
    others.append(_config(4318, "x-mlflow-experiment-id=1,authorization=Bearer%20other"))  # another token
    ids = {destination_id(c) for c in [base, *others]}
    assert len(ids) == 6 and NO_DESTINATION not in ids
    assert destination_id(exporter_config_from_env({})) == NO_DESTINATION


def test_the_spool_keeps_no_secret(tmp_path: Path, requests: list[bytes]) -> None:
    """Header values, URL user info and query are not in any file name or file of the spool."""
    port = free_port()
    config = exporter_config_from_env(
        {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://user:hunter2@127.0.0.1:{port}/v1/traces?api_key=k3y",
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=" + SECRET.replace(" ", "%20"),
        }
    )
    assert config.headers == (("authorization", SECRET),)
    _spool_while_down(config, tmp_path, requests[:2])
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) >= 3  # two records and the destination's description
    for path in files:
        blob = path.name.encode() + path.read_bytes()
        for secret in (b"s3cr3t", b"hunter2", b"k3y", b"user:"):
            assert secret not in blob, (path, secret)
    assert public_url(config.url) == f"http://127.0.0.1:{port}/v1/traces"
    assert Spool(tmp_path).describe(destination_id(config)) == {
        "endpoint": f"http://127.0.0.1:{port}/v1/traces",
        "headers": ["authorization"],
        "protocol": "http/protobuf",
    }


def test_spool_ls_shows_the_destinations(
    tmp_path: Path, requests: list[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _config(free_port(), "x-mlflow-experiment-id=1"), _config(free_port())
    _spool_while_down(a, tmp_path, requests[:2])
    _spool_while_down(b, tmp_path, requests[2:5])
    _spool_while_down(exporter_config_from_env({}), tmp_path, requests[5:6])  # no endpoint set
    assert main(["spool", "--dir", str(tmp_path), "ls"]) == 0
    out, err = capsys.readouterr()
    lines = [line.split("\t") for line in out.splitlines()]
    assert [line[3] for line in lines] == [destination_id(a)] * 2 + [destination_id(b)] * 3 + [NO_DESTINATION]
    assert all(line[2].endswith(" spans") for line in lines)
    assert (
        f"destination {destination_id(a)}: 2 requests, {a.url} (http/protobuf, headers x-mlflow-experiment-id)" in err
    )
    assert f"destination {destination_id(b)}: 3 requests, {b.url} (http/protobuf)" in err
    assert f"destination {NO_DESTINATION}: 1 requests, none: spooled with no endpoint set" in err


def test_spool_replay_sends_another_destinations_records_only_when_named(
    tmp_path: Path, requests: list[bytes], capsys: pytest.CaptureFixture[str], clean_env: pytest.MonkeyPatch
) -> None:
    other = _config(free_port(), "x-mlflow-experiment-id=1")
    _spool_while_down(other, tmp_path, requests[:3])  # for another backend
    _spool_while_down(exporter_config_from_env({}), tmp_path, requests[3:5])  # for none: the user says
    legacy = Spool(tmp_path)  # records of an otelprof before destinations: <time>-<pid>-<seq>.otlp
    (tmp_path / f"{99999999999999999999:020d}-0000001-000000000.otlp").write_bytes(requests[5])
    with http_receiver() as rec:
        endpoint = f"http://127.0.0.1:{rec.port}"
        assert main(["spool", "--dir", str(tmp_path), "replay", "--endpoint", endpoint]) == 0
        assert _received(rec) == requests[3:6]  # no destination recorded: sent where told
        err = capsys.readouterr().err
        assert "3 requests for 1 other destinations left" in err and "--destination ID" in err
        assert len(legacy.records()) == 3
        code = main(
            ["spool", "--dir", str(tmp_path), "replay", "--endpoint", endpoint, "--destination", destination_id(other)]
        )
        assert code == 0
        assert _received(rec) == requests[3:6] + requests[:3]  # now, as asked explicitly
    assert legacy.records() == []
    assert main(["spool", "--dir", str(tmp_path), "replay", "--endpoint", endpoint, "--destination", "x"]) == 2


def test_the_exporter_leaves_records_without_a_destination_to_spool_replay(
    tmp_path: Path, requests: list[bytes]
) -> None:
    """Spooled with no endpoint set, or by an otelprof before destinations: nobody said where
    they go, so a job does not send them to its own backend by itself."""
    _spool_while_down(exporter_config_from_env({}), tmp_path, requests[:2])
    (tmp_path / f"{1:020d}-0000001-000000000.otlp").write_bytes(requests[2])
    with http_receiver() as rec:
        exporter = _exporter(_config(rec.port), tmp_path)
        for r in requests[3:]:
            exporter.submit(r)
        assert exporter.flush(30)
        exporter.shutdown()
    assert _received(rec) == requests[3:]
    assert len(Spool(tmp_path).records()) == 3
