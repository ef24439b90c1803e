"""The process's HTTP endpoint: prometheus-client's ``/metrics`` app, plus ``POST /profile``
that starts a profiling window for the next steps (dynolog-style on-demand tracing).

A thin WSGI wrapper around prometheus-client's own app and threading server, so scraping
behaves exactly as prometheus-client serves it (content negotiation, OpenMetrics, gzip).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

_log = logging.getLogger(__name__)
MAX_PROFILE_STEPS = 1000

#: Starts a window of ``steps`` (None: the configured default); False when profiling is off.
ProfileRequest = Callable[[int | None], bool]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would flood the training job's stderr."""


def _app(registry: CollectorRegistry, profile: ProfileRequest | None) -> Callable[..., Iterable[bytes]]:
    metrics = make_wsgi_app(registry)

    def reply(start_response: Callable[..., Any], status: str, body: dict[str, Any]) -> list[bytes]:
        data = json.dumps(body).encode()
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/profile":
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        if profile is None:
            return reply(start_response, "404 Not Found", {"error": "on-demand profiling over HTTP is off"})
        if environ.get("REQUEST_METHOD") != "POST":
            return reply(start_response, "405 Method Not Allowed", {"error": "use POST /profile[?steps=N]"})
        raw = parse_qs(environ.get("QUERY_STRING", "")).get("steps", [""])[0]
        steps: int | None = None
        if raw:
            if not raw.isdigit() or not 1 <= int(raw) <= MAX_PROFILE_STEPS:
                return reply(
                    start_response, "400 Bad Request", {"error": f"steps must be 1..{MAX_PROFILE_STEPS}, got {raw!r}"}
                )
            steps = int(raw)
        if not profile(steps):
            return reply(start_response, "409 Conflict", {"error": "profiling is off (OTELPROF_PROFILE=false)"})
        return reply(start_response, "202 Accepted", {"status": "a window starts at the next step", "steps": steps})

    return app


def serve(
    host: str, port: int, registry: CollectorRegistry, profile: ProfileRequest | None = None
) -> ThreadingWSGIServer:
    """Serves on a daemon thread; ``port`` 0 picks a free one (``server.server_port``)."""
    family, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][::4]

    class Server(ThreadingWSGIServer):
        address_family = family  # IPv6 hosts too

    httpd = make_server(str(address[0]), port, _app(registry, profile), Server, handler_class=_QuietHandler)
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
