"""``POST /profile`` is safe to expose: a bearer token when one is set (refused beyond loopback
without one), one window at a time, a minimum interval between windows, a bounded length, and
every answer counted in ``otelprof_profile_triggers_total``, read back from a real scrape. A real
training loop, a real session serving on a loopback port, a real OTLP receiver."""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from export.receivers import HttpReceiver, http_receiver
from prometheus_client.parser import text_string_to_metric_families

import otelprof
from capture import live_session
from capture.test_windows import _train as _train_steps
from otelprof.otlp import ids

torch = pytest.importorskip("torch")

STEPS = 10
TOKEN = "s3cret-7f4a9c"
Reply = tuple[int, dict[str, Any], dict[str, str]]  # status, JSON body, headers


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    with http_receiver() as rec:
        yield rec


def _instrument(rec: HttpReceiver, tmp_path: Path, **extra: str) -> otelprof.instrumentation.Session:
    quiet = {
        "OTELPROF_TRIGGER_SIGNAL": "none",
        "OTELPROF_ANOMALY_FACTOR": "0",
        "OTELPROF_PROFILE_EARLY": "0",
        "OTELPROF_PROFILE_SKIP_FIRST": "999",  # only the triggered windows
    }
    return live_session.start(rec.port, tmp_path, **{"OTELPROF_RUN_ID": "trigger", **quiet, **extra})


def _call(port: int, path: str = "/profile", token: str | None = None, method: str = "POST") -> Reply:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            body = r.read()
            return r.status, json.loads(body) if path.startswith("/profile") else {}, dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e), dict(e.headers)


def _triggers(port: int) -> dict[str, tuple[float, dict[str, str]]]:
    """otelprof_profile_triggers_total by result, decoded from a real /metrics scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        s.labels["result"]: (s.value, s.labels)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "otelprof_profile_triggers_total"
    }


def _counts(port: int) -> dict[str, float]:
    return {result: value for result, (value, _) in _triggers(port).items()}


def _profiled_steps(rec: HttpReceiver) -> list[int]:
    """Steps whose trace holds a converted ``ProfilerStep#N`` span (a window recorded them)."""
    markers = {s.trace_id for s in rec.spans if s.name.startswith("ProfilerStep#")}
    return [n for n in range(STEPS) if ids.trace_id(f"step|trigger|{n}") in markers]


def _on_demand_windows(session: otelprof.instrumentation.Session) -> int:
    assert session.windows is not None and session.windows.metrics is not None
    done, _failed, _last = session.windows.metrics.snapshot()
    return done["on_demand"]


ZERO = dict.fromkeys(("accepted", "unauthorized", "forbidden", "bad_request", "busy", "too_soon", "off"), 0.0)


def test_a_token_guards_the_trigger_and_every_refusal_is_counted(
    receiver: HttpReceiver, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Wrong or no token: 401; the right one: 202 and a window is recorded; again while it is
    requested: 429 busy; after it, within the minimum interval (60 s): 429 too_soon; more steps
    than OTELPROF_PROFILE_MAX_STEPS: 400. /metrics needs no token. The token is never logged."""
    caplog.set_level(logging.DEBUG, logger="otelprof")
    session = _instrument(receiver, tmp_path, OTELPROF_PROFILE_TOKEN=TOKEN)
    replies: dict[str, Reply] = {}

    def calls(i: int) -> None:
        port = session.metrics_port
        assert port is not None
        if i == 1:
            replies["none"] = _call(port)
            replies["wrong"] = _call(port, token="s3cret-7f4a9d")
            replies["right"] = _call(port, "/profile?steps=2", token=TOKEN)
            replies["busy"] = _call(port, token=TOKEN)
        if i == 6:  # the window (warmup 2, recorded 3 and 4) ended where step 5 began
            replies["soon"] = _call(port, token=TOKEN)
            replies["long"] = _call(port, "/profile?steps=21", token=TOKEN)

    _train_steps(STEPS, calls)
    assert session.metrics_port is not None
    metrics = _call(session.metrics_port, "/metrics", method="GET")
    triggers = _triggers(session.metrics_port)
    live_session.stop(session)

    for key in ("none", "wrong"):
        status, body, headers = replies[key]
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
        assert "OTELPROF_PROFILE_TOKEN" in body["error"]
    assert replies["right"][:2] == (202, {"status": "a window starts at the next step", "steps": 2})
    for key, what in (("busy", "requested or running"), ("soon", "OTELPROF_PROFILE_MIN_INTERVAL")):
        status, body, headers = replies[key]
        assert status == 429 and what in body["error"]
        assert 1 <= int(headers["Retry-After"]) <= 60
    assert replies["long"][:2] == (400, {"error": "steps must be 1..20, got '21'"})
    assert metrics[0] == 200  # open, as Prometheus expects
    assert _profiled_steps(receiver) == [3, 4]
    assert _on_demand_windows(session) == 1
    counts = {result: value for result, (value, _) in triggers.items()}
    assert counts == {**ZERO, "accepted": 1, "unauthorized": 2, "busy": 1, "too_soon": 1, "bad_request": 1}
    labels = triggers["accepted"][1]
    assert labels["run"] == "trigger" and labels["rank"] == "0" and labels["local_rank"] == "0"
    refusals = [r.getMessage() for r in caplog.records if "POST /profile from" in r.getMessage()]
    assert len(refusals) == 4  # once per kind: unauthorized, busy, too_soon, bad_request
    assert all(TOKEN not in r.getMessage() and TOKEN not in str(r.args) for r in caplog.records)
    assert TOKEN not in repr(session.settings)


def test_a_flood_of_posts_starts_one_window(receiver: HttpReceiver, tmp_path: Path) -> None:
    """50 POSTs, five at once after each of the ten steps: one is accepted, 49 answer 429, and
    one window is recorded in the interval."""
    session = _instrument(receiver, tmp_path)
    statuses: list[int] = []
    lock = threading.Lock()

    def flood(_i: int) -> None:
        port = session.metrics_port
        assert port is not None
        with ThreadPoolExecutor(5) as pool:
            for status, _body, headers in pool.map(lambda _: _call(port), range(5)):
                with lock:
                    statuses.append(status)
                assert status == 202 or int(headers["Retry-After"]) >= 1

    _train_steps(STEPS, flood)
    assert session.metrics_port is not None
    counts = _counts(session.metrics_port)
    live_session.stop(session)
    assert len(statuses) == 50 and statuses.count(202) == 1 and statuses.count(429) == 49
    assert counts["accepted"] == 1 and counts["busy"] + counts["too_soon"] == 49
    assert _on_demand_windows(session) == 1
    assert _profiled_steps(receiver) == [2, 3]  # requested after step 0: step 1 warms up


def test_without_an_interval_windows_still_come_one_at_a_time(receiver: HttpReceiver, tmp_path: Path) -> None:
    """OTELPROF_PROFILE_MIN_INTERVAL=0: a second trigger while a window is requested is still
    refused (429), and one after it ends starts the next window at once."""
    session = _instrument(receiver, tmp_path, OTELPROF_PROFILE_MIN_INTERVAL="0")
    statuses: list[tuple[int, int]] = []

    def calls(i: int) -> None:
        port = session.metrics_port
        assert port is not None
        if i in (1, 5):  # the first window (warmup 2, recorded 3 and 4) ended where step 5 began
            statuses.append((i, _call(port)[0]))
            statuses.append((i, _call(port)[0]))

    _train_steps(STEPS, calls)
    live_session.stop(session)
    assert statuses == [(1, 202), (1, 429), (5, 202), (5, 429)]
    assert _profiled_steps(receiver) == [3, 4, 7, 8]
    assert _on_demand_windows(session) == 2


@pytest.mark.parametrize("token", ["", TOKEN], ids=["no-token", "token"])
def test_beyond_loopback_the_trigger_needs_a_token(
    receiver: HttpReceiver, tmp_path: Path, caplog: pytest.LogCaptureFixture, token: str
) -> None:
    """Listening on every address (docs/collector.md's dashboard setup) with no token set, POST /profile
    is refused (403, counted, one warning at start naming the variable) and /metrics is served;
    with a token, the right one starts a window."""
    caplog.set_level(logging.WARNING, logger="otelprof")
    env = {"OTEL_EXPORTER_PROMETHEUS_HOST": "0.0.0.0", "OTELPROF_PROFILE_TOKEN": token}
    session = _instrument(receiver, tmp_path, **env)
    replies: list[Reply] = []

    def calls(i: int) -> None:
        if i == 1:
            assert session.metrics_port is not None
            replies.append(_call(session.metrics_port, token=token or None))

    _train_steps(STEPS, calls)
    assert session.metrics_port is not None
    metrics = _call(session.metrics_port, "/metrics", method="GET")
    counts = _counts(session.metrics_port)
    live_session.stop(session)
    assert metrics[0] == 200
    started = [r.getMessage() for r in caplog.records if "listens beyond this machine" in r.getMessage()]
    if token:
        assert replies[0][0] == 202 and _profiled_steps(receiver) == [3, 4]
        assert counts == {**ZERO, "accepted": 1} and started == []
    else:
        status, body, _ = replies[0]
        assert status == 403 and "OTELPROF_PROFILE_TOKEN" in body["error"]
        assert counts == {**ZERO, "forbidden": 1}
        assert _profiled_steps(receiver) == [] and _on_demand_windows(session) == 0
        assert len(started) == 1 and "Set OTELPROF_PROFILE_TOKEN" in started[0]
