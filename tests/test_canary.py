"""The canary against a fake OpenAI server on loopback that streams SSE with set delays, one
that is down, one that hangs and one that streams garbage; then once against a real vLLM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import socket
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from test_exposition import full_snapshot

from demo.stack import Inferwatch, Proxy, VllmServer, metric_value
from inferwatch.collect.canary import (
    MARKER_USER,
    Canary,
    CanarySettings,
    TtftGap,
    server_ttft,
)
from inferwatch.metrics import CANARY_RESULTS
from inferwatch.model import BackendSample, Histogram
from inferwatch.serve.command import OPTIONS, ServeConfig
from inferwatch.serve.exposition import render, render_openmetrics
from inferwatch.serve.sidecar import make_app, run_canary
from inferwatch.settings import resolve

from conftest import TGI_PAGE, fixture_text, page_value

CAPTURE = fixture_text("vllm-0.32.0-cpu-loaded-kv-full.prom")
TINY = {"backend": "vllm", "model": "tiny"}


@dataclass
class Fake:
    """An OpenAI-compatible server: ``mode`` ok (TTFT, then a token every ``itl``), 500,
    garbage, html or hang (one token, then SSE comments until the client hangs up)."""

    mode: str = "ok"
    ttft: float = 0.05
    itl: float = 0.01
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    canary: Canary | None = None
    in_flight_seen: list[int] = field(default_factory=list)  # the canary's, at each arrival
    url: str = ""
    page: str = CAPTURE  # its /metrics

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        if self.canary is not None:
            self.in_flight_seen.append(self.canary.in_flight)
        if self.mode == "500":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        if self.mode == "html":
            return web.Response(text="<html>It works!</html>", content_type="text/html")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if self.mode == "garbage":
            await resp.write(b"data: {not json\n\n")
            return resp
        await asyncio.sleep(self.ttft)
        tokens = 1 if self.mode == "hang" else body["max_tokens"]
        for i in range(tokens):
            if i:
                await asyncio.sleep(self.itl)
            choice = {"delta": {"content": f"t{i}"}} if "messages" in body else {"text": f"t{i}"}
            chunk = {"choices": [{"index": 0, **choice, "finish_reason": None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        while self.mode == "hang":  # a write to a closed connection raises: the client left
            await asyncio.sleep(0.02)
            await resp.write(b": still thinking\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.page, content_type="text/plain")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_get("/metrics", self.metrics)
        return app


@pytest.fixture
async def fake(aiohttp_server) -> Fake:
    server = Fake()
    running = await aiohttp_server(server.app())
    server.url = str(running.make_url("")).rstrip("/")
    return server


@pytest.fixture
async def canary_for():
    made: list[Canary] = []

    def make(url: str, **settings: Any) -> Canary:
        made.append(Canary(CanarySettings(url, **{"model": "m", **settings})))
        return made[-1]

    yield make
    for canary in made:
        await canary.close()


class Sleeps:
    """Stands in for asyncio.sleep in the probe loop: records the delays asked for, waits
    none, and lets the test wait for the n-th."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self._changed = asyncio.Condition()

    async def __call__(self, delay: float) -> None:
        async with self._changed:
            self.delays.append(delay)
            self._changed.notify_all()
        await asyncio.sleep(0)

    async def wait_for(self, n: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.delays) >= n)


async def run_until(canary: Canary, sleeps: Sleeps, probes: int) -> None:
    """Runs the probe loop until it has finished ``probes`` probes, then stops it."""
    canary._sleep = sleeps
    task = asyncio.create_task(canary.run())
    try:
        await sleeps.wait_for(probes)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_a_probe_measures_ttft_gaps_and_e2e_and_carries_the_marker(
    fake: Fake, canary_for
) -> None:
    canary = canary_for(fake.url, output_tokens=4, prompt_tokens=5)
    sample = await canary.probe_once()
    assert sample is not None and sample.ok, sample
    assert sample.ttft >= fake.ttft
    # One gap a token after the first; a gap is two arrivals apart, and the first of them
    # can arrive late on a busy machine, so only the whole is bounded by the server's sleeps.
    assert len(sample.gaps) == 3 and min(sample.gaps) > 0
    assert sample.e2e >= fake.ttft + 3 * fake.itl
    assert sample.e2e >= sample.ttft + sum(sample.gaps)
    body = fake.bodies[0]
    assert body["user"] == MARKER_USER and body["model"] == "m" and body["max_tokens"] == 4
    assert body["stream"] is True and len(body["prompt"].split()) == 5
    assert fake.headers[0]["X-Inferwatch-Canary"] == "1"
    counted = canary.sample(0.0, None)
    assert counted.ttft.count == 1 and counted.ttft.sum == sample.ttft
    assert counted.itl.count == 3 and counted.e2e.count == 1
    # TTFT >= 50 ms: nothing at or under the 0.025 and 0.05 bounds but what lands on 0.05.
    assert dict(counted.ttft.buckets)["0.025"] == 0 and dict(counted.ttft.buckets)["+Inf"] == 1
    assert dict(counted.itl.buckets)["0.005"] == 0 and dict(counted.itl.buckets)["+Inf"] == 3
    assert dict(counted.probes) == {r: float(r == "ok") for r in CANARY_RESULTS}
    assert counted.ttft_gap_seconds is None  # no server page to compare with


async def test_each_probe_has_its_own_trace_id_and_is_its_buckets_exemplar(
    fake: Fake, canary_for
) -> None:
    # A sampled W3C traceparent per probe (a tracing server records the probe under it),
    # and that trace id on the canary's buckets where the probe landed, on the OpenMetrics
    # page only: a slow canary bucket leads to its probe.
    canary = canary_for(fake.url, output_tokens=3)
    first, second = await canary.probe_once(), await canary.probe_once()
    assert first is not None and second is not None and first.ok and second.ok
    parents = [h["traceparent"] for h in fake.headers]
    assert all(re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", p) for p in parents), parents
    traces = [p.split("-")[1] for p in parents]
    assert len(set(traces)) == 2
    snap = replace(
        full_snapshot("vllm-0.32.0-cpu-loaded-kv-full.prom"),
        sources={"canary": canary.sample(0.0, None)},
    )
    on_page = {
        (s.name, s.labels["le"]): s.exemplar
        for family in parse_openmetrics(render_openmetrics(snap).decode())
        if family.name.startswith("inferwatch_canary_")
        for s in family.samples
        if s.exemplar is not None
    }
    ttft = {k: e for k, e in on_page.items() if "first_token" in k[0]}
    # Both first tokens took >= 50 ms: the later probe is the exemplar of the bucket of each.
    for (_, le), exemplar in ttft.items():
        assert exemplar.labels["trace_id"] in traces and exemplar.value <= float(le)
    latest = {e.labels["trace_id"] for e in ttft.values()}
    assert traces[1] in latest and latest <= set(traces)
    assert {k[0] for k in on_page} == {
        "inferwatch_canary_time_to_first_token_seconds_bucket",
        "inferwatch_canary_inter_token_latency_seconds_bucket",
        "inferwatch_canary_request_duration_seconds_bucket",
    }
    assert " # {" not in render(snap).decode()  # the text format has none


async def test_chat_api_sends_messages(fake: Fake, canary_for) -> None:
    canary = canary_for(fake.url, api="chat", output_tokens=2)
    sample = await canary.probe_once()
    assert sample is not None and sample.ok, sample
    assert fake.bodies[0]["messages"][0]["role"] == "user"
    assert fake.bodies[0]["user"] == MARKER_USER


@pytest.mark.parametrize(
    ("mode", "result"), [("500", "http_error"), ("garbage", "bad_stream"), ("html", "bad_stream")]
)
async def test_failed_probes_are_counted_by_result(
    fake: Fake, canary_for, mode: str, result: str
) -> None:
    fake.mode = mode
    canary = canary_for(fake.url)
    sample = await canary.probe_once()
    assert sample is not None and not sample.ok
    counted = canary.sample(0.0, None)
    assert dict(counted.probes) == {r: float(r == result) for r in CANARY_RESULTS}
    assert counted.ttft.count == 0 and counted.e2e.count == 0


async def test_server_down_backs_off_and_metrics_stay_served(
    fake: Fake, canary_for, poller_for, aiohttp_client, caplog: pytest.LogCaptureFixture
) -> None:
    canary = canary_for(closed_port_url(), interval=1.0, max_backoff=8.0)
    sleeps = Sleeps()
    await run_until(canary, sleeps, 6)
    # Doubling after each failure, capped; one log line for the kind, not one per probe.
    assert sleeps.delays[:6] == [2.0, 4.0, 8.0, 8.0, 8.0, 8.0]
    assert sum("canary probe failing" in r.getMessage() for r in caplog.records) == 1
    probes = canary.sample(0.0, None).probes
    assert probes["connect_error"] == len(sleeps.delays) and probes["ok"] == 0

    poller = poller_for(fake.url)  # the backend's /metrics is up, its API is not reached
    poller.register("canary", canary)
    client = await aiohttp_client(make_app(poller, run_poller=False))
    await poller.poll_once()
    page = await (await client.get("/metrics")).text()
    assert page_value(page, "inferwatch_backend_up", backend="vllm") == 1.0
    assert page_value(page, "inferwatch_requests_waiting", engine="0", **TINY) == 20.0
    where = {**TINY, "model": "m"}
    connect = page_value(page, "inferwatch_canary_probes_total", result="connect_error", **where)
    assert connect == probes["connect_error"]
    assert page_value(page, "inferwatch_canary_time_to_first_token_seconds_count", **where) == 0
    assert "inferwatch_canary_ttft_gap_seconds" not in page


async def test_recovery_resets_the_backoff(fake: Fake, canary_for) -> None:
    fake.mode = "500"
    canary = canary_for(fake.url, interval=1.0, max_backoff=8.0)
    await run_until(canary, sleeps := Sleeps(), 2)
    fake.mode = "ok"
    await run_until(canary, more := Sleeps(), 1)
    assert sleeps.delays[:2] == [2.0, 4.0] and more.delays[0] == 1.0


async def test_a_server_back_up_ends_the_backoff_at_once(fake: Fake, canary_for) -> None:
    fake.mode = "500"
    canary = canary_for(fake.url, interval=30.0, max_backoff=600.0)
    task = asyncio.create_task(canary.run())
    try:
        while canary.sample(0.0, None).probes["http_error"] < 1:  # the server is down
            await asyncio.sleep(0.01)
        fake.mode = "ok"  # ...and back: the next poll reads its page
        canary.sample(1.0, ttft_backend(10, 10, 10))
        async with asyncio.timeout(5):  # not the 60 s the backoff asked for
            while canary.sample(2.0, ttft_backend(10, 10, 10)).probes["ok"] < 1:
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_hanging_stream_times_out_with_one_probe_in_flight(fake: Fake, canary_for) -> None:
    fake.mode = "hang"
    canary = canary_for(fake.url, timeout=0.3, interval=0.01, max_backoff=0.01)
    fake.canary = canary
    sleeps = Sleeps()
    await run_until(canary, sleeps, 3)
    probes = canary.sample(0.0, None).probes
    assert probes["timeout"] == len(sleeps.delays) >= 3
    assert probes["ok"] == 0
    assert fake.in_flight_seen and set(fake.in_flight_seen) == {1}
    assert canary.in_flight == 0


def ttft_backend(under_10ms: float, under_100ms: float, total: float) -> BackendSample:
    """A server page whose TTFT histogram holds these cumulative counts (two engines)."""

    def engine(share: float) -> Histogram:
        counts = (under_10ms * share, under_100ms * share, total * share)
        return Histogram(tuple(zip(("0.01", "0.1", "+Inf"), counts, strict=True)), 0.0, counts[2])

    engines = {(("engine", "0"),): engine(0.75), (("engine", "1"),): engine(0.25)}
    return BackendSample("vllm", "tiny", histograms={"time_to_first_token_seconds": engines})


def test_ttft_gap_compares_medians_over_the_same_window() -> None:
    gap = TtftGap(window=10.0)
    server = server_ttft
    assert gap.update(0.0, (), server(ttft_backend(100, 100, 100))) is None  # nothing new yet
    # 3 probes, median 0.3 s (a 0.9 s tail does not move it); the server's 4 new first tokens
    # in (0.01, 0.1]: median 0.055 s, as histogram_quantile reads it.
    five = gap.update(5.0, (0.3, 0.2, 0.9), server(ttft_backend(100, 104, 104)))
    assert five == pytest.approx(0.3 - 0.055)
    # At 20 s what came before 5 s is out of the window: 1 probe, 2 first tokens under 10 ms.
    twenty = gap.update(20.0, (0.5,), server(ttft_backend(102, 106, 106)))
    assert twenty == pytest.approx(0.5 - 0.005)
    assert gap.update(21.0, (0.7,), None) is None  # no server page: no gap
    # The server restarted (its count went back): start afresh.
    assert gap.update(22.0, (), server(ttft_backend(0, 0, 0))) is None
    assert gap.update(23.0, (0.4,), server(ttft_backend(1, 1, 1))) == pytest.approx(0.4 - 0.005)
    assert server(BackendSample("vllm", "tiny")) is None
    merged = server(ttft_backend(4, 8, 8))
    assert merged is not None and merged.buckets == (("0.01", 4.0), ("0.1", 8.0), ("+Inf", 8.0))


async def test_model_comes_from_the_backend_and_series_render(fake: Fake, canary_for) -> None:
    canary = canary_for(fake.url, model=None, gap_window=60.0)
    assert await canary.probe_once() is None and fake.bodies == []  # no model known yet
    canary.sample(0.0, ttft_backend(10, 10, 10))
    sample = await canary.probe_once()
    assert sample is not None and sample.ok and fake.bodies[0]["model"] == "tiny"
    counted = canary.sample(1.0, ttft_backend(12, 12, 12))  # two first tokens under 10 ms
    assert counted.ttft_gap_seconds == pytest.approx(sample.ttft - 0.005)
    snap = replace(
        full_snapshot("vllm-0.32.0-cpu-loaded-kv-full.prom"), sources={"canary": counted}
    )
    page = render(snap).decode()
    gap = page_value(page, "inferwatch_canary_ttft_gap_seconds", **TINY)
    assert gap == counted.ttft_gap_seconds
    names = {f.name for f in parse_openmetrics(render_openmetrics(snap).decode())}
    assert "inferwatch_canary_time_to_first_token_seconds" in names
    assert "inferwatch_canary_probes" in names
    without = render(replace(snap, sources={})).decode()
    assert "inferwatch_canary" not in without  # rendered only when the canary is on


def test_options_default_to_the_backend_origin_and_auto() -> None:
    flags = {"backend_url": "http://10.0.0.5:8000/metrics"}
    auto = ServeConfig.from_values(resolve(OPTIONS, flags, {}, {})).canary_settings()
    assert auto is not None and auto.only_without_ttft
    env = {"INFERWATCH_CANARY": "on", "INFERWATCH_CANARY_API": "chat"}
    on = ServeConfig.from_values(resolve(OPTIONS, flags, {}, env)).canary_settings()
    assert on is not None and on.url == "http://10.0.0.5:8000" and on.api == "chat"
    assert on.interval == 15.0 and on.model is None and not on.only_without_ttft
    off = {"INFERWATCH_CANARY": "off"}
    assert ServeConfig.from_values(resolve(OPTIONS, flags, {}, off)).canary_settings() is None


ROUTER_PAGE = fixture_text("vllm-router-0.1.17.prom")


@pytest.mark.parametrize(
    ("page", "probes"), [(TGI_PAGE, True), (CAPTURE, False), (ROUTER_PAGE, False)]
)
async def test_canary_auto_probes_a_server_without_ttft_only(
    fake: Fake, poller_for, page: str, probes: bool
) -> None:
    # TGI has no TTFT histogram: the canary's first token is the only one there is. vLLM
    # measures its own: auto leaves it alone, and no canary series is served. A router is
    # read on its metrics port, where there is no inference API to probe.
    fake.page = page
    poller = poller_for(fake.url, backend=None)  # --backend auto
    settings = CanarySettings(fake.url, model="m", interval=0.05, only_without_ttft=True)
    task = asyncio.create_task(run_canary(settings, poller))
    try:
        await poller.poll_once()
        deadline = time.monotonic() + 10.0
        while probes and not fake.bodies and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # a canary that was to stay off has had its chance
        await poller.poll_once()
        assert bool(fake.bodies) is probes
        assert ("canary" in poller.snapshot.sources) is probes
        assert task.done() is not probes  # off: it has returned, nothing left running
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_bearer_token_file_is_read(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    flags = {"canary": "on", "canary_bearer_token_file": token}
    settings = ServeConfig.from_values(resolve(OPTIONS, flags, {}, {})).canary_settings()
    assert settings is not None and settings.api_key == "s3cret"
    assert "s3cret" not in repr(settings)


# --- a real vLLM on CPU -----------------------------------------------------------------

GIVE_UP = 300.0  # a guard against a hang, not a bound on how fast anything must be


@pytest.mark.vllm
def test_real_vllm_canary_fills_ttft_and_shows_the_gap(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    vllm_server.ensure_running()
    args = ["--poll-interval", "0.5", "--canary", "on", "--canary-interval", "0.5"]
    sidecar = Inferwatch(tmp_path, vllm_server.url, args).start()
    try:
        deadline = time.monotonic() + GIVE_UP
        page = sidecar.page()
        while (
            metric_value(page, "inferwatch_canary_time_to_first_token_seconds_count") < 5
            or "inferwatch_canary_ttft_gap_seconds{" not in page
        ):
            assert time.monotonic() < deadline, "the canary never filled its TTFT histogram"
            time.sleep(0.1)
            page = sidecar.page()
    finally:
        sidecar.stop()
    where = {"backend": "vllm", "model": "tiny"}
    count = page_value(page, "inferwatch_canary_time_to_first_token_seconds_count", **where)
    mean = page_value(page, "inferwatch_canary_time_to_first_token_seconds_sum", **where) / count
    gap = page_value(page, "inferwatch_canary_ttft_gap_seconds", **where)
    assert page_value(page, "inferwatch_canary_probes_total", result="ok", **where) >= count
    assert page_value(page, "inferwatch_backend_up", backend="vllm") == 1.0
    assert math.isfinite(gap) and mean > 0
    print(f"canary TTFT mean {mean * 1000:.1f} ms over {count:g} probes, gap {gap * 1000:.1f} ms")


DELAY = 0.2  # what the proxy adds before the server sees a request (the example)


def gap_over_a_fresh_window(sidecar: Inferwatch, window: float) -> float:
    """The gap once a whole window has passed since now: the mean of three readings."""
    time.sleep(window + 1.0)
    readings = []
    for _ in range(3):
        readings.append(sidecar.metric("inferwatch_canary_ttft_gap_seconds"))
        time.sleep(1.0)
    return sum(readings) / len(readings)


@pytest.mark.vllm
def test_a_delay_in_front_of_the_server_is_measured_as_the_gap(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    vllm_server.ensure_running()
    window = 10.0
    config = tmp_path / "inferwatch.yaml"
    config.write_text(
        f"alerting:\n  rate_window: {window:g}s\n  evaluation_interval: 1s\n"
        "canary: 'on'\ncanary_interval: 0.5\npoll_interval: 0.25\n"
    )
    proxy = Proxy(tmp_path, vllm_server.url).start()
    sidecar = Inferwatch(
        tmp_path, vllm_server.url, ["--config", str(config), "--canary-url", proxy.url]
    ).start()
    try:
        before = gap_over_a_fresh_window(sidecar, window)
        proxy.set_fault(delay=DELAY)
        during = gap_over_a_fresh_window(sidecar, window)
    finally:
        sidecar.stop()
        proxy.stop()
    measured = during - before
    print(
        f"client gap {before * 1000:.1f} ms, with {DELAY * 1000:.0f} ms injected "
        f"{during * 1000:.1f} ms: measured {measured * 1000:.1f} ms "
        f"({(measured / DELAY - 1) * 100:+.1f} %)"
    )
    assert abs(measured - DELAY) <= 0.1 * DELAY


async def test_backoff_stays_within_half_the_gap_window(canary_for) -> None:
    canary = canary_for(closed_port_url(), interval=1.0, max_backoff=120.0, gap_window=15.0)
    await run_until(canary, sleeps := Sleeps(), 6)
    # Two probes per window at least: the failure ratio stays defined while the server fails.
    assert sleeps.delays[:6] == [2.0, 4.0, 7.5, 7.5, 7.5, 7.5]
