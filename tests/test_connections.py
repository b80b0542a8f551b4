"""Connections held open against the sidecar (docs/security.md, "Connections"), through the
real app and a real ``inferwatch serve`` at a container's usual open-file limit: a
connection that does not send a whole request head in time is closed, a connection past
the cap closes the oldest and is answered, a refused accept is one log line, and scrapes
are answered while 1,100 half-sent requests are held open."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import resource
import shutil
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from demo.stack import Process, free_port
from inferwatch.serve.listener import Listener
from inferwatch.serve.sidecar import make_app

from conftest import fixture_text, thread_server

CAPTURE = fixture_text("vllm-0.32.0-cpu-loaded-kv-full.prom")
HALF_SENT = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n"  # no blank line: never whole
GUARD = 10.0  # seconds: a guard against a hang, not a speed bound


async def hangs_up(reader: asyncio.StreamReader) -> float:
    """Seconds until the server closes the connection (whatever it sends before)."""
    start = time.monotonic()
    await asyncio.wait_for(reader.read(), GUARD)
    return time.monotonic() - start


async def test_a_connection_without_a_whole_request_head_in_time_is_closed(
    poller_for, backend_url, aiohttp_server
) -> None:
    deadline = 0.5
    app = make_app(poller_for(backend_url), run_poller=False, head_timeout=deadline)
    server = await aiohttp_server(app)
    silent = await asyncio.open_connection(server.host, server.port)
    half = await asyncio.open_connection(server.host, server.port)
    half[1].write(HALF_SENT)
    kept = await asyncio.open_connection(server.host, server.port)
    kept[1].write(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
    head = await asyncio.wait_for(kept[0].readuntil(b"\r\n\r\n"), GUARD)
    assert head.startswith(b"HTTP/1.1 200 OK")  # then idle, kept alive
    waits = await asyncio.gather(*(hangs_up(reader) for reader, _ in (silent, half, kept)))
    assert all(wait < deadline * 4 for wait in waits), waits
    for _, writer in (silent, half, kept):
        writer.close()
        await writer.wait_closed()


@contextlib.asynccontextmanager
async def listening(app: web.Application, cap: int) -> AsyncIterator[str]:
    """``app`` served as ``inferwatch serve`` serves it, at most ``cap`` connections open;
    yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    host, port = sock.getsockname()
    listener = Listener(app, [sock], None, cap)
    await listener.start()
    try:
        yield f"http://{host}:{port}"
    finally:
        await listener.close()


async def scrape(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as resp:
        await resp.read()
        return resp.status


async def asked(connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> bytes:
    """The status line of a scrape on a kept-alive connection."""
    reader, writer = connection
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD)
    length = re.search(rb"\r\nContent-Length: (\d+)", head, re.IGNORECASE)
    assert length is not None, head
    await reader.readexactly(int(length.group(1)))
    return head.partition(b"\r\n")[0]


async def test_a_connection_past_the_cap_closes_the_oldest_silent_one_and_is_answered(
    poller_for, backend_url
) -> None:
    async with listening(make_app(poller_for(backend_url), run_poller=False), cap=4) as url:
        host, port = url.removeprefix("http://").split(":")
        scraper = await asyncio.open_connection(host, int(port))
        assert await asked(scraper) == b"HTTP/1.1 200 OK"  # then kept alive
        held = [await asyncio.open_connection(host, int(port)) for _ in range(4)]
        for _, writer in held:
            writer.write(HALF_SENT)
        # One more than the cap: the oldest that never sent a whole head made room, not
        # the scraper's connection, older but answered.
        await hangs_up(held[0][0])
        assert await asked(scraper) == b"HTTP/1.1 200 OK"
        assert await asyncio.wait_for(scrape(url), GUARD) == 200  # a new one, past the cap
        await hangs_up(held[1][0])
        assert not held[-1][0].at_eof()
        for _, writer in (scraper, *held):
            writer.close()
            await writer.wait_closed()


async def test_a_refused_accept_is_one_line_not_a_traceback(
    poller_for, backend_url, monkeypatch, caplog
) -> None:
    loop = asyncio.get_running_loop()
    accept = loop.sock_accept
    refusals = 5

    async def refusing(sock: socket.socket) -> tuple[socket.socket, object]:
        nonlocal refusals
        if refusals:
            refusals -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return await accept(sock)

    monkeypatch.setattr(loop, "sock_accept", refusing)
    caplog.set_level(logging.DEBUG)
    async with listening(make_app(poller_for(backend_url), run_poller=False), cap=8) as url:
        assert await asyncio.wait_for(scrape(url), GUARD) == 200
    lines = [r for r in caplog.records if r.name in ("inferwatch", "asyncio")]
    assert [r.getMessage() for r in lines] == [
        "accepting a connection failed ([Errno 24] Too many open files), retrying in 0.005 s"
    ]
    assert lines[0].levelno == logging.WARNING and lines[0].exc_info is None


# --- a real `inferwatch serve` at 1,024 open files ----------------------------------------

OPEN_FILES = 1024
HELD_OPEN = 1100


def half_sent(port: int) -> socket.socket | None:
    """A connection holding a half-sent request (None: not accepted in time)."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=2.0)
        sock.sendall(HALF_SENT)
        return sock
    except OSError:
        return None


def scrape_status(url: str) -> int | str:
    """The status of one scrape, or why it failed (a timeout: the old sidecar's answer)."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5.0) as resp:
            resp.read()
            return resp.status
    except (OSError, urllib.error.URLError) as exc:
        return type(exc).__name__


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_scrapes_are_answered_while_more_connections_than_files_are_held_half_sent(
    tmp_path: Path,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < HELD_OPEN + 100:
        pytest.skip(f"this test holds {HELD_OPEN} connections: the hard open-file limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HELD_OPEN + 100), hard))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    held: list[socket.socket | None] = []
    with thread_server(lambda _: (200, CAPTURE.encode())) as backend:
        argv = ["prlimit", f"--nofile={OPEN_FILES}:{OPEN_FILES}", sys.executable, "-m"]
        argv += ["inferwatch", "serve", "--backend-url", f"http://{backend}", "--backend", "vllm"]
        argv += ["--gpu", "off", "--web.listen-address", f"127.0.0.1:{port}"]
        sidecar = Process("inferwatch", argv, tmp_path / "inferwatch.log").start()
        try:
            sidecar.wait_http(f"{url}/healthz", 30)
            held = [half_sent(port) for _ in range(HELD_OPEN)]
            time.sleep(1.0)  # every connection accepted, or refused
            statuses = [scrape_status(url) for _ in range(5)]
            files = len(os.listdir(f"/proc/{sidecar.pid}/fd"))
        finally:
            for sock in filter(None, held):
                sock.close()
            sidecar.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    log = (tmp_path / "inferwatch.log").read_text()
    assert statuses == [200] * 5, log[-2000:]
    assert files < OPEN_FILES
    assert "Traceback" not in log
    warnings = [
        line for line in log.splitlines() if "level=warning" in line and "connection" in line
    ]
    assert len(warnings) == 1 and "closed the oldest for a new one" in warnings[0], warnings
