"""A pausable TCP proxy for tests: an outage of a real server, at a chosen moment, on one port.

``TcpProxy(("127.0.0.1", port))`` listens on a free port of 127.0.0.1 and forwards every connection
to the target (moto's S3 server, ``tests.s3_server``). ``take_down()`` closes the listener and
resets every open connection (RST, not FIN), so clients see *connection refused* for new
connections and *connection reset* for open ones, while the server behind keeps its state;
``bring_up()`` listens again on the same port. ``outage_at_connection(n, seconds)`` takes it down
when the n-th connection from now is accepted (that one is reset too) and brings it back up
``seconds`` later, so an outage hits a client after exactly n - 1 connections, deterministically.
``answer_connections(first, count, status, code)`` makes connections number ``first`` to
``first + count - 1`` from now get an S3 error answer (``503 Service Unavailable``, ``403
Forbidden``, …) from the proxy itself instead of reaching the server: a server that fails, when
moto cannot be made to.

One thread runs the forwarding (a selector loop): forwarded sockets are only ever closed by that
thread, and a command (``take_down``, …) returns once the loop has carried it out, raising what it
raised. A connection the proxy answers itself is served on a thread of its own.
"""

from __future__ import annotations

import contextlib
import errno
import queue
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

BUFFER_BYTES = 64 * 1024
POLL_SECS = 0.05


@dataclass(eq=False)
class _Side:
    """One socket of a forwarded connection, and what is waiting to be written to it."""

    sock: socket.socket
    pending: bytearray = field(default_factory=bytearray)
    peer: _Side | None = None
    read_closed: bool = False


@dataclass(frozen=True)
class Outage:
    """When the proxy was down (``ended`` is ``None`` while it still is)."""

    started: float
    ended: float | None


class TcpProxy:
    """Forwards 127.0.0.1:<port> to ``target``; can be taken down and brought back up."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._sides: set[_Side] = set()
        self._commands: queue.Queue[
            tuple[Callable[[], None], threading.Event, list[BaseException]]
        ] = queue.Queue()
        self._stopping = False
        self._accepted = 0
        self._outage_at: int | None = None
        self._outage_secs = 0.0
        self._up_at: float | None = None
        self._outages: list[Outage] = []
        self._answers: dict[int, bytes] = {}
        self._lock = threading.Lock()
        self._listen(0)
        self.port: int = self._listener.getsockname()[1] if self._listener else 0
        self._thread = threading.Thread(target=self._loop, name="tcp-proxy", daemon=True)
        self._thread.start()

    # --- what tests call ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: the proxied endpoint."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def accepted(self) -> int:
        """Connections accepted so far (a connection reset on arrival by an outage counts)."""
        with self._lock:
            return self._accepted

    @property
    def is_up(self) -> bool:
        with self._lock:
            return self._listener is not None

    @property
    def outages(self) -> list[Outage]:
        """Every outage so far, in order."""
        with self._lock:
            return list(self._outages)

    def take_down(self) -> None:
        """Close the listener and reset every open connection (until ``bring_up``)."""
        self._run(self._take_down)

    def bring_up(self) -> None:
        """Listen again on the same port (cancels a pending automatic bring-up)."""
        self._run(self._bring_up)

    def outage_at_connection(self, connection: int, seconds: float) -> None:
        """Go down when the ``connection``-th connection from now is accepted, for ``seconds``.

        That connection is reset at once, with every other open one; the proxy comes back up
        on its own ``seconds`` later (``outages`` tells when).
        """
        if connection < 1:
            raise ValueError("connection counts from 1")

        def arm() -> None:
            self._outage_at = self._accepted + connection
            self._outage_secs = seconds

        self._run(arm)

    def answer_connections(self, first: int, count: int, status: str, code: str) -> None:
        """Connections ``first`` to ``first + count - 1`` from now get HTTP ``status`` (``"503
        Service Unavailable"``) with an S3 error document of ``code``, then are closed; they do not
        reach the server."""
        if first < 1 or count < 1:
            raise ValueError("connections count from 1")
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{status} (from the test proxy)</Message></Error>"
        ).encode()
        answer = (
            f"HTTP/1.1 {status}\r\nContent-Type: application/xml\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + body

        def arm() -> None:
            for number in range(first, first + count):
                self._answers[self._accepted + number] = answer

        self._run(arm)

    def close(self) -> None:
        """Stop forwarding: every socket closed, the thread ended."""
        if not self._thread.is_alive():
            return

        def stop() -> None:
            self._take_down()
            self._up_at = None
            self._stopping = True

        self._run(stop)
        self._thread.join(timeout=5)
        self._selector.close()

    # --- the loop ----------------------------------------------------------------------------

    def _run(self, command: Callable[[], None]) -> None:
        done = threading.Event()
        failures: list[BaseException] = []
        self._commands.put((command, done, failures))
        if not done.wait(timeout=10):
            raise TimeoutError("the proxy's loop did not answer")
        if failures:
            raise failures[0]

    def _loop(self) -> None:
        while not self._stopping:
            for key, events in self._selector.select(timeout=POLL_SECS):
                if key.data is None:
                    self._accept()
                else:
                    side: _Side = key.data
                    if side in self._sides and events & selectors.EVENT_READ:
                        self._read(side)
                    if side in self._sides and events & selectors.EVENT_WRITE:
                        self._write(side)
            if self._up_at is not None and time.monotonic() >= self._up_at:
                with self._lock:
                    self._bring_up()
            while True:
                try:
                    command, done, failures = self._commands.get_nowait()
                except queue.Empty:
                    break
                try:
                    with self._lock:
                        command()
                except Exception as error:
                    failures.append(error)
                done.set()

    def _listen(self, port: int) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + 5
        while True:
            try:
                listener.bind(("127.0.0.1", port))
                break
            except OSError as error:
                # A client's ephemeral port may briefly be ours while we are down.
                if error.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                    listener.close()
                    raise
                time.sleep(POLL_SECS)
        listener.listen(64)
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._listener = listener

    def _accept(self) -> None:
        if self._listener is None:
            return
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        with self._lock:
            self._accepted += 1
            outage = self._outage_at is not None and self._accepted >= self._outage_at
            answer = self._answers.pop(self._accepted, None)
        if outage:
            _reset(client)
            with self._lock:
                self._take_down()
                self._outage_at = None
                self._up_at = time.monotonic() + self._outage_secs
            return
        if answer is not None:
            # Off the loop: the request must be read first, and it is small and arrives at once.
            threading.Thread(target=_answer, args=(client, answer), daemon=True).start()
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            _reset(client)
            return
        client.setblocking(False)
        upstream.setblocking(False)
        near, far = _Side(client), _Side(upstream)
        near.peer, far.peer = far, near
        for side in (near, far):
            self._sides.add(side)
            self._selector.register(side.sock, selectors.EVENT_READ, side)

    def _read(self, side: _Side) -> None:
        peer = side.peer
        assert peer is not None
        try:
            data = side.sock.recv(BUFFER_BYTES)
        except BlockingIOError:
            return
        except OSError:
            self._drop(side, reset=True)
            return
        if not data:
            side.read_closed = True
            if not peer.pending:
                _shutdown_write(peer.sock)
            self._update(side)
            if side.read_closed and peer.read_closed:
                self._drop(side, reset=False)
            return
        peer.pending += data
        self._update(side)
        self._update(peer)

    def _write(self, side: _Side) -> None:
        peer = side.peer
        assert peer is not None
        try:
            sent = side.sock.send(side.pending)
        except BlockingIOError:
            return
        except OSError:
            self._drop(side, reset=True)
            return
        del side.pending[:sent]
        if not side.pending and peer.read_closed:
            _shutdown_write(side.sock)
        self._update(side)
        self._update(peer)

    def _update(self, side: _Side) -> None:
        """Read from a side while its peer has room; write to it while data waits for it."""
        if side not in self._sides or side.peer is None:
            return
        events = 0
        if not side.read_closed and len(side.peer.pending) < BUFFER_BYTES:
            events |= selectors.EVENT_READ
        if side.pending:
            events |= selectors.EVENT_WRITE
        registered = self._selector.get_map().get(side.sock) is not None
        if events and registered:
            self._selector.modify(side.sock, events, side)
        elif events:
            self._selector.register(side.sock, events, side)
        elif registered:
            self._selector.unregister(side.sock)

    def _drop(self, side: _Side, *, reset: bool) -> None:
        for one in (side, side.peer):
            if one is None or one not in self._sides:
                continue
            self._sides.discard(one)
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(one.sock)
            if reset:
                _reset(one.sock)
            else:
                one.sock.close()

    def _take_down(self) -> None:
        if self._listener is not None:
            self._selector.unregister(self._listener)
            self._listener.close()
            self._listener = None
            self._outages.append(Outage(time.monotonic(), None))
        for side in list(self._sides):
            self._drop(side, reset=True)

    def _bring_up(self) -> None:
        self._up_at = None
        if self._listener is None:
            self._listen(self.port)
            if self._outages and self._outages[-1].ended is None:
                self._outages[-1] = Outage(self._outages[-1].started, time.monotonic())


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with an RST (SO_LINGER 0): the peer sees *connection reset by peer*."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _answer(client: socket.socket, answer: bytes) -> None:
    """Read the request's head, send ``answer``, close (an S3 error for any request)."""
    with client:
        client.settimeout(5)
        received = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in received:
                chunk = client.recv(BUFFER_BYTES)
                if not chunk:
                    break
                received += chunk
            client.sendall(answer)
            client.shutdown(socket.SHUT_WR)
            # Whatever else the client sends (a body) is read, so that closing sends no RST.
            client.settimeout(1)
            while client.recv(BUFFER_BYTES):
                pass


def _shutdown_write(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def proxy_to(endpoint: str) -> Iterator[TcpProxy]:
    """A ``TcpProxy`` in front of ``http://<host>:<port>``, closed on exit."""
    host, _, port = endpoint.removeprefix("http://").rstrip("/").partition(":")
    proxy = TcpProxy((host, int(port)))
    try:
        yield proxy
    finally:
        proxy.close()
