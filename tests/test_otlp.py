"""The OTLP/HTTP trace receiver (``POST /v1/traces``) and the slowest requests of the window,
from a real vLLM 0.32 ``llm_request`` span (tests/fixtures/vllm-0.32.0-cpu-llm_request-span.json)."""

from __future__ import annotations

import asyncio
import base64
import copy
import gzip
import json
import random
from pathlib import Path
from unittest.mock import ANY

import bcrypt
import pytest
from aiohttp import web
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from demo.stack import chromium
from inferwatch.collect.backends import VLLM
from inferwatch.collect.poller import Poller, PollSettings
from inferwatch.collect.upstream import Upstream
from inferwatch.method.alerts import ALERTS
from inferwatch.method.findings import Finding, fmt
from inferwatch.serve.basic_auth import BasicAuthUsers
from inferwatch.serve.otlp import REQUEST_ID_CHARS, OtlpSettings
from inferwatch.serve.sidecar import make_app
from inferwatch.serve.slow_requests import SLICES, Request, SlowRequests, spans_say
from inferwatch.serve.webconfig import WebConfig
from inferwatch.tools import diagnose
from inferwatch.tools.report import render, report_json

FIXTURE = json.loads(
    (Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu-llm_request-span.json").read_text()
)
DECODED = FIXTURE["decoded"]
ATTRS = DECODED["attrs"]
PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}
# What vLLM sends before its first request: its start-up spans, 13 in the run captured.
STARTUP = ["Load weights", *(["Warmup (CPU)"] * 12)]

# The request as the verdict must list it: the span's own values, nothing computed but the
# time per output token after the first, and which phase was the longest.
EXPECTED = {
    "trace_id": DECODED["trace"],
    "request_id": "cmpl-direct-tp-1-0",
    "ttft_seconds": ATTRS["gen_ai.latency.time_to_first_token"],
    "queue_seconds": ATTRS["gen_ai.latency.time_in_queue"],
    "prefill_seconds": ATTRS["gen_ai.latency.time_in_model_prefill"],
    "decode_seconds": ATTRS["gen_ai.latency.time_in_model_decode"],
    "e2e_seconds": ATTRS["gen_ai.latency.e2e"],
    "per_token_seconds": (0.03655648231506348 - 0.006859540939331055) / 15,
    "prompt_tokens": 18,
    "output_tokens": 16,
    "finished": 1796474390081807881 / 1e9,
    "ttft_dominated_by": "prefill",  # 30 us in the queue, 4.5 ms of prefill
    "dominated_by": "decode",
}


def request_span() -> Span:
    return json_format.ParseDict(FIXTURE["otlp_json_span"], Span())


def export_request(*spans: Span, startup: bool = True) -> ExportTraceServiceRequest:
    """An ExportTraceServiceRequest as vLLM's exporter batches it: one resource, one scope."""
    message = ExportTraceServiceRequest()
    resource_spans = message.resource_spans.add()
    for key, value in DECODED["res"].items():
        attr = resource_spans.resource.attributes.add()
        attr.key, attr.value.string_value = key, value
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = DECODED["scope"]
    for name in STARTUP if startup else ():
        scope_spans.spans.add(name=name, trace_id=bytes(range(16)), span_id=bytes(8))
    scope_spans.spans.extend(spans)
    return message


def otlp_json(message: ExportTraceServiceRequest) -> bytes:
    """The OTLP JSON encoding: protobuf's JSON mapping, but trace and span ids in hex."""
    doc = json_format.MessageToDict(message)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(doc).encode()


@pytest.fixture
async def exporter(aiohttp_client):
    """make_client(**make_app kwargs): an exporter (never polling) over a closed port."""
    upstream = Upstream("http://127.0.0.1:9", timeout=1.0, max_bytes=1 << 20)
    poller = Poller(upstream, VLLM, None, PollSettings(interval=0.2))

    async def client(**kwargs):
        return await aiohttp_client(make_app(poller, run_poller=False, **kwargs))

    yield client
    await upstream.close()


ON = OtlpSettings(most=5)


async def slow_requests(client, **kwargs) -> dict:
    answer = await client.get("/verdict.json", **kwargs)
    assert answer.status == 200
    return (await answer.json())["slow_requests"]


async def test_protobuf_from_vllm_lists_the_request(exporter) -> None:
    client = await exporter(otlp=ON)
    body = export_request(request_span()).SerializeToString()
    answer = await client.post("/v1/traces", data=body, headers=PROTOBUF)
    assert answer.status == 200, await answer.text()
    assert answer.headers["Content-Type"] == "application/x-protobuf"
    ExportTraceServiceResponse().ParseFromString(await answer.read())  # an empty one
    doc = await slow_requests(client)
    assert doc["ttft"] == [EXPECTED] and doc["per_token"] == [EXPECTED]
    assert doc["received"] == 1  # the 13 start-up spans are not requests
    assert doc["summary"][0] == (
        "none of the 1 slowest first tokens spent over 80 % of their TTFT in the queue or "
        "in prefill"
    )


async def test_otlp_json_with_hex_ids_lists_the_same_request(exporter) -> None:
    client = await exporter(otlp=ON)
    body = otlp_json(export_request(request_span()))
    assert DECODED["trace"].encode() in body  # hex on the wire, as OTLP JSON has it
    answer = await client.post("/v1/traces", data=body, headers=JSON)
    assert answer.status == 200, await answer.text()
    assert await answer.json() == {}
    assert (await slow_requests(client))["ttft"] == [EXPECTED]


async def test_gzip_is_bounded_decompressed(exporter) -> None:
    client = await exporter(otlp=OtlpSettings(most=5, max_bytes=20_000))
    body = export_request(request_span()).SerializeToString()
    headers = {**PROTOBUF, "Content-Encoding": "gzip"}
    answer = await client.post("/v1/traces", data=gzip.compress(body), headers=headers)
    assert answer.status == 200, await answer.text()
    assert (await slow_requests(client))["ttft"] == [EXPECTED]
    bomb = gzip.compress(body + bytes(1 << 20))  # about 1 KiB on the wire
    assert len(bomb) < 20_000
    answer = await client.post("/v1/traces", data=bomb, headers=headers)
    assert answer.status == 413


async def test_missing_attributes_are_absent_not_zero(exporter) -> None:
    client = await exporter(otlp=ON)
    span = request_span()
    keep = {"gen_ai.latency.time_to_first_token", "gen_ai.request.id"}
    kept = [a for a in span.attributes if a.key in keep]
    del span.attributes[:]
    span.attributes.extend(kept)
    body = export_request(span, startup=False).SerializeToString()
    assert (await client.post("/v1/traces", data=body, headers=PROTOBUF)).status == 200
    doc = await slow_requests(client)
    assert doc["ttft"] == [
        {
            "trace_id": DECODED["trace"],
            "request_id": "cmpl-direct-tp-1-0",
            "ttft_seconds": ATTRS["gen_ai.latency.time_to_first_token"],
            "finished": EXPECTED["finished"],
        }
    ]
    assert doc["per_token"] == []  # no e2e, no token count: not ranked at all


async def test_a_long_request_id_is_cut(exporter) -> None:
    """The server chooses a request id's length (a client's X-Request-Id): kept bounded."""
    client = await exporter(otlp=ON)
    span = request_span()
    for attribute in span.attributes:
        if attribute.key == "gen_ai.request.id":
            attribute.value.string_value = "x" * 100_000
    body = export_request(span, startup=False).SerializeToString()
    assert (await client.post("/v1/traces", data=body, headers=PROTOBUF)).status == 200
    (kept,) = (await slow_requests(client))["ttft"]
    assert kept["request_id"] == "x" * REQUEST_ID_CHARS


async def test_bounds_and_refusals(exporter) -> None:
    client = await exporter(otlp=OtlpSettings(most=5, max_bytes=2000))
    big = export_request(*[request_span()] * 5).SerializeToString()
    assert len(big) > 2000
    answer = await client.post("/v1/traces", data=big, headers=PROTOBUF)
    assert answer.status == 413 and (await answer.text()).count("\n") == 1

    async def chunks():  # no Content-Length: refused once the bytes read pass the limit
        for _ in range(4):
            yield big[:1000]

    answer = await client.post("/v1/traces", data=chunks(), headers=PROTOBUF)
    assert answer.status == 413
    answer = await client.post("/v1/traces", data=b"x", headers={"Content-Type": "text/plain"})
    assert answer.status == 415
    for body, headers in (
        (b"\xff\xff\xff\xff", PROTOBUF),
        (b"{", JSON),
        (b"[]", JSON),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}', JSON),
    ):
        answer = await client.post("/v1/traces", data=body, headers=headers)
        text = await answer.text()
        assert answer.status == 400 and text.count("\n") == 1, (body, text)
        assert text.startswith("not an OTLP ExportTraceServiceRequest")
    assert (await slow_requests(client))["received"] == 0


async def test_off_by_default(exporter) -> None:
    client = await exporter()
    body = export_request(request_span()).SerializeToString()
    answer = await client.post("/v1/traces", data=body, headers=PROTOBUF)
    assert answer.status in (404, 405)
    assert (await slow_requests(client)) is None


async def test_auth_and_cross_site(exporter) -> None:
    users = BasicAuthUsers({"alice": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4))})
    client = await exporter(otlp=ON, web_config=WebConfig(users=users))
    body = export_request(request_span()).SerializeToString()
    assert (await client.post("/v1/traces", data=body, headers=PROTOBUF)).status == 401
    login = "Basic " + base64.b64encode(b"alice:s3cret").decode()
    cross = {**PROTOBUF, "Authorization": login, "Origin": "http://evil.example"}
    assert (await client.post("/v1/traces", data=body, headers=cross)).status == 403
    site = {**PROTOBUF, "Authorization": login, "Sec-Fetch-Site": "cross-site"}
    assert (await client.post("/v1/traces", data=body, headers=site)).status == 403
    ok = {**PROTOBUF, "Authorization": login}
    assert (await client.post("/v1/traces", data=body, headers=ok)).status == 200
    doc = await slow_requests(client, headers={"Authorization": login})
    assert doc["received"] == 1


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_bound_holds_under_many_spans() -> None:
    clock = Clock()
    slow = SlowRequests(300.0, 5, clock=clock)
    rng = random.Random(53)
    every: list[Request] = []
    for _ in range(300):  # a batch a second over the window, 200 requests each
        batch = [
            Request(request_id=str(len(every) + i), ttft=rng.random(), e2e=5.0, output_tokens=100)
            for i in range(200)
        ]
        every += batch
        slow.add(batch)
        clock.now += 1.0
        held = sum(len(h) for s in slow._slices for h in s.heaps.values())
        assert held <= 2 * 5 * (SLICES + 1)
    top = sorted(every, key=lambda r: r.ttft, reverse=True)[:5]
    assert slow.slowest("ttft") == top
    # Past the window and one slice, nothing is left.
    clock.now += 300.0 + 30.0 + 1.0
    assert slow.slowest("ttft") == [] and slow.slowest("per_token") == []


def test_a_queue_bound_summary() -> None:
    slow = SlowRequests(300.0, 5, clock=Clock())
    queued = [Request(ttft=1.0, queue=0.9, prefill=0.1, decode=2.0) for _ in range(3)]
    slow.add([*queued, Request(ttft=0.5, queue=0.1, prefill=0.4, decode=0.1)])
    assert slow.document()["summary"] == [
        "3 of the 4 slowest first tokens spent over 80 % of their TTFT in the queue"
    ]


def test_where_the_slowest_spent_their_time_confirms_or_contradicts_a_finding() -> None:
    """A stall's slowest tokens were spent in decode (its streams' steps); a queue's slowest
    first tokens waited in the queue: each finding reads its own list."""
    slow = SlowRequests(300.0, 5, clock=Clock())
    decoding = Request(ttft=0.1, queue=0.01, prefill=0.09, decode=3.0, e2e=3.1, output_tokens=10)
    queued = Request(ttft=4.0, queue=3.9, prefill=0.1, decode=1.0, e2e=5.0, output_tokens=2)
    slow.add([decoding] * 3 + [queued] * 2)
    stalls, queueing = ALERTS["InferencePrefillStallsDecode"], ALERTS["InferenceQueueingDelay"]
    assert spans_say(stalls, slow.document()) == {
        "agree": True,
        "text": "the spans agree: 3 of the 5 slowest per output token spent most of their "
        "time in decode",
    }
    assert spans_say(queueing, slow.document()) == {
        "agree": False,
        "text": "the spans disagree: 3 of the 5 slowest first tokens waited longest in prefill, "
        "not in the queue",
    }
    slow.add([queued] * 2)  # now 4 of the 5 slowest per token queued (1 s a token)
    assert spans_say(stalls, slow.document()) == {
        "agree": False,
        "text": "the spans disagree: 4 of the 5 slowest per output token spent most of their "
        "time in the queue, not in decode",
    }
    assert spans_say(queueing, slow.document())["agree"] is True
    assert spans_say(ALERTS["InferenceBackendDown"], slow.document()) is None


def with_request_id(span: Span, request_id: str) -> Span:
    changed = copy.deepcopy(span)
    for attr in changed.attributes:
        if attr.key == "gen_ai.request.id":
            attr.value.string_value = request_id
    return changed


# A measuring script after the page's own markup: the title says whether anything on it is
# wider than the window (the page itself runs no script, and its CSP would refuse one).
MEASURE = (
    "<script>document.title = document.documentElement.scrollWidth + ' of ' + innerWidth;</script>"
)


async def test_a_real_browser_renders_the_table(exporter, tmp_path: Path) -> None:
    client = await exporter(otlp=ON)
    span = request_span()
    hostile = with_request_id(span, "<img src=x onerror=alert(1)>")
    longest = with_request_id(span, "chatcmpl-" + "0123456789abcdef" * 12)
    body = export_request(span, hostile, longest).SerializeToString()
    assert (await client.post("/v1/traces", data=body, headers=PROTOBUF)).status == 200
    url = str(client.make_url("/"))
    dom = await asyncio.to_thread(chromium, "--dump-dom", url, profile=tmp_path / "profile")
    assert dom.returncode == 0, dom.stderr
    text = dom.stdout
    assert '<table data-slowest="ttft">' in text and '<table data-slowest="per_token">' in text
    assert (
        '<td class="id">cmpl-direct-tp-1-0</td><td class="id">0af7651916cd43dd8448eb211c80319c'
        "</td><td>6.9 ms</td>" in text
    )
    assert "&lt;img src=x onerror=alert(1)&gt;" in text and "<img" not in text
    # At 1,200 px, the longest request id the sidecar keeps wraps in its cell: every column
    # of the table is within the window, nothing runs past its right edge.
    async with client.get("/") as response:
        page = tmp_path / "verdict.html"
        page.write_text((await response.text()) + MEASURE)
    width = "--window-size=1200,1600"
    measured = await asyncio.to_thread(
        chromium, "--dump-dom", width, page.as_uri(), profile=tmp_path / "profile"
    )
    assert measured.returncode == 0, measured.stderr
    assert "<title>1200 of 1200</title>" in measured.stdout, measured.stdout[:300]
    shot = tmp_path / "slowest.png"
    taken = await asyncio.to_thread(
        chromium, f"--screenshot={shot}", width, str(client.make_url("/")), profile=tmp_path / "p"
    )
    assert taken.returncode == 0 and shot.read_bytes()[:4] == b"\x89PNG", taken.stderr
    print(f"slowest requests screenshot: {shot}")


# --- diagnose --exporter lists them ----------------------------------------------------------


async def test_diagnose_lists_the_slowest_requests_under_the_findings(exporter) -> None:
    """``diagnose --exporter`` reads the sidecar's slowest requests and says, under a finding
    that names where first tokens waited, whether the spans agree."""
    client = await exporter(otlp=ON)
    body = export_request(request_span()).SerializeToString()
    assert (await client.post("/v1/traces", data=body, headers=PROTOBUF)).status == 200
    url = str(client.make_url("")).rstrip("/")
    report = await diagnose.from_exporter(url, interval=0.1)
    assert report.slow_requests == await slow_requests(client)
    text = render(report)
    assert "slowest requests of the last 300 s, from the server's spans (1 received):" in text
    e = {k: fmt(v, "seconds") for k, v in EXPECTED.items() if k.endswith("_seconds")}
    assert (
        f"  by TTFT: cmpl-direct-tp-1-0 (trace {DECODED['trace']})  TTFT {e['ttft_seconds']}, "
        f"per token {e['per_token_seconds']}; queue {e['queue_seconds']}, prefill "
        f"{e['prefill_seconds']}, decode {e['decode_seconds']}; 18 prompt, 16 output tokens"
    ) in text
    # Under a finding that says where the first tokens waited: what their spans say.
    pod = {"backend": "vllm", "model": "tiny"}
    report.findings = [Finding(ALERTS["InferenceQueueingDelay"], pod)]
    assert (
        "         the spans disagree: 1 of the 1 slowest first tokens waited longest in "
        "prefill, not in the queue"
    ) in render(report)
    (finding,) = report_json(report)["findings"]
    assert finding["requests"] == {"agree": False, "text": ANY}
    assert report_json(report)["slow_requests"] == report.slow_requests


async def test_diagnose_takes_no_slowest_requests_it_cannot_read(aiohttp_server) -> None:
    """An exporter that serves no verdict, or slowest requests of another shape (numbers as
    text): no list, or n/a where a value is not a number; never a crash."""
    verdicts = iter(
        [
            web.Response(status=404),
            web.json_response({"slow_requests": {"ttft": "x", "per_token": []}}),
            web.json_response(
                {
                    "slow_requests": {
                        "window_seconds": "300",
                        "ttft": [{"request_id": "r", "ttft_seconds": "9"}],
                        "per_token": [],
                    }
                }
            ),
        ]
    )
    page = '# TYPE inferwatch_build_info gauge\ninferwatch_build_info{version="1"} 1\n'

    async def answer(request: web.Request) -> web.Response:
        if request.path == "/metrics":
            return web.Response(text=page, content_type="text/plain")
        return next(verdicts) if request.path == "/verdict.json" else web.Response(status=404)

    app = web.Application()
    app.router.add_get("/{path:.*}", answer)
    url = str((await aiohttp_server(app)).make_url("")).rstrip("/")
    assert (await diagnose.from_exporter(url, interval=0.01)).slow_requests is None
    assert (await diagnose.from_exporter(url, interval=0.01)).slow_requests is None
    report = await diagnose.from_exporter(url, interval=0.01)
    assert "  by TTFT: r (trace n/a)  TTFT n/a, per token n/a;" in render(report)
    assert "slowest requests of the last n/a" in render(report)
