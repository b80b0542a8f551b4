"""The listening sockets: connections held under a cap below the open-file limit.

A client holding connections open half-sent could take every file the process may open, and
every scrape would time out. Here a connection has :data:`HEAD_TIMEOUT` seconds to send a
request's head; at most :func:`connection_cap` connections (half the open-file limit) are
open, and one past the cap closes the oldest that has not sent a whole head (else the oldest
of all); a refused accept is one log line a minute per kind, with a growing wait, as Go's
``net/http`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import signal
import socket
import ssl
from collections.abc import Callable

from aiohttp import web

from inferwatch.logs import LogLimiter
from inferwatch.settings import ConfigError

log = logging.getLogger("inferwatch")

# Seconds a connection has to send a request's head, from its accept or its last answer.
HEAD_TIMEOUT = 10.0
# The most connections open at once, whatever the open-file limit: Prometheus' own
# --web.max-connections default.
MAX_CONNECTIONS = 512
# The open-file limit below which the sidecar refuses to start: half of it is the reserve.
MIN_OPEN_FILES = 64
# The listening sockets' backlog (aiohttp's).
BACKLOG = 128
# Seconds accepting waits after a refused accept: doubled at each, up to the last.
ACCEPT_RETRY = (0.005, 1.0)


def open_file_limit() -> int:
    """The process's open-file limit (the soft one: what ``accept`` runs into)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_CONNECTIONS * 2 if soft == resource.RLIM_INFINITY else soft


def connection_cap(open_files: int) -> int:
    """The most connections open at once under an open-file limit: half of it, at most
    :data:`MAX_CONNECTIONS`; ConfigError under :data:`MIN_OPEN_FILES`."""
    if open_files < MIN_OPEN_FILES:
        raise ConfigError(
            f"the open-file limit is {open_files}: inferwatch serve needs {MIN_OPEN_FILES} at "
            "least (raise it: ulimit -n)"
        )
    return min(MAX_CONNECTIONS, open_files // 2)


class _Watched(asyncio.Protocol):
    """A connection's protocol (aiohttp's request handler), telling ``spoke`` when the first
    whole request head has come (a blank line ends it) and ``lost`` when it ends."""

    def __init__(
        self, inner: asyncio.Protocol, spoke: Callable[[], None], lost: asyncio.Future[None]
    ) -> None:
        self._inner = inner
        self._spoke: Callable[[], None] | None = spoke
        self._tail = b""  # the last bytes received, while no head has ended
        self._lost = lost

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._spoke is not None:
            if b"\r\n\r\n" in self._tail + data[:3] or b"\r\n\r\n" in data:
                self._spoke()
                self._spoke = None
            else:
                self._tail = (self._tail + data)[-3:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self._inner.connection_lost(exc)
        finally:
            if not self._lost.done():
                self._lost.set_result(None)


class Connections:
    """The connections accepted on the listening sockets, oldest first, at most ``cap``
    open; each served by ``protocol`` (the app's request handler factory)."""

    def __init__(
        self,
        cap: int,
        protocol: Callable[[], asyncio.Protocol],
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.cap = cap
        self._protocol = protocol
        self._ssl = ssl_context
        # Open and not closed by the cap, oldest first: those that have not sent a whole
        # request head yet, and those that have.
        self._silent: dict[socket.socket, None] = {}
        self._spoken: dict[socket.socket, None] = {}
        self._held = 0  # connections whose file is open (those closed by the cap included)
        self._room = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._log = LogLimiter()

    async def accept(self, listener: socket.socket) -> None:
        """Accept connections on ``listener`` until cancelled."""
        loop = asyncio.get_running_loop()
        delay = 0.0
        while True:
            await self._make_room()
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:
                delay = min(ACCEPT_RETRY[1], 2 * delay or ACCEPT_RETRY[0])
                kind = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
                self._warn(kind, "accepting a connection failed (%s), retrying in %g s", exc, delay)
                await asyncio.sleep(delay)
                continue
            delay = 0.0
            self._silent[sock] = None
            self._held += 1
            task = asyncio.create_task(self._serve(sock))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _make_room(self) -> None:
        """Wait until fewer than ``cap`` connections are open, closing the oldest silent one
        (else the oldest) for it."""
        while self._held >= self.cap:
            live = self._silent or self._spoken
            if live:
                oldest = next(iter(live))
                del live[oldest]
                with contextlib.suppress(OSError):  # already gone
                    oldest.shutdown(socket.SHUT_RDWR)  # its transport reads the end, closes
                self._warn(
                    "cap",
                    "%d connections open (the cap, half the open-file limit): closed the "
                    "oldest for a new one",
                    self.cap,
                )
            self._room.clear()
            await self._room.wait()

    async def _serve(self, sock: socket.socket) -> None:
        """One connection, from its accept until it is closed."""
        loop = asyncio.get_running_loop()
        lost: asyncio.Future[None] = loop.create_future()
        try:
            await loop.connect_accepted_socket(
                lambda: _Watched(self._protocol(), lambda: self._spoke(sock), lost),
                sock,
                ssl=self._ssl,
                ssl_handshake_timeout=HEAD_TIMEOUT if self._ssl else None,
            )
            await lost
        except (OSError, asyncio.TimeoutError):
            sock.close()  # a TLS handshake that failed or took too long; no-op if closed
        finally:
            self._silent.pop(sock, None)
            self._spoken.pop(sock, None)
            self._held -= 1
            self._room.set()

    def _spoke(self, sock: socket.socket) -> None:
        """``sock`` has sent a whole request head: the last to close for room."""
        if sock in self._silent:  # not closed by the cap meanwhile
            del self._silent[sock]
            self._spoken[sock] = None

    def _warn(self, kind: str, message: str, *args: object) -> None:
        """A warning, at most one a minute of each kind, with how many were held back."""
        held = self._log.allow(kind)
        if held is not None:
            more = f" ({held} more like this in the last minute)" if held else ""
            log.warning(message + "%s", *args, more)


class Listener:
    """``app`` served on bound ``sockets`` (TLS with ``ssl_context``), at most ``cap``
    connections open at once, between :meth:`start` and :meth:`close`."""

    def __init__(
        self,
        app: web.Application,
        sockets: list[socket.socket],
        ssl_context: ssl.SSLContext | None,
        cap: int,
    ) -> None:
        self._runner = web.AppRunner(app, access_log=None)
        self._sockets = sockets
        self._ssl = ssl_context
        self._cap = cap
        self.accepting: list[asyncio.Task[None]] = []  # one task per socket

    async def start(self) -> None:
        """Start the app (its startup and cleanup contexts), then accept connections."""
        await self._runner.setup()
        assert self._runner.server is not None
        connections = Connections(self._cap, self._runner.server, self._ssl)
        for sock in self._sockets:
            sock.listen(BACKLOG)
            sock.setblocking(False)
            self.accepting.append(asyncio.create_task(connections.accept(sock)))

    async def close(self) -> None:
        """Stop accepting, close the sockets, then the connections and the app."""
        for task in self.accepting:
            task.cancel()
        for sock in self._sockets:
            sock.close()
        await self._runner.cleanup()


async def _run(listener: Listener) -> None:
    """Serve until SIGINT or SIGTERM; the app's cleanup runs then."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await listener.start()
    stopped = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait(
            [stopped, *listener.accepting], return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        stopped.cancel()
        await listener.close()
    for task in done - {stopped}:
        task.result()  # accepting stopped on its own: a bug, raised


def serve(
    app: web.Application,
    sockets: list[socket.socket],
    ssl_context: ssl.SSLContext | None,
    cap: int,
) -> None:
    """Serve ``app`` on the bound ``sockets`` (TLS with ``ssl_context``), at most ``cap``
    connections open at once, until SIGINT or SIGTERM."""
    asyncio.run(_run(Listener(app, sockets, ssl_context, cap)))
