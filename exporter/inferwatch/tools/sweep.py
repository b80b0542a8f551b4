"""``inferwatch baseline``: a load sweep against an OpenAI-compatible server.

For every cell of concurrency x prompt tokens x output tokens, ``N`` streamed requests
(``--requests-per-cell``, default ``max(8, 2 x concurrency)``) are sent by ``concurrency``
workers, each starting its next request the moment its last one ends, so the load is
constant. Per request, on the client (``time.perf_counter``):

- **TTFT**: from sending the request to the arrival of the first SSE event that delivers a
  token (completions ``text``, chat ``delta.content`` or reasoning text, possibly empty: a
  token that ends inside a multi-byte character streams as ""; a chat stream's role
  announcement and a bare ``finish_reason`` event do not count);
- **ITL**: the gaps between successive token events, pooled over the cell's requests
  (events that arrive in one network read share a timestamp; their gap is 0, as the client
  saw it: a server that streams faster than its API process or the client keeps up with,
  such as a tiny model on a busy CPU, delivers bursts, and ITL p50 reads 0);
- **e2e**: from sending to the end of the stream (``[DONE]``).

A request that fails (HTTP status, connection, timeout, an error event, a stream without a
token) counts as an error of its cell and never stops the sweep.

**Prompt length.** Prompts are built locally from a word list, each a different shuffle of
it repeated, behind a tag unique to the run, cell and request (``{seed}.{cell}.{request}``):
any two prompts part within their first few tokens, inside the first KV-cache block, so
the server's prefix cache cannot serve one prompt from another's blocks; the default seed
is fresh each run, so a rerun does not hit the cache the last one left. A word-level
tokenizer never merges across words, so a
full pass of the word list costs a fixed number of tokens: two probe requests of one and
two passes, read from the server's ``usage.prompt_tokens``, give the tokens per pass and
the fixed tokens the API adds (BOS, chat template), and every prompt gets the word count
that hits its token target. ``--prompts FILE.jsonl`` sends real prompts instead (cell
``prompt_tokens`` 0 then marks "not controlled"). ``ignore_eos`` and ``min_tokens`` ask for
exactly ``--output-tokens`` tokens; a server that rejects them is asked without.

**Server-side TTFT and ITL** for the same window: the TTFT and inter-token latency
histograms of ``--metrics-url`` (the server's own ``/metrics``, or inferwatch's) are scraped
before and after each cell; after a cell they are re-read for up to :data:`SETTLE_SECONDS`
until the TTFT histogram has counted every request that streamed a token (a sidecar's page
lags by one poll). The window's p50/p95/p99 follow PromQL's ``histogram_quantile``, exactly
as the alert rules read the same histograms (``inferwatch calibrate`` derives the rules'
thresholds from them); ``gap`` = client TTFT p50 - server TTFT p50 is what the
server's histogram does not see: network, HTTP, tokenization, detokenization, SSE. Other
traffic to the server during the sweep lands in the windows too.

Sample of the table it prints (vLLM 0.32, the tiny test model on 2 busy CPU cores)::

    conc  prompt  output  TTFT p50  TTFT p95  server p50   gap  ITL p50  ITL p95  e2e p95  req/s  tok/s  errors
       1      64      32      53.2     265.5        31.4  21.8      4.0     25.2    526.1    3.0   97.5       0
       1     256      32      65.9      69.3        66.7  -0.8      7.5     20.8    305.8    3.5  110.7       0
       4      64      32     110.9     150.3        86.7  24.2      9.7     27.2    435.5   10.1  324.4       0
       4     256      32     155.5     404.3       100.0  55.5      0.0     53.6    710.3    7.3  234.4       0
    (latencies in ms; server p50: the server's TTFT histogram over the cell's window; gap = TTFT p50 - server p50)

A negative gap is the histogram's resolution: the server p50 is interpolated inside a
bucket (vLLM's run 0.06-0.08-0.1-0.25 s), the client p50 is exact.

Exit status: 0, or 3 when ``--previous`` is given and a cell regressed (TTFT p95 or ITL
p95 above ``--regression-factor`` x the previous, or every request of a cell failed); the
file is written either way. 1 when the sweep cannot run (the probe fails) or no cell got a
single answer; 2 for bad input.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import random
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

import aiohttp

from inferwatch import __version__
from inferwatch.baseline import Baseline, Cell, Quantiles, to_yaml
from inferwatch.baseline import load as load_baseline
from inferwatch.collect.backends import Backend, detect, feed
from inferwatch.collect.textparse import parse_labels, scan
from inferwatch.collect.upstream import Upstream, UpstreamError, redact_url
from inferwatch.method.heuristics import spec_from_config
from inferwatch.method.quantile import histogram_quantile, increase, sample_quantile
from inferwatch.model import Histogram
from inferwatch.settings import (
    ConfigError,
    Option,
    bounded_float,
    existing_file,
    http_url,
    positive_float,
    positive_int,
    resolve,
)

EXIT_FAILED = 1
EXIT_REGRESSION = 3

# A sidecar polls the server (0.5 s by default); the server records a request's TTFT when
# its first token leaves the engine. Both are caught up well within this.
SETTLE_SECONDS = 5.0
METRICS_TIMEOUT = 5.0
METRICS_MAX_BYTES = 16 * 1024 * 1024
# One SSE line and one streamed response: far above what a chunk or a long answer needs.
MAX_LINE_BYTES = 1024 * 1024
MAX_STREAM_BYTES = 64 * 1024 * 1024
PROBE_OUTPUT_TOKENS = 2
# Without usage in the stream, prompt lengths are estimated at this (English BPE ~1.3).
FALLBACK_TOKENS_PER_WORD = 1.3

# Distinct everyday words; a prompt repeats shuffles of the list.
WORDS = (
    "time", "river", "light", "paper", "garden", "window", "music", "stone", "market",
    "winter", "cloud", "bridge", "number", "forest", "letter", "engine", "silver", "morning",
    "island", "table", "yellow", "harbor", "planet", "button", "circle", "doctor", "family",
    "summer", "kitchen", "pocket", "thunder", "valley",
)  # fmt: skip


def _int_list(minimum: int) -> Callable[[str], tuple[int, ...]]:
    def parse(text: str) -> tuple[int, ...]:
        values = []
        for item in text.split(","):
            try:
                value = positive_int(item.strip())
            except ValueError as exc:
                raise ValueError(f"{text!r}: {exc}") from None
            if value < minimum:
                raise ValueError(f"{text!r}: {value} is below the minimum of {minimum}")
            if value in values:
                raise ValueError(f"{text!r} lists {value} twice")
            values.append(value)
        return tuple(values)

    return parse


def _name(text: str) -> str:
    if not text:
        raise ValueError("must not be empty")
    return text


def new_file(text: str) -> Path:
    path = Path(text)
    if not path.parent.is_dir():
        raise ValueError(f"{text}: directory {path.parent} does not exist")
    if path.is_dir():
        raise ValueError(f"{text} is a directory")
    return path


OPTIONS = (
    Option("--url", http_url, None, "OpenAI-compatible server base URL (required)", metavar="URL"),
    Option("--model", _name, None, "model name to request (required)", metavar="NAME"),
    Option("--out", new_file, None, "baseline file to write (required)", metavar="FILE"),
    Option("--api", str, "completions", "completions or chat", choices=("completions", "chat")),
    Option("--concurrency", _int_list(1), "1,4,16", "concurrency levels", metavar="N,N"),
    Option(
        "--prompt-tokens",
        _int_list(1),
        None,
        "prompt lengths in tokens (default: 128,1024; not with --prompts)",
        metavar="N,N",
    ),
    # ITL needs two tokens at least.
    Option("--output-tokens", _int_list(2), "64,256", "output lengths in tokens", metavar="N,N"),
    Option(
        "--requests-per-cell",
        positive_int,
        None,
        "requests per cell (default: max(8, 2 x concurrency))",
        metavar="N",
    ),
    Option(
        "--prompts",
        existing_file,
        None,
        "JSONL of real prompts, one object per line with `prompt` or `messages`",
        metavar="FILE",
    ),
    Option(
        "--metrics-url",
        http_url,
        None,
        "metrics page for the server-side TTFT (default: URL/metrics; inferwatch's works too)",
        metavar="URL",
    ),
    Option("--gpu-name", _name, "unknown", "GPU recorded in the file's metadata", metavar="NAME"),
    Option(
        "--previous",
        existing_file,
        None,
        "earlier baseline to mark regressions against",
        metavar="FILE",
    ),
    Option(
        "--regression-factor",
        bounded_float(1, 1000),
        None,
        "a cell regressed when its TTFT or ITL p95 exceeds this x the previous "
        "(default: the thresholds' regression_factor, 1.5)",
        metavar="X",
    ),
    Option("--request-timeout", positive_float, 300.0, "seconds one request may take", metavar="S"),
    Option(
        "--seed",
        positive_int,
        None,
        "seed of the generated prompts (default: a fresh one, recorded in the file)",
        metavar="N",
    ),
    Option(
        "--api-key", _name, None, "bearer token for the API (prefer the env var)", metavar="KEY"
    ),
)
REQUIRED = ("url", "model", "out")
DEFAULT_PROMPT_TOKENS = "128,1024"


class SweepError(Exception):
    """The sweep cannot run; ``str()`` is one line."""


# --- prompts -------------------------------------------------------------------------------


def load_prompts(path: Path, api: str) -> tuple[dict[str, Any], ...]:
    """The request inputs of a JSONL file: ``{"prompt": ...}`` or ``{"messages": [...]}``.

    One JSON object per line with a string ``prompt`` or a ``messages`` list of
    ``{role, content}`` strings; blank lines are skipped. With ``--api chat`` a ``prompt``
    becomes one user message; ``messages`` need ``--api chat``. ConfigError names the line.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
    inputs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            inputs.append(_prompt_input(line, api))
        except ValueError as exc:
            raise ConfigError(f"{path} line {number}: {exc}") from None
    if not inputs:
        raise ConfigError(f"{path}: no prompts")
    return tuple(inputs)


def _prompt_input(line: str, api: str) -> dict[str, Any]:
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    if not isinstance(doc, dict):
        raise ValueError("expected a JSON object")
    if ("prompt" in doc) == ("messages" in doc):
        raise ValueError("needs exactly one of 'prompt' and 'messages'")
    if "prompt" in doc:
        if not isinstance(doc["prompt"], str) or not doc["prompt"]:
            raise ValueError("'prompt' must be a non-empty string")
        if api == "chat":
            return {"messages": [{"role": "user", "content": doc["prompt"]}]}
        return {"prompt": doc["prompt"]}
    if api != "chat":
        raise ValueError("'messages' need --api chat")
    messages = doc["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    for i, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            raise ValueError(f"messages[{i}] must have string 'role' and 'content'")
    return {"messages": [{"role": m["role"], "content": m["content"]} for m in messages]}


def _tagged(tag: str, prompt_input: Mapping[str, Any]) -> dict[str, Any]:
    """The input with ``tag`` in front of its text (the first message's, for chat)."""
    if "prompt" in prompt_input:
        return {"prompt": f"{tag} {prompt_input['prompt']}"}
    first, *rest = prompt_input["messages"]
    return {"messages": [{**first, "content": f"{tag} {first['content']}"}, *rest]}


def _words(seed: str, count: int) -> str:
    """``count`` words: shuffles of :data:`WORDS`, one after the other, seeded."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < count:
        batch = list(WORDS)
        rng.shuffle(batch)
        out.extend(batch)
    return " ".join(out[:count])


@dataclass(frozen=True)
class Calibration:
    """Prompt tokens as the server counts them: ``fixed + per_word x words``."""

    fixed: float
    per_word: float

    def words_for(self, tokens: int) -> int:
        return max(1, round((tokens - self.fixed) / self.per_word))


@dataclass(frozen=True)
class Prompts:
    """The input of every request: generated to a token length, or the file's in turn."""

    api: str
    seed: int
    calibration: Calibration | None = None
    file: tuple[dict[str, Any], ...] = ()

    def generated(self, tag: str, words: int) -> dict[str, Any]:
        text = _words(tag, words)
        if self.api == "chat":
            return _tagged(tag, {"messages": [{"role": "user", "content": text}]})
        return _tagged(tag, {"prompt": text})

    def tag(self, cell: int, index: int) -> str:
        return f"{self.seed}.{cell}.{index}"

    def for_request(self, cell: int, index: int, prompt_tokens: int) -> dict[str, Any]:
        tag = self.tag(cell, index)
        if self.file:
            return _tagged(tag, self.file[index % len(self.file)])
        assert self.calibration is not None
        return self.generated(tag, self.calibration.words_for(prompt_tokens))


# --- one streamed request ------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One request as the client saw it; ``error`` is empty when it succeeded."""

    error: str = ""
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
    ) -> None:
        path = "/v1/completions" if api == "completions" else "/v1/chat/completions"
        self.endpoint = root + path
        self.api = api
        self.model = model
        self.timeout = timeout
        # vLLM, SGLang and llama.cpp honour these; the probe drops them if the server objects.
        self.ask_exact_length = True
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
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

    async def stream(self, prompt_input: Mapping[str, Any], output_tokens: int) -> Sample:
        body = self.body(prompt_input, output_tokens)
        where = redact_url(self.endpoint)
        start = time.perf_counter()
        try:
            return await self._stream(body, start)
        except StreamError as exc:
            return Sample(error=str(exc))
        except asyncio.TimeoutError:
            return Sample(error=f"no complete answer within {self.timeout:g} s")
        except aiohttp.ClientConnectorError as exc:
            return Sample(error=f"cannot connect to {where}: {exc.os_error}")
        except aiohttp.ClientPayloadError:
            return Sample(error=f"response from {where} cut short")
        except (aiohttp.ClientError, OSError) as exc:
            return Sample(error=f"{type(exc).__name__} from {where}: {exc}")

    async def _stream(self, body: dict[str, Any], start: float) -> Sample:
        first = last = math.nan
        gaps: list[float] = []
        events = 0
        usage: dict[str, Any] = {}
        async with self._session.post(self.endpoint, json=body) as resp:
            if resp.status != 200:
                raw = await resp.content.read(4096)
                try:
                    detail = _error_message(json.loads(raw), resp.reason or "")
                except ValueError:
                    detail = _error_message(raw.decode("utf-8", "replace"), resp.reason or "")
                return Sample(error=f"HTTP {resp.status}: {detail}", status=resp.status)
            async for when, data in sse_data(resp.content):
                if data == "[DONE]":
                    break
                try:
                    doc = json.loads(data)
                except ValueError:
                    return Sample(error=f"malformed SSE data: {data[:60]!r}")
                if not isinstance(doc, dict):
                    return Sample(error=f"unexpected SSE data: {data[:60]!r}")
                if "error" in doc:
                    return Sample(error=f"error event: {_error_message(doc, 'no message')}")
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
            return Sample(error="the stream carried no token")
        prompt_tokens = usage.get("prompt_tokens")
        output_tokens = usage.get("completion_tokens")
        return Sample(
            ttft=first - start,
            gaps=tuple(gaps),
            e2e=end - start,
            prompt_tokens=prompt_tokens if isinstance(prompt_tokens, int) else None,
            output_tokens=output_tokens if isinstance(output_tokens, int) else events,
        )


# --- the server's latency histograms ------------------------------------------------------

TTFT = "time_to_first_token_seconds"
ITL = "inter_token_latency_seconds"
SERVER_HISTOGRAMS = (TTFT, ITL)

# inferwatch's own page (``--metrics-url`` at the sidecar) holds the histograms already
# mapped onto the contract; this backend reads it like any server's page.
INFERWATCH_PAGE = Backend(
    name="inferwatch",
    signature=("inferwatch_",),
    labels={"model": "model", "engine": "engine"},
    feeds=tuple(feed(name, f"inferwatch_{name}") for name in SERVER_HISTOGRAMS),
)

Histograms = dict[str, Histogram]  # histogram name -> the model's histogram


class ServerHistograms:
    """The server's TTFT and inter-token latency histograms for ``model``, from a metrics page.

    The page is recognised once (a server's own page via :func:`inferwatch.collect.backends.detect`,
    or inferwatch's); ``backend`` and ``version`` name the server for the file's metadata.
    A page of no use at the start (unreadable, unknown, no TTFT histogram for the model)
    leaves the server side out of the whole sweep, ``problem`` saying why; a failed read
    later leaves out only its cell. A server without an ITL histogram gives TTFT alone.
    """

    def __init__(self, metrics_url: str, root: str, model: str, note: Callable[[str], None]):
        self._page = Upstream(metrics_url, timeout=METRICS_TIMEOUT, max_bytes=METRICS_MAX_BYTES)
        self._root = Upstream(root, timeout=METRICS_TIMEOUT, max_bytes=METRICS_MAX_BYTES)
        self._url = redact_url(metrics_url)
        self._model = model
        self._note = note
        self._backend: Backend | None = None
        self.backend = "unknown"
        self.version = ""
        self.problem = ""

    async def close(self) -> None:
        await self._page.close()
        await self._root.close()

    async def start(self) -> Histograms | None:
        """Recognise the page and name the server; the histograms now."""
        try:
            text = await self._page.get_exposition("/metrics")
            if INFERWATCH_PAGE.recognises(text):
                self._backend = INFERWATCH_PAGE
                self.backend, self.version = self._sidecar_info(text)
            else:
                self._backend = detect(text)
                self.backend = self._backend.name
                if self._backend.version_path:
                    self.version = await self._root.get_json_field(
                        self._backend.version_path, self._backend.version_field
                    )
            now = self._histograms(text)
        except (UpstreamError, ValueError) as exc:
            self.problem = f"no server-side TTFT: {self._url}: {exc}"
            now = None
        if not now and not self.problem:
            self.problem = f"no server-side TTFT: no TTFT histogram of {self._model} on {self._url}"
        if self.problem:
            self._backend = None
            return None
        return now

    def _sidecar_info(self, text: str) -> tuple[str, str]:
        """(backend, version) from inferwatch's ``inferwatch_backend_info``."""
        name = "inferwatch_backend_info"
        infos = [
            dict(parse_labels(labels)) for labels, _ in scan(text, {name}).samples.get(name, [])
        ]
        ours = [i for i in infos if i.get("model") == self._model] or infos or [{}]
        return ours[0].get("backend", "unknown"), ours[0].get("version", "")

    def _histograms(self, text: str) -> Histograms:
        """The model's histograms on the page, each summed over engines (a page without
        model labels: all of it); empty without a TTFT histogram. Raises ValueError for a
        page to reject."""
        assert self._backend is not None
        out = {}
        histograms = self._backend.normalize(text).histograms
        for name in SERVER_HISTOGRAMS:
            series = histograms.get(name) or {}
            mine = [h for labels, h in series.items() if dict(labels).get("model") == self._model]
            chosen = mine or list(series.values())
            if chosen:
                out[name] = functools.reduce(Histogram.merged, chosen)
        return out if TTFT in out else {}

    async def read(self) -> Histograms | None:
        """The histograms now; None when the server side is out or this read failed."""
        if self._backend is None:
            return None
        try:
            return self._histograms(await self._page.get_exposition("/metrics")) or None
        except (UpstreamError, ValueError) as exc:
            self._note(f"server-side latency left out of a cell: {self._url}: {exc}")
            return None

    async def window(
        self, before: Histograms | None, streamed: int
    ) -> tuple[Histograms | None, Histograms]:
        """(the histograms now, their increase since ``before``), once the TTFT histogram
        has counted the ``streamed`` requests of the window or :data:`SETTLE_SECONDS` have
        passed; the increase is empty when either read is missing."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            after = await self.read()
            if after is None or before is None:
                return after, {}
            window = {
                name: increase(before[name], after[name])
                for name in SERVER_HISTOGRAMS
                if name in before and name in after
            }
            if window[TTFT].count >= streamed or time.monotonic() >= deadline:
                return after, window
            await asyncio.sleep(0.1)


# --- cells ---------------------------------------------------------------------------------


def _quantiles(values: Sequence[float]) -> Quantiles:
    return Quantiles(*(round(sample_quantile(q, values), 6) for q in (0.5, 0.95, 0.99)))


@dataclass(frozen=True)
class CellResult:
    """What one cell measured: every request's sample, its wall time, the server window."""

    concurrency: int
    prompt_tokens: int
    output_tokens: int
    samples: tuple[Sample, ...]
    seconds: float
    server_windows: Mapping[str, Histogram] = field(default_factory=dict)

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.concurrency, self.prompt_tokens, self.output_tokens)

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.ok]

    @property
    def errors(self) -> list[Sample]:
        return [s for s in self.samples if not s.ok]

    @property
    def server_window(self) -> Histogram | None:
        """The server's TTFT histogram over the cell."""
        return self.server_windows.get(TTFT)

    def server_quantiles(self, name: str = TTFT) -> Quantiles | None:
        """p50/p95/p99 of one of the server's histograms over the cell, as PromQL's
        ``histogram_quantile`` reads it; None without it or without observations."""
        window = self.server_windows.get(name)
        if window is None:
            return None
        values = [histogram_quantile(q, window.buckets) for q in (0.5, 0.95, 0.99)]
        if any(math.isnan(v) for v in values):
            return None
        return Quantiles(*(round(v, 6) for v in values))

    def cell(self) -> Cell | None:
        """The baseline cell, or None when no request succeeded."""
        ok = self.ok
        if not ok:
            return None
        return Cell(
            concurrency=self.concurrency,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            requests=len(self.samples),
            errors=len(self.samples) - len(ok),
            ttft_seconds=_quantiles([s.ttft for s in ok]),
            itl_seconds=_quantiles([g for s in ok for g in s.gaps] or [0.0]),
            e2e_seconds=_quantiles([s.e2e for s in ok]),
            requests_per_second=round(len(ok) / self.seconds, 3),
            output_tokens_per_second=round(sum(s.output_tokens for s in ok) / self.seconds, 3),
            server_ttft_seconds=self.server_quantiles(TTFT),
            server_itl_seconds=self.server_quantiles(ITL),
        )

    def mean_prompt_tokens(self) -> float | None:
        counts = [s.prompt_tokens for s in self.ok if s.prompt_tokens is not None]
        return sum(counts) / len(counts) if counts else None


async def run_cell(
    client: Client,
    prompts: Prompts,
    key: tuple[int, int, int],
    cell_index: int,
    requests: int,
    on_request: Callable[[], None],
) -> tuple[tuple[Sample, ...], float]:
    """``requests`` requests by ``concurrency`` workers; (samples, wall seconds)."""
    concurrency, prompt_tokens, output_tokens = key
    samples: list[Sample] = [Sample()] * requests
    pending = iter(range(requests))

    async def worker() -> None:
        for index in pending:
            prompt_input = prompts.for_request(cell_index, index, prompt_tokens)
            samples[index] = await client.stream(prompt_input, output_tokens)
            on_request()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, requests))))
    return tuple(samples), time.perf_counter() - start


# --- the sweep -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """The sweep, validated from the options."""

    root: str
    model: str
    api: str
    concurrency: tuple[int, ...]
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    requests_per_cell: int | None
    metrics_url: str
    gpu_name: str
    request_timeout: float
    seed: int
    api_key: str | None = field(default=None, repr=False)
    prompts_file: Path | None = None
    file_prompts: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> Plan:
        root = values["url"].rstrip("/").removesuffix("/v1")
        prompts_file = values["prompts"]
        if prompts_file is not None and values["prompt_tokens"] is not None:
            raise ConfigError("--prompts replaces --prompt-tokens: give one of them")
        prompt_tokens = values["prompt_tokens"]
        if prompts_file is None and prompt_tokens is None:
            prompt_tokens = _int_list(1)(DEFAULT_PROMPT_TOKENS)
        return cls(
            root=root,
            model=values["model"],
            api=values["api"],
            concurrency=values["concurrency"],
            prompt_tokens=(0,) if prompts_file is not None else prompt_tokens,
            output_tokens=values["output_tokens"],
            requests_per_cell=values["requests_per_cell"],
            metrics_url=values["metrics_url"] or root + "/metrics",
            gpu_name=values["gpu_name"],
            request_timeout=values["request_timeout"],
            seed=values["seed"] or random.randrange(1, 1_000_000),
            api_key=values["api_key"],
            prompts_file=prompts_file,
            file_prompts=load_prompts(prompts_file, values["api"]) if prompts_file else (),
        )

    def keys(self) -> list[tuple[int, int, int]]:
        return [
            (c, p, o)
            for c in self.concurrency
            for p in self.prompt_tokens
            for o in self.output_tokens
        ]

    def requests_in(self, concurrency: int) -> int:
        return self.requests_per_cell or max(8, 2 * concurrency)


@dataclass(frozen=True)
class Sweep:
    metadata: Mapping[str, Any]
    results: tuple[CellResult, ...]

    def baseline(self) -> Baseline:
        cells = (r.cell() for r in self.results)
        return Baseline(metadata=self.metadata, cells=tuple(c for c in cells if c is not None))


async def _calibrate(
    client: Client, prompts: Prompts, probe_cell: int, note: Callable[[str], None]
) -> Prompts:
    """Prompts with the token calibration (see the module docstring). The probes are tagged
    like the requests of a cell, so their tags cost what the requests' tags do."""
    counts = []
    for passes in (1, 2):
        text = prompts.generated(prompts.tag(probe_cell, passes), passes * len(WORDS))
        counts.append((await client.probe(text)).prompt_tokens)
    if None in counts or counts[1] <= counts[0]:
        note(
            "the server reports no usable prompt token usage: prompt lengths are estimated at "
            f"{FALLBACK_TOKENS_PER_WORD} tokens per word"
        )
        calibration = Calibration(fixed=0.0, per_word=FALLBACK_TOKENS_PER_WORD)
    else:
        per_pass = counts[1] - counts[0]
        calibration = Calibration(fixed=counts[0] - per_pass, per_word=per_pass / len(WORDS))
    return Prompts(prompts.api, prompts.seed, calibration)


async def run(plan: Plan, progress: Progress) -> Sweep:
    """Probe, calibrate, then every cell in turn with its server-side window."""
    started = time.monotonic()
    date = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    client = Client(
        plan.root,
        plan.api,
        plan.model,
        timeout=plan.request_timeout,
        connections=max(plan.concurrency),
        api_key=plan.api_key,
    )
    server = ServerHistograms(plan.metrics_url, plan.root, plan.model, progress.note)
    bounds: dict[str, list[float]] = {}
    try:
        before = await server.start()
        for kind, name in (("ttft", TTFT), ("itl", ITL)):
            if before and name in before:
                bounds[kind] = [float(le) for le, _ in before[name].buckets if le != "+Inf"]
        prompts = Prompts(plan.api, plan.seed, file=plan.file_prompts)
        probe_cell = len(plan.keys())  # tagged as one more cell: no prefix shared with a request
        if plan.file_prompts:
            await client.probe(prompts.for_request(probe_cell, 0, 0))
            probes = 1
        else:
            prompts = await _calibrate(client, prompts, probe_cell, progress.note)
            probes = 2
        if not client.ask_exact_length:
            progress.note("the server rejects ignore_eos/min_tokens: outputs may end early")
        if server.problem:
            progress.note(server.problem)
        before, _ = await server.window(before, probes)
        results = []
        for index, key in enumerate(plan.keys()):
            requests = plan.requests_in(key[0])
            progress.start_cell(index, key, requests)
            samples, seconds = await run_cell(
                client, prompts, key, index, requests, progress.request_done
            )
            streamed = sum(s.streamed for s in samples)
            before, window = await server.window(before, streamed)
            result = CellResult(*key, samples, seconds, window)
            results.append(result)
            progress.end_cell(result)
    finally:
        await client.close()
        await server.close()
    metadata: dict[str, Any] = {
        "date": date,
        "backend": server.backend,
        "version": server.version,
        "model": plan.model,
        "gpu": plan.gpu_name,
        "api": plan.api,
        "url": redact_url(plan.root),
        "metrics_url": redact_url(plan.metrics_url),
        "prompts": str(plan.prompts_file) if plan.prompts_file else "generated",
        "seed": plan.seed,
        "inferwatch": __version__,
        "duration_seconds": round(time.monotonic() - started, 1),
    }
    if bounds:  # where an objective's latency bound can go (see calibrate)
        metadata["server_bucket_bounds"] = bounds
    if prompts.calibration is not None:
        metadata["prompt_calibration"] = {
            "fixed_tokens": round(prompts.calibration.fixed, 2),
            "tokens_per_word": round(prompts.calibration.per_word, 3),
        }
    return Sweep(metadata, tuple(results))


# --- output --------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 1000:.1f}"


class Progress:
    """Progress on stderr: a bar redrawn in place on a terminal, a line per cell otherwise."""

    def __init__(self, stream: TextIO, plan: Plan) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        keys = plan.keys()
        self.cells = len(keys)
        self.total = sum(plan.requests_in(concurrency) for concurrency, _, _ in keys)
        self.done = 0
        self.cell = ""
        self._drawn = 0.0

    def start_cell(self, index: int, key: tuple[int, int, int], requests: int) -> None:
        c, p, o = key
        self.cell = (
            f"cell {index + 1}/{self.cells}: concurrency {c}, prompt {p or 'file'}, output {o}"
        )
        self._draw(force=True)

    def request_done(self) -> None:
        self.done += 1
        self._draw()

    def end_cell(self, result: CellResult) -> None:
        if not self.tty:
            ttft = _ms(sample_quantile(0.5, [s.ttft for s in result.ok]))
            self.stream.write(
                f"{self.cell}: {len(result.ok)}/{len(result.samples)} ok, TTFT p50 {ttft} ms, "
                f"{result.seconds:.1f} s\n"
            )
            self.stream.flush()
        if result.errors:
            self.note(f"{len(result.errors)} errors, the first: {result.errors[0].error}")
        target, mean = result.prompt_tokens, result.mean_prompt_tokens()
        if target and mean is not None and abs(mean - target) > max(8, 0.1 * target):
            self.note(f"prompts averaged {mean:.0f} tokens for a target of {target}")

    def note(self, message: str) -> None:
        if self.tty and self._drawn:
            self.stream.write("\r\x1b[K")
        self.stream.write(f"inferwatch: {message}\n")
        if self.tty and self._drawn:
            self._draw(force=True)
        self.stream.flush()

    def _draw(self, force: bool = False) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if not force and now - self._drawn < 0.1:
            return
        self._drawn = now
        filled = int(24 * self.done / max(self.total, 1))
        bar = "#" * filled + "." * (24 - filled)
        self.stream.write(f"\r\x1b[K[{bar}] {self.done}/{self.total} requests  {self.cell}")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()


def regressions(
    results: Sequence[CellResult], previous: Baseline, factor: float
) -> dict[tuple[int, int, int], str]:
    """Per cell measured before: what regressed ("" when nothing did)."""
    before = {c.key: c for c in previous.cells}
    marks = {}
    for result in results:
        old = before.get(result.key)
        if old is None:
            continue
        new = result.cell()
        if new is None:
            marks[result.key] = "every request failed"
            continue
        worse = [
            f"{name} p95 x{now.p95 / then.p95:.2f}"
            for name, now, then in (
                ("TTFT", new.ttft_seconds, old.ttft_seconds),
                ("ITL", new.itl_seconds, old.itl_seconds),
            )
            if then.p95 > 0 and now.p95 > factor * then.p95
        ]
        marks[result.key] = ", ".join(worse)
    return marks


LEGEND = (
    "(latencies in ms; server p50: the server's TTFT histogram over the cell's window; "
    "gap = TTFT p50 - server p50)"
)


def table(results: Sequence[CellResult], marks: Mapping[tuple[int, int, int], str] | None) -> str:
    """The readable table: one row per cell, latencies in ms (see the module docstring)."""
    header = [
        "conc", "prompt", "output", "TTFT p50", "TTFT p95", "server p50", "gap",
        "ITL p50", "ITL p95", "e2e p95", "req/s", "tok/s", "errors",
    ]  # fmt: skip
    if marks is not None:
        header.append("vs previous")
    rows = []
    for r in results:
        cell = r.cell()
        server = cell.server_ttft_seconds if cell else None
        mean = r.mean_prompt_tokens()
        prompt = str(r.prompt_tokens) if r.prompt_tokens else f"~{mean:.0f}" if mean else "file"
        row = [str(r.concurrency), prompt, str(r.output_tokens)]
        if cell is None:
            row += ["-"] * 9
        else:
            gap = cell.ttft_seconds.p50 - server.p50 if server else None
            row += [
                _ms(cell.ttft_seconds.p50),
                _ms(cell.ttft_seconds.p95),
                _ms(server.p50 if server else None),
                _ms(gap),
                _ms(cell.itl_seconds.p50),
                _ms(cell.itl_seconds.p95),
                _ms(cell.e2e_seconds.p95),
                f"{cell.requests_per_second:.1f}",
                f"{cell.output_tokens_per_second:.1f}",
            ]
        row.append(str(len(r.errors)))
        if marks is not None:
            mark = marks.get(r.key)
            row.append("new" if mark is None else f"REGRESSED {mark}" if mark else "ok")
        rows.append(row)
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


class SweepFailed(Exception):
    """The sweep ended without a baseline; ``code`` is the exit status (already reported)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def plan_from(values: Mapping[str, Any]) -> Plan:
    """The plan from resolved option values; ConfigError when a required one is missing."""
    for option in OPTIONS:
        if option.key in REQUIRED and option.key in values and values[option.key] is None:
            raise ConfigError(f"{option.flag} is required (or {option.env})")
    return Plan.from_values(values)


def measure(
    plan: Plan, previous: Baseline | None = None, factor: float = 1.5
) -> tuple[Sweep, dict[tuple[int, int, int], str]]:
    """Run the sweep with progress on stderr and print its table; (the sweep, what
    regressed against ``previous`` per cell). SweepFailed when it cannot run or no cell got
    an answer."""
    progress = Progress(sys.stderr, plan)
    try:
        sweep = asyncio.run(run(plan, progress))
    except SweepError as exc:
        progress.close()
        print(f"inferwatch: error: {exc}", file=sys.stderr)
        raise SweepFailed(EXIT_FAILED) from None
    except KeyboardInterrupt:
        progress.close()
        print("inferwatch: interrupted; nothing written", file=sys.stderr)
        raise SweepFailed(130) from None
    progress.close()
    marks = regressions(sweep.results, previous, factor) if previous else None
    print(table(sweep.results, marks))
    print(LEGEND)
    if not sweep.baseline().cells:
        first = next(s.error for r in sweep.results for s in r.errors)
        print(f"inferwatch: error: every request failed (first: {first})", file=sys.stderr)
        raise SweepFailed(EXIT_FAILED)
    return sweep, marks or {}


def write_file(path: Path, text: str) -> None:
    """Replace ``path`` only once the whole file is written."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def main(flags: Mapping[str, Any], config: Mapping[str, Any]) -> int:
    """``inferwatch baseline``; returns the exit status (ConfigError for bad input)."""
    values = resolve(OPTIONS, flags, {})
    plan = plan_from(values)
    previous = load_baseline(values["previous"]) if values["previous"] else None
    factor = values["regression_factor"] or spec_from_config(config).t("regression_factor")
    try:
        sweep, marks = measure(plan, previous, factor)
    except SweepFailed as failed:
        return failed.code
    write_file(values["out"], to_yaml(sweep.baseline()))
    print(f"inferwatch: wrote {values['out']}", file=sys.stderr)
    regressed = [key for key, mark in marks.items() if mark]
    if regressed:
        print(
            f"inferwatch: {len(regressed)} of {len(sweep.results)} cells regressed against "
            f"{values['previous']} (factor {factor:g})",
            file=sys.stderr,
        )
        return EXIT_REGRESSION
    return 0
