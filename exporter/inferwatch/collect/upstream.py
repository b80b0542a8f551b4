"""Bounded HTTP reads from the inference server: timeouts, size cap, one-line errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Mapping

import aiohttp

from inferwatch.collect.http1 import Http1Connection, HttpFailure
from inferwatch.urls import has_path, origin_of, redact_url, redirect_cause

# Ask for classic text; SGLang and other prometheus_client servers otherwise negotiate
# OpenMetrics or gzip.
_ACCEPT = "text/plain;version=0.0.4;q=1.0, */*;q=0.1"
_TEXT_TYPES = ("text/plain", "application/openmetrics-text", "")


class UpstreamError(Exception):
    """A failed read of the backend; ``str()`` is a one-line cause safe to log.

    ``kind`` names the cause without its details (``"http status"``, ``"redirect"``...), so
    that logs can be rate limited by kind whatever the text (a 500 and a 503 are one kind).
    """

    def __init__(self, cause: str, kind: str, status: int | None = None) -> None:
        super().__init__(cause)
        self.kind = kind
        self.status = status  # the HTTP status of an answer that was not 200


class Upstream:
    """Reads the backend's pages with a timeout and a cap on the body size.

    ``headers`` (e.g. an Authorization bearer token) are sent but never logged.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float,
        max_bytes: int,
        headers: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._names_path = has_path(self.base_url)  # told once: url() is asked every poll
        self.ssl_context = ssl_context  # None: the system's trust store
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.headers = dict(headers or {})  # the caller's (may hold a secret; never logged)
        self._headers = {"Accept": _ACCEPT, "Accept-Encoding": "identity", **self.headers}
        self._session: aiohttp.ClientSession | None = None
        # The metrics page's own connection, by URL (collect/http1.py), and who holds it.
        self._pages: dict[str, Http1Connection] = {}
        self._page_lock = asyncio.Lock()

    def url(self, path: str) -> str:
        """The base URL if it already names a path (``http://h:8000/metrics``), else base+path."""
        return self.base_url if self._names_path else self.base_url + path

    def origin(self) -> str:
        """``scheme://host:port`` of the base URL, for the server's other endpoints."""
        return origin_of(self.base_url)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                connector=aiohttp.TCPConnector(
                    limit=2,
                    force_close=False,
                    ssl=self.ssl_context if self.ssl_context is not None else True,
                ),
                auto_decompress=True,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        for connection in self._pages.values():
            connection.close()
        self._pages.clear()

    async def get_exposition(self, path: str) -> str:
        """The metrics page (``path`` unless the base URL names one); raises UpstreamError.

        Asked every poll, over a connection of its own (:mod:`.http1`)."""
        url = self.url(path)
        async with self._page_lock:
            try:
                connection = self._pages.get(url)
                if connection is None:
                    connection = Http1Connection(
                        url,
                        self._headers,
                        timeout=self.timeout,
                        max_bytes=self.max_bytes,
                        ssl_context=self.ssl_context,
                    )
                    self._pages[url] = connection
                answer = await connection.get()
            except HttpFailure as exc:
                raise self._failure(url, exc) from None
        headers = answer.headers
        _accept(
            url, answer.status, headers.get("location"), _media_type(headers.get("content-type"))
        )
        return answer.body.decode("utf-8", errors="replace")

    def _failure(self, url: str, exc: HttpFailure) -> UpstreamError:
        """A failed exchange with ``url`` as one line."""
        where = redact_url(url)
        if exc.kind == "timeout":
            return UpstreamError(f"no answer from {where} within {self.timeout:g} s", "timeout")
        if exc.kind == "connect":
            return UpstreamError(f"cannot connect to {where}: {exc}", "connect")
        if exc.kind == "cut short":
            return UpstreamError(f"response from {where} cut short", "cut short")
        if exc.kind == "too large":
            return _too_large(url, self.max_bytes)
        return UpstreamError(f"{where}: {exc}", "http client")

    async def _get(self, url: str, *, exposition: bool) -> str:
        """The body at ``url`` as text; raises UpstreamError with a one-line cause."""
        request = self._client().get(url, headers=self._headers, allow_redirects=False)
        async with self._failures(url), request as resp:
            media = resp.content_type if "Content-Type" in resp.headers else ""
            _accept(url, resp.status, resp.headers.get("Location"), media if exposition else None)
            length = resp.content_length
            if length is not None and length > self.max_bytes:
                raise _too_large(url, self.max_bytes)
            body = await _read_capped(resp, self.max_bytes, url)
        return body.decode("utf-8", errors="replace")

    async def post_json(self, path: str, doc: Mapping[str, object]) -> None:
        """POST ``doc`` to one of the server's endpoints (``path`` from its origin); raises
        UpstreamError unless it answers 2xx. The body of the answer is not read."""
        url = self.origin() + path
        headers = {**self._headers, "Content-Type": "application/json"}
        request = self._client().post(
            url, data=json.dumps(doc), headers=headers, allow_redirects=False
        )
        async with self._failures(url), request as resp:
            if 300 <= resp.status < 400:
                raise _redirect(url, resp.status, resp.headers.get("Location"))
            if not 200 <= resp.status < 300:
                raise UpstreamError(f"HTTP {resp.status} from {redact_url(url)}", "http status")

    @contextlib.asynccontextmanager
    async def _failures(self, url: str) -> AsyncIterator[None]:
        """Any failure of a request to ``url`` as an UpstreamError with a one-line cause."""
        try:
            yield
        except UpstreamError:
            raise
        except asyncio.TimeoutError:
            raise UpstreamError(
                f"no answer from {redact_url(url)} within {self.timeout:g} s", "timeout"
            ) from None
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamError(
                f"cannot connect to {redact_url(url)}: {exc.os_error}", "connect"
            ) from None
        except aiohttp.ClientPayloadError:
            raise UpstreamError(f"response from {redact_url(url)} cut short", "cut short") from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(
                f"{type(exc).__name__} from {redact_url(url)}: {exc}", "http client"
            ) from None

    async def get_body(self, path: str) -> str:
        """Any page of the server (``path`` from its origin); raises UpstreamError."""
        return await self._get(self.origin() + path, exposition=False)

    async def get_json_field(self, path: str, field: str) -> str:
        """One string field of a small JSON document (e.g. ``/version``), or '' (also for
        a broken document, or a field that holds an object or a list).

        ``field`` may be a dotted path through objects and lists: ``data.0.id``.
        """
        try:
            value = json.loads(await self.get_body(path))
        except (UpstreamError, ValueError, RecursionError):  # a server's nesting too deep
            return ""
        for step in field.split("."):
            if isinstance(value, dict):
                value = value.get(step)
            elif isinstance(value, list) and step.isdigit() and int(step) < len(value):
                value = value[int(step)]
            else:
                return ""
        if value is None or isinstance(value, (dict, list)):
            return ""
        return str(value)[:100]


async def _read_capped(resp: aiohttp.ClientResponse, limit: int, url: str) -> bytes:
    chunks = []
    size = 0
    async for chunk in resp.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise _too_large(url, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(url: str, limit: int) -> UpstreamError:
    return UpstreamError(
        f"body from {redact_url(url)} exceeds {limit // (1024 * 1024)} MiB (--backend-max-bytes)",
        "too large",
    )


def _accept(url: str, status: int, location: str | None, media_type: str | None) -> None:
    """Raise UpstreamError unless the answer of ``url`` is a 200 (a redirect is never
    followed) of Prometheus text (``media_type``: the Content-Type's, '' when there is none;
    None: any)."""
    if 300 <= status < 400:
        raise _redirect(url, status, location)
    if status != 200:
        raise UpstreamError(f"HTTP {status} from {redact_url(url)}", "http status", status)
    if media_type is not None and media_type not in _TEXT_TYPES:
        raise UpstreamError(
            f"{redact_url(url)} answered {media_type}, not Prometheus text (wrong --backend-url?)",
            "content type",
        )


def _redirect(url: str, status: int, location: str | None) -> UpstreamError:
    return UpstreamError(redirect_cause(url, status, location), "redirect")


def _media_type(content_type: str | None) -> str:
    """``text/plain`` of ``text/plain; version=0.0.4``; '' when there is no Content-Type."""
    return "" if content_type is None else content_type.partition(";")[0].strip().lower()
