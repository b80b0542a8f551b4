"""One streamed request to an OpenAI-compatible server: the SSE reader, the client, and
the :class:`Sample` of what the client measured (TTFT, the gaps between tokens, e2e).

Shared by the sweep (``inferwatch baseline``) and the canary in ``serve``.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from inferwatch.urls import redact_url, redirect_cause

# Words that synthetic prompts (the sweep's, the canary's) are built from.
WORDS = (
    "time", "river", "light", "paper", "garden", "window", "music", "stone", "market",
    "winter", "cloud", "bridge", "number", "forest", "letter", "engine", "silver", "morning",
    "island", "table", "yellow", "harbor", "planet", "button", "circle", "doctor", "family",
    "summer", "kitchen", "pocket", "thunder", "valley",
)  # fmt: skip


def request_input(text: str, api: str) -> dict[str, Any]:
    """One user prompt as the API takes it: ``messages`` for chat, else ``prompt``."""
    if api == "chat":
        return {"messages": [{"role": "user", "content": text}]}
    return {"prompt": text}


# One SSE line and one streamed response: far above what a chunk or a long answer needs.
MAX_LINE_BYTES = 1024 * 1024
MAX_STREAM_BYTES = 64 * 1024 * 1024
PROBE_OUTPUT_TOKENS = 2


class SweepError(Exception):
    """The sweep cannot run; ``str()`` is one line."""


@dataclass(frozen=True)
class Sample:
    """One request as the client saw it; ``error`` is empty when it succeeded.

    ``kind`` names a failure without its details: ``http_error`` (a status other than 200,
    a redirect included: none is followed), ``timeout``, ``connect_error`` (no connection,
    or it broke before an answer) or ``bad_stream`` (an answer that breaks the SSE contract,
    is cut short or carries an error event or no token).
    """

    error: str = ""
    kind: str = ""
    status: int = 0  # the HTTP status of a request the server refused
    ttft: float = math.nan
    gaps: tuple[float, ...] = ()
    e2e: float = math.nan
    prompt_tokens: int | None = None
    output_tokens: int = 0

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def streamed(self) -> bool:
        """Whether a token arrived (the server then observed a TTFT)."""
        return not math.isnan(self.ttft)


class StreamError(Exception):
    """A response that breaks the SSE contract; ``str()`` is one line."""


async def sse_data(content: aiohttp.StreamReader) -> AsyncIterator[tuple[float, str]]:
    """``(arrival time, data)`` of each server-sent event, read within the size bounds.

    Events end at a blank line; their ``data:`` lines are joined; comments and other fields
    are skipped. The arrival time is that of the network read that completed the event.
    """
    buffer = b""
    data: list[str] = []
    total = 0
    async for chunk in content.iter_any():
        now = time.perf_counter()
        total += len(chunk)
        if total > MAX_STREAM_BYTES:
            raise StreamError(f"stream exceeds {MAX_STREAM_BYTES // 2**20} MiB")
        *lines, buffer = (buffer + chunk).split(b"\n")
        if len(buffer) > MAX_LINE_BYTES:
            raise StreamError(f"an SSE line exceeds {MAX_LINE_BYTES // 2**20} MiB")
        for raw in lines:
            line = raw.rstrip(b"\r")
            if not line:
                if data:
                    yield now, "\n".join(data)
                    data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(
                    (value[1:] if value.startswith(b" ") else value).decode("utf-8", "replace")
                )
    if buffer.startswith(b"data:"):
        data.append(buffer[5:].strip().decode("utf-8", "replace"))
    if data:
        yield time.perf_counter(), "\n".join(data)


def _carries_token(choice: Any, api: str) -> bool:
    """Whether a streamed choice delivers a generated token.

    Its text may be empty: vLLM streams one event per token, and a token that ends inside a
    multi-byte character has no text yet. Not a token: a chat stream's role announcement,
    nor an empty event that only closes the choice (``finish_reason`` set).
    """
    if not isinstance(choice, dict):
        return False
    if api == "completions":
        texts = [choice.get("text")]
    else:
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return False
        texts = [delta.get(k) for k in ("content", "reasoning_content", "reasoning")]
        if "role" in delta and not any(texts):
            return False
    texts = [t for t in texts if isinstance(t, str)]
    return bool(texts) and (any(texts) or choice.get("finish_reason") is None)


def _error_message(doc: Any, fallback: str) -> str:
    """The message of an OpenAI-style error body (``{"error": {"message": ...}}``, vLLM's
    ``{"message": ...}``, FastAPI's ``{"detail": ...}``, or text), on one line."""
    error = doc.get("error", doc) if isinstance(doc, dict) else doc
    if isinstance(error, dict):
        error = error.get("message") or error.get("detail")
    return " ".join(str(error or fallback).split())[:200]


class Client:
    """Streams completions from one server; a failed request is a :class:`Sample` error."""

    def __init__(
        self,
        root: str,
        api: str,
        model: str,
        *,
        timeout: float,
        connections: int,
        api_key: str | None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        path = "/v1/completions" if api == "completions" else "/v1/chat/completions"
        self.endpoint = root + path
        self.api = api
        self.model = model
        self.timeout = timeout
        # vLLM, SGLang and llama.cpp honour these; the probe drops them if the server objects.
        self.ask_exact_length = True
        headers = {**(headers or {})}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=min(timeout, 10.0)),
            connector=aiohttp.TCPConnector(limit=connections),
            headers=headers,
        )

    async def close(self) -> None:
        await self._session.close()

    def body(self, prompt_input: Mapping[str, Any], output_tokens: int) -> dict[str, Any]:
        body = {
            "model": self.model,
            **prompt_input,
            "max_tokens": output_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.ask_exact_length:
            body.update(ignore_eos=True, min_tokens=output_tokens)
        return body

    async def probe(self, prompt_input: Mapping[str, Any]) -> Sample:
        """One short request that must succeed; drops ``ignore_eos``/``min_tokens`` if they
        are what the server rejects. Raises SweepError with the server's answer."""
        sample = await self.stream(prompt_input, PROBE_OUTPUT_TOKENS)
        if sample.status in (400, 422) and self.ask_exact_length:
            self.ask_exact_length = False
            retry = await self.stream(prompt_input, PROBE_OUTPUT_TOKENS)
            if retry.ok:
                return retry
            self.ask_exact_length = True
        if not sample.ok:
            raise SweepError(f"probe request to {redact_url(self.endpoint)} failed: {sample.error}")
        return sample

    async def stream(
        self,
        prompt_input: Mapping[str, Any],
        output_tokens: int,
        headers: Mapping[str, str] | None = None,
    ) -> Sample:
        """One streamed completion, timed; ``headers`` are this request's own, beside the
        client's (the canary's ``traceparent``)."""
        body = self.body(prompt_input, output_tokens)
        where = redact_url(self.endpoint)
        start = time.perf_counter()
        try:
            return await self._stream(body, start, headers)
        except StreamError as exc:
            return Sample(error=str(exc), kind="bad_stream")
        except asyncio.TimeoutError:
            return Sample(error=f"no complete answer within {self.timeout:g} s", kind="timeout")
        except aiohttp.ClientConnectorError as exc:
            return Sample(error=f"cannot connect to {where}: {exc.os_error}", kind="connect_error")
        except aiohttp.ClientPayloadError:
            return Sample(error=f"response from {where} cut short", kind="bad_stream")
        except (aiohttp.ClientError, OSError) as exc:
            error = f"{type(exc).__name__} from {where}: {exc}"
            return Sample(error=error, kind="connect_error")

    async def _stream(
        self, body: dict[str, Any], start: float, headers: Mapping[str, str] | None = None
    ) -> Sample:
        first = last = math.nan
        gaps: list[float] = []
        events = 0
        usage: dict[str, Any] = {}
        post = self._session.post(self.endpoint, json=body, headers=headers, allow_redirects=False)
        async with post as resp:
            if 300 <= resp.status < 400:  # never followed: the next host would get our headers
                error = redirect_cause(self.endpoint, resp.status, resp.headers.get("Location"))
                return Sample(error=error, kind="http_error", status=resp.status)
            if resp.status != 200:
                raw = await resp.content.read(4096)
                try:
                    detail = _error_message(json.loads(raw), resp.reason or "")
                except ValueError:
                    detail = _error_message(raw.decode("utf-8", "replace"), resp.reason or "")
                error = f"HTTP {resp.status}: {detail}"
                return Sample(error=error, kind="http_error", status=resp.status)
            async for when, data in sse_data(resp.content):
                if data == "[DONE]":
                    break
                try:
                    doc = json.loads(data)
                except ValueError:
                    return Sample(error=f"malformed SSE data: {data[:60]!r}", kind="bad_stream")
                if not isinstance(doc, dict):
                    return Sample(error=f"unexpected SSE data: {data[:60]!r}", kind="bad_stream")
                if "error" in doc:
                    error = f"error event: {_error_message(doc, 'no message')}"
                    return Sample(error=error, kind="bad_stream")
                if isinstance(doc.get("usage"), dict):
                    usage = doc["usage"]
                choices = doc.get("choices")
                if isinstance(choices, list) and any(_carries_token(c, self.api) for c in choices):
                    if events:
                        gaps.append(when - last)
                    else:
                        first = when
                    last = when
                    events += 1
            end = time.perf_counter()
        if not events:
            return Sample(error="the stream carried no token", kind="bad_stream")
        prompt_tokens = usage.get("prompt_tokens")
        output_tokens = usage.get("completion_tokens")
        return Sample(
            ttft=first - start,
            gaps=tuple(gaps),
            e2e=end - start,
            prompt_tokens=prompt_tokens if isinstance(prompt_tokens, int) else None,
            output_tokens=output_tokens if isinstance(output_tokens, int) else events,
        )
