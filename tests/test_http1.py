"""The poll's own HTTP/1.1 connection (collect/http1.py), against servers on loopback that
answer with exactly the bytes each test writes."""

from __future__ import annotations

import asyncio
import base64
import gc
import gzip
import time
import zlib
from collections.abc import Awaitable, Callable

import pytest

from inferwatch.collect.http1 import MAX_HEAD_BYTES, Http1Connection, HttpFailure
from inferwatch.collect.upstream import Upstream, UpstreamError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """A loopback server that runs ``handler`` for each connection and counts them, and
    keeps each request's head."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.heads: list[bytes] = []

    async def __aenter__(self) -> RawServer:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/metrics"
        return self

    async def __aexit__(self, *_: object) -> None:
        self.server.close()

    async def head(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        return head


def answer(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    lines = [f"HTTP/1.1 {status}", *headers, "", ""]
    return "\r\n".join(lines).encode() + body


PAGE = b'vllm:num_requests_waiting{model_name="m"} 3\n'


def connection(url: str, **kw: object) -> Http1Connection:
    return Http1Connection(url, kw.pop("headers", {}), timeout=kw.pop("timeout", 2.0),  # type: ignore[arg-type]
                           max_bytes=kw.pop("max_bytes", 1 << 20))  # type: ignore[arg-type]  # fmt: skip


async def get_once(url: str, **kw: object) -> bytes:
    """One GET on a connection of its own, closed after."""
    http = connection(url, **kw)
    try:
        return (await http.get()).body
    finally:
        http.close()


async def test_gets_over_one_kept_connection_with_the_request_written_once() -> None:
    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await server.head(reader)
            writer.write(answer(PAGE, f"Content-Length: {len(PAGE)}", "Content-Type: text/plain"))

    async with RawServer(keep) as server:
        http = connection(server.url)
        bodies = [(await http.get()).body for _ in range(5)]
        http.close()
    assert bodies == [PAGE] * 5
    assert server.connections == 1
    assert server.heads[0].startswith(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:")
    assert len(set(server.heads)) == 1


async def test_a_connection_the_server_closed_while_idle_is_opened_again_at_once() -> None:
    async def one_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.head(reader)
        writer.write(answer(PAGE, f"Content-Length: {len(PAGE)}"))
        await writer.drain()  # then the server closes it, without saying so in the answer

    async with RawServer(one_answer) as server:
        http = connection(server.url)
        assert (await http.get()).body == PAGE
        await asyncio.sleep(0.05)
        assert (await http.get()).body == PAGE
        http.close()
    assert server.connections == 2


async def test_chunked_body_and_a_body_until_the_connection_closes() -> None:
    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.head(reader)
        writer.write(answer(b"", "Transfer-Encoding: chunked"))
        for part in (PAGE[:10], PAGE[10:]):
            writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await server.head(reader)  # kept: the next request comes on it
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + PAGE)

    async with RawServer(chunked) as server:
        http = connection(server.url)
        assert (await http.get()).body == PAGE
        assert (await http.get()).body == PAGE
        http.close()
    assert server.connections == 1


async def test_credentials_in_the_url_are_basic_auth_and_never_in_the_request_line() -> None:
    async def auth(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.head(reader)
        writer.write(answer(PAGE, f"Content-Length: {len(PAGE)}"))

    async with RawServer(auth) as server:
        url = server.url.replace("http://", "http://scraper:p%40ss@word@")
        await get_once(url)
    head = server.heads[0].decode()
    token = base64.b64encode(b"scraper:p@ss@word").decode()
    assert f"Authorization: Basic {token}\r\n" in head
    assert "p%40ss" not in head and "word@" not in head


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
async def test_a_compressed_body_sent_although_identity_was_asked_is_read(coding: str) -> None:
    packed = gzip.compress(PAGE) if coding == "gzip" else zlib.compress(PAGE)

    async def compressed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.head(reader)
        writer.write(
            answer(packed, f"Content-Length: {len(packed)}", f"Content-Encoding: {coding}")
        )

    async with RawServer(compressed) as server:
        assert await get_once(server.url) == PAGE
    assert b"Accept-Encoding" not in server.heads[0]  # the Upstream's headers ask identity


async def test_a_compression_bomb_is_refused_past_the_cap() -> None:
    packed = gzip.compress(b"0" * (4 << 20))

    async def bomb(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.head(reader)
        writer.write(answer(packed, f"Content-Length: {len(packed)}", "Content-Encoding: gzip"))

    async with RawServer(bomb) as server:
        with pytest.raises(HttpFailure) as failed:
            await get_once(server.url, max_bytes=1 << 20)
    assert failed.value.kind == "too large"


async def test_a_promised_length_over_the_cap_is_refused_before_the_body() -> None:
    async def huge(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.head(reader)
        writer.write(answer(b"", "Content-Length: 999999999"))
        await writer.drain()
        await asyncio.sleep(5)  # no body comes: the refusal must not wait for it

    async with RawServer(huge) as server:
        with pytest.raises(HttpFailure) as failed:
            await asyncio.wait_for(get_once(server.url, max_bytes=1 << 20), 1.0)
    assert failed.value.kind == "too large"


@pytest.mark.parametrize(
    ("before", "field"),
    [
        (b"HTTP/1.1 200 OK\r\n", "X-Filler-{n:08d}: y"),  # endless headers
        # trailers after the last chunk: not body, bounded as headers are
        (answer(b"", "Transfer-Encoding: chunked") + b"4\r\nx 1\n\r\n0\r\n", "X-T-{n}: {y}"),
    ],
    ids=["headers", "trailers"],
)
async def test_header_fields_past_the_bound_are_refused(before: bytes, field: str) -> None:
    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.head(reader)
        writer.write(before)
        for n in range(2 * MAX_HEAD_BYTES // 20):
            writer.write((field.format(n=n, y="y" * 20) + "\r\n").encode())
        await writer.drain()
        await asyncio.sleep(5)

    async with RawServer(endless) as server:
        with pytest.raises(HttpFailure, match="headers over") as failed:
            await get_once(server.url)
    assert failed.value.kind == "not http"


async def test_a_silent_server_times_out_and_the_next_get_connects_anew() -> None:
    async def silent_first(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.head(reader)
        if server.connections == 1:
            await asyncio.sleep(5)
        writer.write(answer(PAGE, f"Content-Length: {len(PAGE)}"))

    async with RawServer(silent_first) as server:
        http = connection(server.url, timeout=0.3)
        with pytest.raises(HttpFailure) as failed:
            await http.get()
        assert failed.value.kind == "timeout"
        assert (await http.get()).body == PAGE
        http.close()
    assert server.connections == 2


async def test_garbage_instead_of_http_is_said_in_one_line() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.head(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n")

    async with RawServer(garbage) as server:
        upstream = Upstream(server.url, timeout=1.0, max_bytes=1 << 20)
        with pytest.raises(UpstreamError) as failed:
            await upstream.get_exposition("/metrics")
        await upstream.close()
    assert "\n" not in str(failed.value) and "not HTTP/1.1" in str(failed.value)


@pytest.mark.parametrize("header", [{"X-A": "b\r\nX-Injected: 1"}, {"Bad:Name": "v"}])
async def test_a_header_that_would_split_the_request_is_refused(header: dict) -> None:
    with pytest.raises(HttpFailure) as failed:
        connection("http://127.0.0.1:9/metrics", headers=header)
    assert failed.value.kind == "request"


async def test_an_answer_is_freed_at_once_not_at_a_garbage_collection() -> None:
    # A body held until a collection would pile up at a poll every 0.1 s (a 6 MB page:
    # hundreds of MB before the collector comes round); a failure's too.
    big = b"x 1\n" * 300

    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await server.head(reader)
            body = big if len(server.heads) % 2 == 0 else PAGE  # too large every other time
            writer.write(answer(b"", "Transfer-Encoding: chunked"))
            writer.write(f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")

    async with RawServer(keep) as server:
        http = connection(server.url, max_bytes=len(big) - 1)
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for n in range(4):
                try:
                    await http.get()
                except HttpFailure as failed:
                    assert n % 2 == 1 and failed.kind == "too large"
            gc.collect()
            cyclic = [o for o in gc.garbage if type(o).__module__ == "inferwatch.collect.http1"]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
            http.close()
    assert cyclic == []


async def test_a_refusal_is_its_status_whatever_length_it_promises() -> None:
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.head(reader)
        writer.write(answer(b"", "Content-Length: 999999999", status="404 Not Found"))

    async with RawServer(refuse) as server:
        upstream = Upstream(server.url, timeout=1.0, max_bytes=1 << 20)
        with pytest.raises(UpstreamError) as failed:
            await upstream.get_exposition("/metrics")
        await upstream.close()
    assert (failed.value.kind, failed.value.status) == ("http status", 404)


async def test_an_interim_answer_is_skipped_and_bytes_past_the_answer_are_not_read() -> None:
    async def extra(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.head(reader)
        early = b"HTTP/1.1 103 Early Hints\r\nContent-Type: text/html\r\n\r\n"
        ok = answer(PAGE, f"Content-Length: {len(PAGE)}", "Content-Type: text/plain")
        writer.write(early + ok + answer(b"junk!", "Content-Length: 5"))
        await server.head(reader)  # on a new connection: the first had bytes left over
        writer.write(ok)

    async with RawServer(extra) as server:
        http = connection(server.url)
        first = await http.get()
        assert (first.status, first.body, first.headers["content-type"]) == (
            200,
            PAGE,
            "text/plain",
        )
        assert (await http.get()).body == PAGE
        http.close()
    assert server.connections == 2


async def test_an_answer_at_the_deadline_leaves_the_next_get_a_fresh_connection() -> None:
    async def late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await server.head(reader)
            writer.write(answer(PAGE, f"Content-Length: {len(PAGE)}"))
            await writer.drain()
            if len(server.heads) == 1:
                time.sleep(0.4)  # the whole loop stalls past the client's deadline

    async with RawServer(late) as server:
        http = connection(server.url, timeout=0.2)
        bodies = [(await http.get()).body for _ in range(3)]
        http.close()
    assert bodies == [PAGE] * 3
