"""The OTLP/HTTP trace receiver, ``POST /v1/traces`` (``--otlp-traces on``).

An inference server that traces its requests (vLLM's ``--otlp-traces-endpoint``) sends its
spans here, or an OpenTelemetry Collector fans them out to here and to a tracing backend.
Of each ``ExportTraceServiceRequest`` only the servers' request spans (:data:`REQUEST_SPAN`)
are read, into :class:`~inferwatch.serve.slow_requests.SlowRequests` and
:class:`~inferwatch.serve.exemplars.Exemplars`; every other span (vLLM's start-up spans) is
ignored, and nothing of a body is kept.

Bounded like every route: a body is read up to ``max_bytes`` (413 past it, decompressed bytes
counted), in protobuf (``application/x-protobuf``) or OTLP's JSON (``application/json``, ids in
hex) only (415 otherwise), at most :data:`BODIES_AT_ONCE` at once (503 with ``Retry-After``,
which OTLP exporters retry); a body that does not decode is 400 with one line saying why. A
success is 200 and an empty ``ExportTraceServiceResponse`` in the request's encoding, as the
OTLP/HTTP specification asks. Bodies over :data:`INLINE_BYTES` are decoded off the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import hdrs, web
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from inferwatch.serve.slow_requests import Request

PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MEDIA_TYPES = frozenset({PROTOBUF, JSON})
REQUEST_SPAN = "llm_request"  # vLLM's span of one request, kind SERVER
DEFAULT_MAX_BYTES = 4 << 20
# Bodies read and decoded at once; an exporter sends its batches one after another.
BODIES_AT_ONCE = 4
# Bodies bigger than this are decoded in a worker thread, so that /metrics and /healthz keep
# answering meanwhile (protobuf's JSON mapping is pure Python, many times protobuf's cost).
INLINE_BYTES = 32 << 10
_CHUNK = 64 << 10
# The span attributes read, by the field of Request they fill.
SECONDS = {
    "ttft": "gen_ai.latency.time_to_first_token",
    "queue": "gen_ai.latency.time_in_queue",
    "prefill": "gen_ai.latency.time_in_model_prefill",
    "decode": "gen_ai.latency.time_in_model_decode",
    "e2e": "gen_ai.latency.e2e",
}
TOKENS = {
    "prompt_tokens": "gen_ai.usage.prompt_tokens",
    "output_tokens": "gen_ai.usage.completion_tokens",
}
REQUEST_ID = "gen_ai.request.id"
# The most characters of a request id kept (vLLM's: the client's X-Request-Id and a suffix):
# the server, or whoever reaches the route, chooses its length.
REQUEST_ID_CHARS = 128


class RequestSink(Protocol):
    """What takes in the finished requests of each body received."""

    def add(self, requests: Iterable[Request]) -> None: ...


_SINKS = web.AppKey("otlp_sinks", tuple)
_MAX_BYTES = web.AppKey("otlp_max_bytes", int)
_SLOTS = web.AppKey("otlp_slots", list)


@dataclass(frozen=True)
class OtlpSettings:
    """``--otlp-traces on``'s: the slowest requests kept of each kind, the largest body."""

    most: int
    max_bytes: int = DEFAULT_MAX_BYTES


class Malformed(ValueError):
    """A body that does not decode as an ExportTraceServiceRequest."""


def install(
    app: web.Application, sinks: tuple[RequestSink, ...], max_bytes: int = DEFAULT_MAX_BYTES
) -> None:
    """Add ``POST /v1/traces`` to ``app``, feeding each of ``sinks``."""
    app[_SINKS] = sinks
    app[_MAX_BYTES] = max_bytes
    app[_SLOTS] = [0]
    app.router.add_post(PATH, receive_traces)


def _one_line(status: int, reason: str) -> web.Response:
    return web.Response(status=status, text=reason + "\n")


async def receive_traces(request: web.Request) -> web.Response:
    media = request.headers.get(hdrs.CONTENT_TYPE, "").partition(";")[0].strip().lower()
    if media not in MEDIA_TYPES:
        return _one_line(415, f"{PATH} takes {PROTOBUF} or {JSON}")
    most = request.app[_MAX_BYTES]
    if request.content_length is not None and request.content_length > most:
        return _one_line(413, f"body of {request.content_length} bytes: at most {most}")
    slots = request.app[_SLOTS]
    if slots[0] >= BODIES_AT_ONCE:
        return web.Response(
            status=503,
            text=f"{BODIES_AT_ONCE} bodies already in hand\n",
            headers={"Retry-After": "1"},
        )
    slots[0] += 1
    try:
        body = await _read(request, most)
        if body is None:
            return _one_line(413, f"body over {most} bytes")
        try:
            if len(body) > INLINE_BYTES:
                requests = await asyncio.to_thread(decode, body, media)
            else:
                requests = decode(body, media)
        except Malformed as exc:
            return _one_line(400, f"not an OTLP ExportTraceServiceRequest: {exc}")
    finally:
        slots[0] -= 1
    for sink in request.app[_SINKS]:
        sink.add(requests)
    if media == JSON:
        return web.Response(body=b"{}", content_type=JSON)
    answer = ExportTraceServiceResponse().SerializeToString()
    return web.Response(body=answer, content_type=PROTOBUF)


async def _read(request: web.Request, most: int) -> bytes | None:
    """The body (decompressed, as aiohttp hands it), or None once it passes ``most`` bytes."""
    chunks, held = [], 0
    while chunk := await request.content.read(_CHUNK):
        held += len(chunk)
        if held > most:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def decode(body: bytes, media: str) -> list[Request]:
    """The request spans of an ExportTraceServiceRequest; Malformed when it is none."""
    message = ExportTraceServiceRequest()
    if media == PROTOBUF:
        try:
            message.ParseFromString(body)
        except (DecodeError, RecursionError) as exc:
            raise Malformed(f"protobuf: {str(exc) or 'does not parse'}") from None
    else:
        try:
            doc = json.loads(body)
            _hex_ids_to_base64(doc)
            json_format.ParseDict(doc, message, ignore_unknown_fields=True)
        except (
            json_format.ParseError,
            ValueError,
            TypeError,
            AttributeError,
            RecursionError,
        ) as exc:
            raise Malformed(f"JSON: {_first_line(exc)}") from None
    return [request_of(span) for span in _spans(message) if span.name == REQUEST_SPAN]


def _first_line(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


def _spans(message: ExportTraceServiceRequest) -> Iterator[Span]:
    for resource_spans in message.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            yield from scope_spans.spans


def _hex_ids_to_base64(doc: Any) -> None:
    """OTLP JSON writes trace and span ids in hex; protobuf's JSON mapping reads bytes as
    base64: rewrite each id of each span (and of its links) in place."""
    if not isinstance(doc, dict):
        raise ValueError("the body is not a JSON object")
    for resource_spans in doc.get("resourceSpans") or ():
        for scope_spans in resource_spans.get("scopeSpans") or ():
            for span in scope_spans.get("spans") or ():
                _hex_fields(span, ("traceId", "spanId", "parentSpanId"))
                for link in span.get("links") or ():
                    _hex_fields(link, ("traceId", "spanId"))


def _hex_fields(item: Any, names: tuple[str, ...]) -> None:
    if not isinstance(item, dict):
        raise ValueError("a span is not a JSON object")
    for name in names:
        value = item.get(name)
        if value is None or value == "":
            continue
        try:
            item[name] = base64.b64encode(bytes.fromhex(value)).decode()
        except (ValueError, TypeError):
            raise ValueError(f"{name} is not hex") from None


def _number(value: AnyValue) -> float | None:
    kind = value.WhichOneof("value")
    if kind not in ("double_value", "int_value"):
        return None
    number = float(getattr(value, kind))
    return number if math.isfinite(number) and number >= 0 else None


def request_of(span: Span) -> Request:
    """A request span's values; an attribute missing, or not a number >= 0, is None."""
    attrs = {a.key: a.value for a in span.attributes}
    seconds = {
        field: _number(attrs[key]) if key in attrs else None for field, key in SECONDS.items()
    }
    tokens = {}
    for field, key in TOKENS.items():
        value = _number(attrs[key]) if key in attrs else None
        tokens[field] = int(value) if value is not None and value.is_integer() else None
    rid = attrs.get(REQUEST_ID)
    trace = span.trace_id.hex() if any(span.trace_id) else None
    return Request(
        trace_id=trace,
        request_id=rid.string_value[:REQUEST_ID_CHARS]
        if rid is not None and rid.string_value
        else None,
        finished=span.end_time_unix_nano / 1e9 if span.end_time_unix_nano else None,
        **seconds,
        **tokens,
    )
