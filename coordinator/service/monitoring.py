"""The monitoring endpoint of ``coordinator run``: ``/metrics``, ``/healthz`` and ``/readyz``.

Started by the runtime when ``coordinator.metrics_port`` is set (off by default, so the embedded
demo opens no port): a stdlib HTTP server on ``metrics_host:metrics_port`` (port 0: any free port,
``MonitoringServer.port`` and the log line say which), its own daemon threads, stopped by
``Runtime.close``.

* ``/metrics``: ``coordinator.metrics.REGISTRY`` in Prometheus' text format (or OpenMetrics when
  the scraper asks for it); ``clp_coordinator_jobs`` is counted in the database as it is scraped.
* ``/healthz`` (liveness): 200 while the loop starts or ends a tick within
  ``coordinator.service.health.LIVENESS_STALE_SECS``, else 503.
* ``/readyz`` (readiness): 200 when the database answers at the head revision and Spider answers
  (``coordinator.service.health.readiness``), else 503.

The health bodies are short text: one ``HealthCheck.line`` per check. Any other path is 404.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.exposition import choose_encoder
from sqlalchemy import Engine

from coordinator import metrics
from coordinator.config.loader import CoordinatorConfig
from coordinator.service.coordinator import Coordinator
from coordinator.service.health import (
    LIVENESS_STALE_SECS,
    HealthCheck,
    all_ok,
    loop_liveness,
    readiness,
    spider_endpoint,
    spider_probe,
)
from coordinator.store import migrate
from coordinator.store.jobs import jobs_by_status

_log = logging.getLogger(__name__)

Checks = Callable[[], Sequence[HealthCheck]]


class MonitoringServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on ``host:port``, served by daemon threads."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        liveness: Checks,
        readiness: Checks,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        """Bind ``host:port`` (0: any free port); ``start`` serves. Raises ``OSError`` when the
        address cannot be bound. ``on_close`` runs once the server has stopped."""
        self._checks = {"/healthz": liveness, "/readyz": readiness}
        self._on_close = on_close
        handler = type("Handler", (_Handler,), {"monitor": self})
        server_class = type(
            "Server", (ThreadingHTTPServer,), {"address_family": _family(host, port)}
        )
        self._server: ThreadingHTTPServer = server_class((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="monitoring",
            daemon=True,
        )
        self.host = host
        self.port = int(self._server.server_address[1])
        """The bound port (the one the system chose for port 0)."""

    @property
    def url(self) -> str:
        """``http://host:port`` (an IPv6 host in brackets; a wildcard host as it is)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> MonitoringServer:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the port; idempotent."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

    def health(self, path: str) -> tuple[int, bytes] | None:
        """The status and body ``path`` answers, ``None`` when it is no health path."""
        checks = self._checks.get(path)
        if checks is None:
            return None
        try:
            results = list(checks())
        except Exception as error:  # a check that breaks is a failed check, never a 500
            _log.exception("the %s checks failed", path)
            results = [HealthCheck(path.strip("/"), False, f"{type(error).__name__}: {error}")]
        body = "".join(f"{result.line()}\n" for result in results).encode()
        return (200 if all_ok(results) else 503), body


class _Handler(BaseHTTPRequestHandler):
    monitor: MonitoringServer
    server_version = "clp-coordinator"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._answer(200, encoder(metrics.REGISTRY), content_type)
            return
        answer = self.monitor.health(path)
        if answer is None:
            self._answer(404, b"not found: try /metrics, /healthz or /readyz\n")
            return
        self._answer(*answer)

    def _answer(
        self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8"
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("%s %s", self.address_string(), format % args)


def _family(host: str, port: int) -> socket.AddressFamily:
    """The address family of ``host`` (IPv6 for ``::``, an IPv6 literal or such a name)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return socket.AF_INET  # binding then fails with the resolver's error
    return infos[0][0]


def start_monitoring(
    config: CoordinatorConfig,
    engine: Engine,
    coordinator: Coordinator,
    *,
    stale_after_secs: float = LIVENESS_STALE_SECS,
) -> MonitoringServer:
    """Serve the endpoints for ``coordinator`` on ``coordinator.metrics_host:metrics_port``, and
    count ``clp_coordinator_jobs`` in ``engine`` while they are served. Raises ``OSError`` when
    the address cannot be bound."""
    port = config.extras.metrics_port
    assert port is not None, "coordinator.metrics_port is not set"
    probe = spider_probe(config)
    where = spider_endpoint(config)
    head = migrate.head_revision()

    def source() -> dict[str, int]:
        return jobs_by_status(engine)

    def stop() -> None:
        if metrics.JOBS.source is source:
            metrics.JOBS.source = None
        if probe is not None:
            probe.close()

    try:
        server = MonitoringServer(
            config.extras.metrics_host,
            port,
            liveness=lambda: [loop_liveness(coordinator, stale_after_secs)],
            readiness=lambda: readiness(engine, probe, where, head),
            on_close=stop,
        )
    except BaseException:
        stop()
        raise
    metrics.JOBS.source = source
    server.start()
    _log.info("metrics and health on %s (/metrics, /healthz, /readyz)", server.url)
    return server
