"""GETs of one URL over one kept-alive HTTP/1.1 connection: the poll's fetch.

A poll asks one URL the same question each time, so this keeps one connection, writes the
request's bytes made once and parses the answer with llhttp (``httptools``) into one buffer
kept for the connection's life, where aiohttp's client builds objects for every request.
What an answer must be is the caller's policy (:mod:`inferwatch.collect.upstream`); here is
the transport, bounded: the whole exchange within ``timeout``, at most ``max_bytes`` of body
(decompressed too) and :data:`MAX_HEAD_BYTES` of head, an answer other than 200 not read
further. Credentials in the URL are sent as basic auth unless an ``Authorization`` header is
given. A connection the server closed between polls is opened again once.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

import httptools

MAX_HEAD_BYTES = 64 * 1024
# What one read of the socket takes at most: the size of the buffer a connection keeps.
_BUFFER = 256 * 1024
# Bytes of a path and query sent as they are: RFC 3986's reserved and unreserved, and "%".
_SAFE = "/?#[]@!$&'()*+,;=-._~%:"


class HttpFailure(Exception):
    """The exchange failed; ``kind``: ``connect``, ``timeout``, ``cut short``,
    ``too large``, ``not http`` or ``request``. ``str()`` says what, without the URL."""

    def __init__(self, what: str, kind: str) -> None:
        super().__init__(what)
        self.kind = kind


@dataclass(frozen=True)
class Answer:
    """The server's answer: its status, its headers (lower-case names, the first of a
    repeated one) and its body (decompressed; empty unless the status is 200)."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class Http1Connection:
    """GETs of ``url`` over one connection, kept open between them; not for concurrent use
    (:class:`~inferwatch.collect.upstream.Upstream` holds a lock around it)."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        *,
        timeout: float,
        max_bytes: int,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.timeout = timeout
        self.max_bytes = max_bytes
        try:
            parts = urlsplit(url)
            self._port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise HttpFailure(str(exc), "request") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HttpFailure("not an http:// or https:// URL with a host", "request")
        self._host = parts.hostname
        self._ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self._ssl = ssl_context if ssl_context is not None else ssl.create_default_context()
        self._request = _request(parts.netloc, parts.path, parts.query, headers)
        self._wire: _Wire | None = None

    async def get(self) -> Answer:
        """One GET; raises :class:`HttpFailure`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        for _ in range(2):
            wire = self._wire
            kept = wire is not None and not wire.lost
            if wire is None or not kept:
                self.close()
                wire = await self._connect(deadline - loop.time())
            timer = loop.call_at(deadline, wire.expire)
            try:
                answer = await wire.exchange(self._request, kept, self.max_bytes)
            except _ClosedWhileIdle:
                self.close()
                continue  # the server closed the kept connection: once more, on a new one
            except BaseException:
                self.close()
                raise
            finally:
                timer.cancel()
            if wire.expired or not wire.reusable:
                self.close()  # answered as the deadline passed, told to, or bytes left over
            return answer
        raise HttpFailure("the connection closed before an answer", "cut short")

    def close(self) -> None:
        if self._wire is not None and self._wire.transport is not None:
            self._wire.transport.close()
        self._wire = None

    async def _connect(self, seconds: float) -> _Wire:
        loop = asyncio.get_running_loop()
        try:
            _, wire = await asyncio.wait_for(
                loop.create_connection(_Wire, self._host, self._port, ssl=self._ssl),
                max(seconds, 0.0),
            )
        except asyncio.TimeoutError:
            raise HttpFailure("timeout", "timeout") from None
        except OSError as exc:
            raise HttpFailure(str(exc), "connect") from None
        self._wire = wire
        return wire


class _Wire(asyncio.BufferedProtocol):
    """A connection's receiving end: the bytes arrive in one buffer kept for the
    connection's life (no allocation per read) and are parsed as they arrive; the GET
    waiting is woken once, with its answer or its failure."""

    def __init__(self) -> None:
        self._view = memoryview(bytearray(_BUFFER))
        self.transport: asyncio.BaseTransport | None = None
        self.lost = False  # closed, by either side
        self.expired = False  # the GET's deadline passed: the connection was dropped
        self.reusable = False  # after an answer: whether another GET may follow on it
        self._answer: _Parse | None = None  # the GET's, while one waits
        self._done: asyncio.Future[Answer] | None = None
        self._received = 0
        self._kept = False

    async def exchange(self, request: bytes, kept: bool, max_bytes: int) -> Answer:
        """Write the GET (``kept``: on a connection that served one before) and wait for
        its answer."""
        if not isinstance(self.transport, asyncio.WriteTransport):  # lost: None
            raise _ClosedWhileIdle
        self._answer, self._received, self._kept = _Parse(max_bytes), 0, kept
        self.expired = self.reusable = False
        self._done = asyncio.get_running_loop().create_future()
        try:
            self.transport.write(request)
            return await self._done
        finally:
            self._answer.release()
            self._answer = self._done = None

    def expire(self) -> None:
        """The deadline passed mid-exchange: the connection is dropped, which ends the GET."""
        self.expired = True
        if self.transport is not None:
            self.transport.abort()  # type: ignore[attr-defined]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        answer = self._answer
        if answer is None or self._done is None or self._done.done():
            # Bytes no GET asked for: the connection cannot serve another.
            self.reusable = False
            if self.transport is not None:
                self.transport.close()
            return
        assert answer.parser is not None
        self._received += nbytes
        try:
            answer.parser.feed_data(self._view[:nbytes])
        except httptools.HttpParserError as exc:
            return self._fail(HttpFailure(f"not HTTP/1.1: {str(exc)[:100]}", "not http"))
        if answer.headers_done and answer.status != 200:
            # Its body is not read: the connection cannot serve another.
            return self._done.set_result(Answer(answer.status, answer.headers, b""))
        if answer.failure is not None:
            return self._fail(HttpFailure(*answer.failure))
        # What is not body (status line, headers, trailers, chunk framing) is bounded.
        if self._received - answer.size > MAX_HEAD_BYTES + answer.chunks * _FRAMING:
            return self._fail(HttpFailure(f"headers over {MAX_HEAD_BYTES // 1024} KiB", "not http"))
        if answer.complete:
            self.reusable = answer.keep_alive and not answer.more
            self._body(answer)

    def eof_received(self) -> bool:
        return False  # the connection closes: connection_lost says what that means

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.transport = None
        answer = self._answer
        if answer is None or self._done is None or self._done.done():
            return
        if self.expired:
            self._fail(HttpFailure("timeout", "timeout"))
        elif self._received == 0 and self._kept:
            self._fail(_ClosedWhileIdle())
        elif answer.until_close():
            self._body(answer)
        else:
            self._fail(HttpFailure("cut short", "cut short"))

    def _body(self, answer: _Parse) -> None:
        assert self._done is not None
        try:
            body = _decoded(b"".join(answer.body), answer.headers, answer.max_bytes)
        except HttpFailure as exc:
            return self._fail(exc)
        self._done.set_result(Answer(answer.status, answer.headers, body))

    def _fail(self, exc: Exception) -> None:
        assert self._done is not None
        self._done.set_exception(exc)


# Bytes a chunk's framing may take (its size line, extensions aside, and CRLF).
_FRAMING = 64


class _ClosedWhileIdle(Exception):
    """A kept connection gave nothing back: the server closed it between two GETs."""


class _Parse:
    """httptools' callbacks: one answer as it arrives, bounded. An interim answer (1xx) is
    skipped; bytes past the answer are not read into it (``more``)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.size = 0
        self.chunks = 0
        self.status = 0
        self.headers_done = False
        self.complete = False
        self.more = False
        self.keep_alive = False
        self.failure: tuple[str, str] | None = None  # (what, kind): raised by the reader
        # The parser calls back into this object: the reference cycle is broken after the
        # exchange (release), so that the body goes at once, not at a collection.
        self.parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)

    def release(self) -> None:
        self.parser = None
        self.body = []

    def on_message_begin(self) -> None:
        if self.complete:
            self.more = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.complete:
            self.headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        if self.complete:
            return
        assert self.parser is not None
        self.status = self.parser.get_status_code()
        self.headers_done = True
        length = self.headers.get("content-length", "")
        if self.status == 200 and length.isdigit() and int(length) > self.max_bytes:
            self.failure = ("too large", "too large")

    def on_chunk_header(self) -> None:
        self.chunks += 1

    def on_body(self, body: bytes) -> None:
        if self.complete:
            return
        self.size += len(body)
        if self.size > self.max_bytes:
            self.failure = ("too large", "too large")
        elif self.failure is None:
            self.body.append(body)

    def on_message_complete(self) -> None:
        if self.complete:
            return
        if 100 <= self.status < 200:  # an interim answer (103 Early Hints): the next counts
            self.headers, self.headers_done, self.status = {}, False, 0
            return
        self.complete = True
        assert self.parser is not None
        self.keep_alive = self.parser.should_keep_alive()  # read now: the parser resets

    def until_close(self) -> bool:
        """Whether the body, its headers read, is the bytes until the connection closes."""
        coding = self.headers.get("transfer-encoding", "").lower()
        return (
            self.headers_done and "content-length" not in self.headers and "chunked" not in coding
        )


def _request(netloc: str, path: str, query: str, headers: Mapping[str, str]) -> bytes:
    """The bytes of the GET: the URL's path and query, its host, the caller's headers, and
    basic auth from the URL's credentials where no Authorization header is given."""
    userinfo, _, host = netloc.rpartition("@")
    target = quote(path or "/", safe=_SAFE) + (f"?{quote(query, safe=_SAFE)}" if query else "")
    given = {k.lower() for k in headers}  # a header given in any case replaces the default
    fields = {
        k: v for k, v in (("Host", host), ("User-Agent", "inferwatch")) if k.lower() not in given
    }
    fields.update(headers)
    if userinfo and "authorization" not in given:
        user, _, password = userinfo.partition(":")
        credentials = f"{unquote(user)}:{unquote(password)}"
        try:
            raw = credentials.encode("latin-1")  # as aiohttp's basic auth encodes them
        except UnicodeEncodeError:
            raw = credentials.encode()
        fields["Authorization"] = f"Basic {base64.b64encode(raw).decode()}"
    for name, value in fields.items():
        if any(c in "\r\n\0" for c in name + value) or not name or ":" in name:
            raise HttpFailure(f"header {name[:40]!r} is not a valid header", "request")
    lines = [f"GET {target} HTTP/1.1", *(f"{k}: {v}" for k, v in fields.items()), "", ""]
    try:
        return "\r\n".join(lines).encode("latin-1")
    except UnicodeEncodeError:
        raise HttpFailure("a header holds a character HTTP cannot carry", "request") from None


def _decoded(body: bytes, headers: Mapping[str, str], max_bytes: int) -> bytes:
    """The body without its content coding (gzip or deflate), at most ``max_bytes``."""
    coding = headers.get("content-encoding", "identity").strip().lower()
    if coding in ("", "identity"):
        return body
    if coding not in ("gzip", "x-gzip", "deflate"):
        raise HttpFailure(f"content coding {coding[:20]!r} is not supported", "not http")
    # 47: a gzip or zlib header, told apart by the data; deflate may also come raw (-15).
    for wbits in (47, -15):
        inflate = zlib.decompressobj(wbits)
        try:
            out = inflate.decompress(body, max_bytes + 1)
        except zlib.error:
            continue
        if len(out) > max_bytes or inflate.unconsumed_tail:
            raise HttpFailure("too large", "too large")
        if not inflate.eof:
            raise HttpFailure("cut short", "cut short")
        return out
    raise HttpFailure(f"a {coding} body that does not decompress", "not http")
