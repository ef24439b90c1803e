"""The process's HTTP endpoint: prometheus-client's ``/metrics`` app, plus ``POST /profile``
that starts a profiling window for the next steps (dynolog-style on-demand tracing).

A thin WSGI wrapper around prometheus-client's own app and threading server, so scraping
behaves exactly as prometheus-client serves it (content negotiation, OpenMetrics, gzip).

``/metrics`` is open, as Prometheus expects. ``POST /profile`` costs the training loop (a
window slows its steps and fills the spool), so it is guarded: a bearer token when one is set
(``OTELPROF_PROFILE_TOKEN``), refused outright on an address beyond loopback without one, one
window at a time, a minimum interval between windows and a bounded length. Every answer is
counted in ``otelprof_profile_triggers_total{result}``; each kind of refusal is logged once.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import logging
import math
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

_log = logging.getLogger(__name__)
#: The ``steps`` no setting may exceed (OTELPROF_PROFILE_MAX_STEPS is at most this).
MAX_PROFILE_STEPS = 1000
#: ``result`` values of otelprof_profile_triggers_total (all exported from the start, at 0).
RESULTS = ("accepted", "unauthorized", "forbidden", "bad_request", "busy", "too_soon", "off")

#: ``(steps, min_interval_s)`` -> ("accepted" | "busy" | "too_soon" | "off", seconds to retry
#: after): starts a window of ``steps`` (None: the configured default) unless one is on its way
#: or the last ended less than ``min_interval_s`` ago.
ProfileRequest = Callable[[int | None, float], tuple[str, float]]


@dataclass(frozen=True)
class TriggerGuard:
    """What ``POST /profile`` asks of a request (OTELPROF_PROFILE_TOKEN, _MIN_INTERVAL, _MAX_STEPS)."""

    token: str | None = field(default=None, repr=False)  # a credential: never in a repr or a log
    min_interval_s: float = 60.0
    max_steps: int = 20


class TriggerMetrics(Collector):
    """otelprof_profile_triggers_total{result}: every ``POST /profile`` answered, by outcome."""

    def __init__(self, labels: Mapping[str, str]) -> None:
        self._names = list(labels)
        self._values = [labels[k] for k in self._names]
        self._lock = threading.Lock()
        self.counts = dict.fromkeys(RESULTS, 0)

    def count(self, result: str) -> None:
        with self._lock:
            self.counts[result] += 1

    def collect(self) -> Iterable[CounterMetricFamily]:
        with self._lock:
            counts = dict(self.counts)
        family = CounterMetricFamily(
            "otelprof_profile_triggers",
            "POST /profile requests by result: accepted (a window starts), unauthorized (no or a wrong "
            "bearer token), forbidden (no token set on an address beyond loopback), bad_request, "
            "busy (a window is requested or running), too_soon (within the minimum interval), off.",
            labels=[*self._names, "result"],
        )
        for result, n in counts.items():
            family.add_metric([*self._values, result], n)
        yield family


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would flood the training job's stderr."""


class _Trigger:
    """``POST /profile``: authenticates, rate-limits and counts; one request at a time, so two
    concurrent ones never both start a window."""

    def __init__(
        self, profile: ProfileRequest | None, guard: TriggerGuard, exposed: bool, metrics: TriggerMetrics
    ) -> None:
        self.profile = profile
        self.guard = guard
        self.exposed = exposed  # listening beyond loopback
        self.metrics = metrics
        self._lock = threading.Lock()
        self._logged: set[str] = set()
        self._token = guard.token.encode() if guard.token else None

    def __call__(self, environ: dict[str, Any]) -> tuple[str, str, dict[str, Any], list[tuple[str, str]]]:
        """(result, HTTP status, JSON body, extra headers)."""
        if self.profile is None:
            return "off", "404 Not Found", {"error": "on-demand profiling over HTTP is off"}, []
        if self._token is None and self.exposed:
            return "forbidden", "403 Forbidden", {"error": _NEEDS_TOKEN}, []
        if self._token is not None and not self._authorized(environ.get("HTTP_AUTHORIZATION", "")):
            error = {"error": "POST /profile needs the header Authorization: Bearer <OTELPROF_PROFILE_TOKEN>"}
            return "unauthorized", "401 Unauthorized", error, [("WWW-Authenticate", 'Bearer realm="otelprof"')]
        if environ.get("REQUEST_METHOD") != "POST":
            error = {"error": "use POST /profile[?steps=N]"}
            return "bad_request", "405 Method Not Allowed", error, [("Allow", "POST")]
        most = self.guard.max_steps
        raw = parse_qs(environ.get("QUERY_STRING", "")).get("steps", [""])[0]
        steps: int | None = None
        if raw:
            if not raw.isdigit() or not 1 <= int(raw) <= most:
                return "bad_request", "400 Bad Request", {"error": f"steps must be 1..{most}, got {raw[:20]!r}"}, []
            steps = int(raw)
        with self._lock:
            result, wait_s = self.profile(steps, self.guard.min_interval_s)
        retry = [("Retry-After", str(max(1, math.ceil(wait_s))))]
        if result == "busy":
            return result, "429 Too Many Requests", {"error": "a profiling window is requested or running"}, retry
        if result == "too_soon":
            every = f"at most one window per {self.guard.min_interval_s:g} s (OTELPROF_PROFILE_MIN_INTERVAL)"
            return result, "429 Too Many Requests", {"error": every}, retry
        if result == "off":
            return result, "409 Conflict", {"error": "profiling is off (OTELPROF_PROFILE=false)"}, []
        return result, "202 Accepted", {"status": "a window starts at the next step", "steps": steps}, []

    def _authorized(self, header: str) -> bool:
        assert self._token is not None
        scheme, _, given = header.strip().partition(" ")
        # compared in constant time: the answer's timing says nothing of the token
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token)

    def log(self, result: str, status: str, environ: dict[str, Any]) -> None:
        """Each kind of refusal once (the counter has them all); never the token or the header."""
        if result == "accepted" or result in self._logged:
            return
        self._logged.add(result)
        _log.warning(
            'otelprof: POST /profile from %s refused (%s); counted in otelprof_profile_triggers_total{result="%s"}',
            environ.get("REMOTE_ADDR", "?"),
            status,
            result,
        )


_NEEDS_TOKEN = "POST /profile is off: the endpoint listens beyond this machine and OTELPROF_PROFILE_TOKEN is not set"


def _app(registry: CollectorRegistry, trigger: _Trigger) -> Callable[..., Iterable[bytes]]:
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/profile":
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        result, status, body, headers = trigger(environ)
        trigger.metrics.count(result)
        trigger.log(result, status, environ)
        data = json.dumps(body).encode()
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data))), *headers])
        return [data]

    return app


def serve(
    host: str,
    port: int,
    registry: CollectorRegistry,
    profile: ProfileRequest | None = None,
    guard: TriggerGuard | None = None,
    labels: Mapping[str, str] | None = None,
) -> ThreadingWSGIServer:
    """Serves on a daemon thread; ``port`` 0 picks a free one (``server.server_port``). The
    trigger counter goes into ``registry`` with ``labels`` and leaves it at ``server_close()``."""
    family, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][::4]
    counter = TriggerMetrics(labels or {})

    class Server(ThreadingWSGIServer):
        address_family = family  # IPv6 hosts too

        def server_close(self) -> None:
            super().server_close()
            with contextlib.suppress(KeyError):  # closed twice
                registry.unregister(counter)

    guard = guard or TriggerGuard()
    trigger = _Trigger(profile, guard, exposed=False, metrics=counter)
    registry.register(counter)
    try:
        httpd = make_server(str(address[0]), port, _app(registry, trigger), Server, handler_class=_QuietHandler)
    except BaseException:
        registry.unregister(counter)
        raise
    trigger.exposed = not ipaddress.ip_address(str(httpd.server_address[0]).split("%")[0]).is_loopback
    if profile is not None and trigger.exposed and guard.token is None:
        _log.warning(
            "otelprof: %s; /metrics is served on %s. Set OTELPROF_PROFILE_TOKEN to allow it "
            "(requests then carry Authorization: Bearer <token>)",
            _NEEDS_TOKEN,
            host,
        )
    resume(httpd)
    return httpd


#: How often the serving thread looks for a shutdown: bounds how long pause() waits for it.
POLL_INTERVAL_S = 0.1


def pause(httpd: ThreadingWSGIServer, _wait_s: float = 0.0) -> None:
    """Stops serving (the socket stays bound: scrapes wait in its backlog until ``resume``)."""
    httpd.shutdown()  # returns at once when it is not serving


def resume(httpd: ThreadingWSGIServer) -> None:
    """Serves on a thread of its own (one at a time)."""
    running: threading.Thread | None = getattr(httpd, "_otelprof_thread", None)
    if running is not None and running.is_alive():
        return
    thread = threading.Thread(target=httpd.serve_forever, args=(POLL_INTERVAL_S,), name="otelprof-metrics", daemon=True)
    httpd._otelprof_thread = thread  # type: ignore[attr-defined]
    thread.start()
