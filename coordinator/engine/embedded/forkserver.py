"""The executors' fork server: one process that has imported the task packages forks each of an
engine's executors, instead of every executor being a fresh interpreter importing them again.

An executor's start-up is imports (SQLAlchemy, pydantic, the task packages: 0.3-0.45 s of CPU
here, issue 14). An engine with W workers paid it W times when work first came, and again for
every executor that a hard timeout or a crash replaced (a task that crashes each time cost a
start-up per attempt). The server (``python -m coordinator.engine.embedded``) imports them once,
when the engine's first executor is needed; an executor forked from it runs ``executor.main`` at
once, which still calls its package factories itself, so an executor's readiness (and the
manager's start timeout) covers what it always did.

The server is a fresh interpreter, not a fork of the process hosting the engine: that process has
threads (a fork copies the locks they hold) and database connections (SQLite's state must not
cross a fork). The server opens neither, and stays single-threaded, so forking it is safe.

Wire: a ``SOCK_SEQPACKET`` socket pair, one msgpack array per message. The host sends
``["spawn", n]`` with two file descriptors, the read end of the new executor's stdin and the
write end of its stdout; the server forks and answers ``["spawned", n, pid]`` (with a pidfd of the
child where the kernel gives one) or ``["failed", n, reason]``, and reports each child it reaps as
``["exited", pid, returncode]`` (``Popen.returncode``'s convention: ``-N`` for signal N). The host
kills an executor through its pidfd, so a pid that was reaped and reused is never signalled.

Lifetimes: the server dies with its host (``PR_SET_PDEATHSIG`` on Linux, and it leaves when its
socket ends), an executor with the server (``executor.die_with_parent``), clp-s with its executor
(``setpriv --pdeathsig``): a SIGKILLed host leaves nothing running. A server that died (killed, out
of memory) takes its executors with it; they are reported killed (``-SIGKILL``, the signal the
kernel sends them) once they are gone, and the next spawn starts a new server. A server whose
socket ends (``close``) kills the executors still running and reaps every child before it leaves,
so the host that reaps the server has their CPU time (their clp-s runs' with it) in its own
children's resource usage, as when it started executors itself.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import itertools
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import BinaryIO

import msgpack

from coordinator.engine.embedded.protocol import ExecutorGone

_log = logging.getLogger(__name__)

_MESSAGE_BYTES = 4096
"""Every message is a short array (no path or environment crosses the socket)."""
_SERVER_MODULE = "coordinator.engine.embedded"
_SERVER_LEAVE_SECS = 5.0
"""How long a server whose socket ended has to kill and reap its executors and leave before it is
killed (its executors then die with it, reaped by init)."""


class ForkedExecutor:
    """An executor the server forked: the part of ``subprocess.Popen`` a manager uses (``pid``,
    ``stdin``, ``stdout``, ``poll``, ``wait``, ``kill``). Thread-safe."""

    def __init__(self, pid: int, pidfd: int | None, stdin: BinaryIO, stdout: BinaryIO) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: int | None = None
        self._pidfd = pidfd
        self._lock = threading.Lock()
        self._exited = threading.Event()

    def poll(self) -> int | None:
        """The exit status once the server reported it, else ``None``."""
        return self.returncode if self._exited.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        """The exit status; raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"executor {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        """SIGKILL, unless its exit was already reported (then its pid may be another process's)."""
        with self._lock:
            if self._exited.is_set():
                return
            try:
                if self._pidfd is not None:
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                else:
                    os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _wait_gone(self) -> None:
        """Block until the process no longer runs (its server is gone: no exit will be reported)."""
        while True:
            try:
                if self._pidfd is not None:
                    select.select([self._pidfd], [], [])  # readable once the process has exited
                    return
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.01)

    def _ended(self, returncode: int) -> None:
        with self._lock:
            self.returncode = returncode
            self._exited.set()
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None


class _Server:
    """One incarnation of the server process, as the host sees it."""

    def __init__(self, process: subprocess.Popen[bytes], connection: socket.socket) -> None:
        self.process = process
        self.connection = connection
        self.gone = False
        self.settled = threading.Event()
        """Set once gone and every executor it forked is gone too."""
        self.pending: dict[int, tuple[BinaryIO, BinaryIO]] = {}
        """Spawn number → the host's ends of its pipes, until the server answers."""
        self.replies: dict[int, ForkedExecutor | str] = {}
        self.children: dict[int, ForkedExecutor] = {}


class ForkServer:
    """Forks an engine's executors from one server process (module docstring); thread-safe.

    ``package_args``: the executors' ``--package NAME=module:factory`` arguments (the server
    imports each module once). ``environment``: the server's, hence every executor's, environment.
    Nothing runs until the first ``spawn``.
    """

    def __init__(self, package_args: Sequence[str], environment: Mapping[str, str]) -> None:
        self._package_args = list(package_args)
        self._environment = dict(environment)
        self._condition = threading.Condition()
        self._spawning = threading.Lock()
        self._server: _Server | None = None
        self._numbers = itertools.count()
        self._closed = False

    def spawn(self, timeout: float) -> ForkedExecutor:
        """A new executor, forked (not necessarily ready: it says so on its stdout).

        Starts the server first when none runs. Raises ``ExecutorGone`` when the server does not
        fork within ``timeout`` seconds (it is killed then: the next spawn starts another), when
        it dies or fails to fork, or when this fork server is closed; ``OSError`` when the server
        cannot be started at all.
        """
        deadline = time.monotonic() + timeout
        with self._spawning:
            server = self._running_server()
            number = next(self._numbers)
            stdin_read, stdin_write = os.pipe()
            stdout_read, stdout_write = os.pipe()
            ends = (os.fdopen(stdin_write, "wb"), os.fdopen(stdout_read, "rb"))
            try:
                with self._condition:
                    server.pending[number] = ends
                message = msgpack.packb(["spawn", number])
                socket.send_fds(server.connection, [message], [stdin_read, stdout_write])
            except OSError as error:
                self._forget(server, number)
                raise ExecutorGone(f"the fork server is gone: {error}") from error
            finally:
                os.close(stdin_read)  # the executor's ends live in the server, then the executor
                os.close(stdout_write)
            with self._condition:
                self._condition.wait_for(
                    lambda: number in server.replies or server.gone or self._closed,
                    max(0.0, deadline - time.monotonic()),
                )
                reply = server.replies.pop(number, None)
            if isinstance(reply, ForkedExecutor):
                return reply
            self._forget(server, number)
            if reply is not None:
                raise ExecutorGone(f"the fork server could not fork an executor: {reply}")
            if self._closed:
                raise ExecutorGone("closed")
            if server.gone:
                raise ExecutorGone("the fork server is gone")
            server.process.kill()  # stuck (a package's import that never ends): the next spawn
            # starts another
            problem = f"the fork server did not fork an executor within {timeout:.0f} s (killed)"
            _log.error("%s", problem)
            raise ExecutorGone(problem)

    def close(self) -> None:
        """Stop the server; its executors die with it (each reported ``-SIGKILL``), and pending
        and later spawns raise ``ExecutorGone``. Returns once they are all gone."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()  # a waiting spawn gives up, and lets go of the lock
        with self._spawning:  # no spawn is starting a server any more, and none will
            server = self._server
        if server is None:
            return
        with contextlib.suppress(OSError):  # already gone, and closed by its reader
            server.connection.shutdown(socket.SHUT_RDWR)  # its reader closes it, then reaps
        server.settled.wait()

    def _running_server(self) -> _Server:
        with self._condition:
            if self._closed:
                raise ExecutorGone("closed")
            if self._server is not None and not self._server.gone:
                return self._server
        host_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with server_end:
            command = [
                sys.executable,
                "-m",
                _SERVER_MODULE,
                "--socket-fd",
                str(server_end.fileno()),
                "--parent-pid",
                str(os.getpid()),
                *self._package_args,
            ]
            try:
                process = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    env=self._environment,
                    pass_fds=[server_end.fileno()],
                )
            except OSError:
                host_end.close()
                raise
        server = _Server(process, host_end)
        with self._condition:
            self._server = server
        threading.Thread(
            target=self._read, args=(server,), name="executor-fork-server", daemon=True
        ).start()
        return server

    def _forget(self, server: _Server, number: int) -> None:
        with self._condition:
            ends = server.pending.pop(number, None)
        for stream in ends or ():
            stream.close()

    def _read(self, server: _Server) -> None:
        """Take the server's answers and exits until its socket ends, then settle what it
        leaves: pending spawns fail, live executors are reported killed once gone."""
        try:
            while True:
                message, fds, _, _ = socket.recv_fds(server.connection, _MESSAGE_BYTES, 1)
                if not message:
                    break
                self._take(server, msgpack.unpackb(message), fds[0] if fds else None)
        except Exception:  # whatever it was, what the server leaves must still be settled
            _log.exception("reading the executors' fork server failed; it is stopped")
        with self._condition:
            server.gone = True  # waiting spawns fail now, and the next one starts a new server
            orphans = list(server.children.values())
            pending = list(server.pending)
            self._condition.notify_all()
        with self._spawning:  # no spawn sends on the socket any more
            server.connection.close()
        try:  # it leaves by itself at the end of its socket, once its executors are reaped
            server.process.wait(_SERVER_LEAVE_SECS)
        except subprocess.TimeoutExpired:  # stuck (an import that never ends)
            server.process.kill()
            server.process.wait()
        for number in pending:
            self._forget(server, number)
        for executor in orphans:
            executor.kill()  # dying already (their parent is gone): this only hastens it
            executor._wait_gone()
            executor._ended(-signal.SIGKILL)
        server.settled.set()

    def _take(self, server: _Server, message: list[object], pidfd: int | None) -> None:
        kind = message[0]
        if kind == "exited":
            pid, returncode = message[1], message[2]
            assert isinstance(pid, int) and isinstance(returncode, int)
            with self._condition:
                executor = server.children.pop(pid, None)
            if executor is not None:
                executor._ended(returncode)
            return
        number = message[1]
        assert isinstance(number, int)
        with self._condition:
            ends = server.pending.pop(number, None)
            if ends is None:  # the spawn gave up meanwhile: the executor is not wanted
                reply: ForkedExecutor | str | None = None
            elif kind == "spawned":
                pid = message[2]
                assert isinstance(pid, int)
                reply = ForkedExecutor(pid, pidfd, *ends)
                server.children[pid] = reply
                pidfd = None
            else:
                reply = str(message[2])
                for stream in ends:
                    stream.close()
            if reply is not None:
                server.replies[number] = reply
            self._condition.notify_all()
        if pidfd is not None:
            # An executor forked for a spawn that gave up: its pipes are closed, so it reads end
            # of file and leaves (and the server it came with is being killed).
            os.close(pidfd)


# --- the server process ---------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def kill_me_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (``PR_SET_PDEATHSIG``, Linux), and at once if
    the parent is already gone. Starts no thread (a fork server must stay single-threaded)."""
    if sys.platform.startswith("linux"):
        import ctypes  # noqa: PLC0415 (only on Linux)

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            _log.warning("prctl(PR_SET_PDEATHSIG) unavailable; watching the parent pid only")
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)


def package_spec(spec: str) -> tuple[str, str, str]:
    """``NAME=module:factory`` → its name, module and factory; raises ``ValueError``."""
    name, _, target = spec.partition("=")
    module_name, _, factory_name = target.partition(":")
    if not (name and module_name and factory_name):
        raise ValueError(f"a package is NAME=module:factory, got {spec!r}")
    return name, module_name, factory_name


def _preload(package_args: Sequence[str]) -> None:
    """Import the executor and each package's module (not its factory: each executor calls that).
    A spec or module that fails is left to the executors, which fail on it as they always did."""
    importlib.import_module("coordinator.engine.embedded.executor")
    specs = argparse.ArgumentParser(add_help=False)
    specs.add_argument("--package", action="append", default=[])
    for spec in specs.parse_known_args(package_args)[0].package:
        try:
            importlib.import_module(package_spec(spec)[1])
        except Exception:  # the executor that loads it reports it
            traceback.print_exc()


def serve(connection: socket.socket, package_args: Sequence[str]) -> None:
    """Fork an executor per request until the host's end of ``connection`` closes."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, _child_ended)
    children: set[int] = set()
    while True:
        readable, _, _ = select.select([connection.fileno(), wake_read], [], [])
        if wake_read in readable:
            _drain(wake_read)
            _report_exits(connection, children)
        if connection.fileno() in readable:
            message, fds, _, _ = socket.recv_fds(connection, _MESSAGE_BYTES, 2)
            if not message:
                break
            try:
                number = msgpack.unpackb(message)[1]
                pid = _answer(connection, number, (wake_read, wake_write), fds, package_args)
                if pid is not None:
                    children.add(pid)
            finally:
                for fd in fds:
                    os.close(fd)
    _end_children(children)


def _end_children(children: set[int]) -> None:
    """The host is done with this server: kill the executors still running (they would die with
    it anyway) and reap every child before leaving, so each is gone when the host reaps the
    server, and their CPU time (their clp-s runs' with it) is counted in the server's, and the
    host's, resource usage instead of being reaped by init."""
    for pid in children:  # none is reaped yet, so none of these pids is another process's
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _answer(
    connection: socket.socket,
    number: int,
    wake: tuple[int, int],
    fds: Sequence[int],
    package_args: Sequence[str],
) -> int | None:
    """Fork the executor of spawn ``number`` and say so (with its pidfd), or why not; its pid."""
    try:
        if len(fds) != 2:
            raise OSError(f"a spawn needs 2 file descriptors, got {len(fds)}")
        pid = _fork_executor(connection, wake, fds, package_args)
    except OSError as error:
        connection.send(msgpack.packb(["failed", number, str(error)]))
        return None
    pidfd = _pidfd(pid)
    try:
        answer = msgpack.packb(["spawned", number, pid])
        socket.send_fds(connection, [answer], [] if pidfd is None else [pidfd])
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return pid


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 512):
            pass


def _child_ended(signum: int, frame: FrameType | None) -> None:
    """Only wakes ``select`` (through the wake-up fd); exits are reaped in the loop."""


def _report_exits(connection: socket.socket, children: set[int]) -> None:
    """Reap the children that ended and tell the host. A host that has shut its end (closing
    the server, after killing its executors) is told nothing: it counts them killed once the
    server is gone."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            connection.send(msgpack.packb(["exited", pid, os.waitstatus_to_exitcode(status)]))


def _pidfd(pid: int) -> int | None:
    """A pidfd of the (not yet reaped) child, or ``None`` where the kernel or a seccomp profile
    refuses it (the host then signals the pid, before its exit is reported)."""
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


def _fork_executor(
    connection: socket.socket,
    wake: tuple[int, int],
    pipes: Sequence[int],
    package_args: Sequence[str],
) -> int:
    """Fork; the child becomes an executor on ``pipes`` (stdin, stdout) and never returns."""
    server_pid = os.getpid()
    # Whatever a package printed while the server imported it must not reach an executor's buffers
    # (its stdout becomes the reply pipe).
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the executor's subprocesses reap their own
        connection.close()
        for fd in wake:
            os.close(fd)
        os.dup2(pipes[0], 0)
        os.dup2(pipes[1], 1)
        for fd in pipes:
            os.close(fd)
        from coordinator.engine.embedded.executor import main  # noqa: PLC0415 (preloaded)

        code = main([*package_args, "--parent-pid", str(server_pid)])
    except SystemExit as error:
        code = error.code if isinstance(error.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """The server: ``--socket-fd N --parent-pid P --package NAME=module:factory …``."""
    parser = argparse.ArgumentParser(prog="coordinator-executor-fork-server")
    parser.add_argument("--socket-fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    args, package_args = parser.parse_known_args(argv)
    kill_me_with_parent(args.parent_pid)
    connection = socket.socket(fileno=args.socket_fd)
    _preload(package_args)
    if not gc.isenabled():  # paused for the start-up (``__main__``): every executor shares it
        gc.freeze()
        gc.enable()
    try:
        serve(connection, package_args)
    except KeyboardInterrupt:  # a terminal's Ctrl-C reaches the whole process group
        return 130  # its executors die with it, as they die of it themselves
    return 0
