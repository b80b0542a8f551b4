"""The load sweep against a fake OpenAI server on loopback that streams SSE with set delays.

The fake counts prompt tokens as ``FIXED_TOKENS + TOKENS_PER_WORD x words`` and observes its
own TTFT into a vLLM-style histogram on /metrics, so measurement, prompt-length control,
the server-side window, errors and the CLI are checked against known values.
"""

from __future__ import annotations

import asyncio
import gc
import io
import json
import math
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp
import pytest
import yaml
from aiohttp import web

from inferwatch.baseline import Baseline, Cell, Quantiles, load, parse, to_yaml
from inferwatch.calibration import thresholds_from
from inferwatch.capacity import Step
from inferwatch.cli import main
from inferwatch.collect import stream as client
from inferwatch.method.slo.config import slos_from_config
from inferwatch.method.slo.objectives import SLOs
from inferwatch.settings import ConfigError, resolve
from inferwatch.tools.sweep import cells, command, prompts, report, search

MODEL = "m"
FIXED_TOKENS = 3
TOKENS_PER_WORD = 2
BOUNDS = ("0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "+Inf")


@dataclass
class Behaviour:
    ttft: float = 0.01
    itl: float = 0.002
    fail_every: int = 0  # request i of a cell answers HTTP 500 when i % fail_every == 1
    error_event_every: int = 0  # ... sends an error event after its first token
    hang_every: int = 0  # ... sends nothing until the client hangs up
    reject_exact_length: bool = False
    usage: bool = True
    role_chunk: bool = True  # chat: a role announcement right away, before any token
    empty_tokens: bool = False  # every other token streams with empty text (partial UTF-8)
    metrics: str = "vllm"  # "vllm", "inferwatch" (the sidecar's page), "tgi" or "none"
    metrics_lag: float = 0.0  # the page shows observations this much later
    slots: int = 0  # at most this many requests generate at once, the rest queue (0: any)
    version: str = '{"version": "9.9.9"}'  # vLLM's /version, as sent


@dataclass
class Fake:
    behaviour: Behaviour
    bodies: list[dict[str, Any]] = field(default_factory=list)
    observed: list[tuple[float, float]] = field(default_factory=list)  # (when, TTFT)
    gaps: list[float] = field(default_factory=list)  # between a request's tokens
    in_flight: int = 0
    max_in_flight: int = 0
    hung_up: threading.Event = field(default_factory=threading.Event)  # left hanging, cancelled
    url: str = ""
    admission: asyncio.Semaphore | None = None  # Behaviour.slots, made on the server's loop

    def tgi_page(self) -> str:
        """TGI's page: no TTFT or inter-token histogram, its decode steps timed (here each
        token's gap stands for the decode step that made it)."""
        name, labels = "tgi_batch_inference_duration", 'method="decode"'
        lines = ["tgi_queue_size 0", f"# TYPE {name} histogram"]
        for le in BOUNDS:
            count = sum(1 for g in self.gaps if g <= float(le))
            lines.append(f'{name}_bucket{{{labels},le="{le}"}} {count}')
        lines.append(f"{name}_sum{{{labels}}} {sum(self.gaps)}")
        lines.append(f"{name}_count{{{labels}}} {len(self.gaps)}")
        return "\n".join(lines) + "\n"

    def page(self) -> str:
        if self.behaviour.metrics == "tgi":
            return self.tgi_page()
        cutoff = time.monotonic() - self.behaviour.metrics_lag
        seen = [ttft for when, ttft in self.observed if when <= cutoff]
        if self.behaviour.metrics == "inferwatch":
            name, labels = (
                "inferwatch_time_to_first_token_seconds",
                f'backend="vllm",model="{MODEL}",engine="0"',
            )
            lines = [
                "# TYPE inferwatch_build_info gauge",
                'inferwatch_build_info{version="0.1.0"} 1.0',
                "# TYPE inferwatch_backend_info gauge",
                f'inferwatch_backend_info{{backend="vllm",version="9.9.9",model="{MODEL}"}} 1.0',
            ]
        else:
            name, labels = "vllm:time_to_first_token_seconds", f'engine="0",model_name="{MODEL}"'
            lines = [f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 0.0']
        lines.append(f"# TYPE {name} histogram")
        for le in BOUNDS:
            count = sum(1 for t in seen if t <= float(le))
            lines.append(f'{name}_bucket{{{labels},le="{le}"}} {count}.0')
        lines.append(f"{name}_count{{{labels}}} {len(seen)}.0")
        lines.append(f"{name}_sum{{{labels}}} {sum(seen)}")
        # Another model's series, to be left out.
        other = labels.replace(f'"{MODEL}"', '"other"')
        lines += [f'{name}_bucket{{{other},le="+Inf"}} 99.0', f"{name}_count{{{other}}} 99.0"]
        return "\n".join(lines) + "\n"

    async def metrics(self, request: web.Request) -> web.Response:
        if self.behaviour.metrics == "none":
            return web.Response(status=404, text="not found")
        return web.Response(text=self.page(), content_type="text/plain")

    async def version(self, request: web.Request) -> web.Response:
        return web.Response(text=self.behaviour.version, content_type="application/json")

    async def info(self, request: web.Request) -> web.Response:  # TGI's
        return web.json_response({"version": "3.3.6", "model_id": MODEL})

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        start = time.monotonic()
        self.bodies.append(body)
        b = self.behaviour
        chat = request.path.endswith("/chat/completions")
        text = body["messages"][0]["content"] if chat else body["prompt"]
        if b.reject_exact_length and ("ignore_eos" in body or "min_tokens" in body):
            return web.json_response(
                {"object": "error", "message": "extra fields not permitted"}, status=400
            )
        # The sweep's probes (PROBE_OUTPUT_TOKENS long) are never failed on purpose.
        probe = body["max_tokens"] == client.PROBE_OUTPUT_TOKENS
        index = None if probe else request_index(text)

        def every(n: int) -> bool:
            return bool(n) and index is not None and index % n == 1

        if every(b.fail_every):
            return web.json_response({"error": {"message": "boom", "code": 500}}, status=500)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

        async def send(doc: Any) -> None:
            data = doc if isinstance(doc, str) else json.dumps(doc)
            await resp.write(f"data: {data}\n\n".encode())

        try:
            if every(b.hang_every):
                # Until the client hangs up, which cancels this handler; a client that never
                # does gets a stream without a token after a minute (the test fails, not hangs).
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    self.hung_up.set()
                    raise
                return resp
            if chat and b.role_chunk:
                await send(
                    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
                )
            if b.slots:
                self.admission = self.admission or asyncio.Semaphore(b.slots)
                async with self.admission:
                    await self.generate(b, body, chat, start, send, every)
            else:
                await self.generate(b, body, chat, start, send, every)
        finally:
            self.in_flight -= 1
        return resp

    async def generate(
        self, b: Behaviour, body: dict, chat: bool, start: float, send: Any, every: Any
    ) -> None:
        """A request's tokens, its closing events and usage."""
        text = body["messages"][0]["content"] if chat else body["prompt"]
        await asyncio.sleep(b.ttft)
        last = time.monotonic()
        for k in range(body["max_tokens"]):
            if k:
                await asyncio.sleep(b.itl)
                self.gaps.append(time.monotonic() - last)
                last = time.monotonic()
            else:
                last = time.monotonic()
                self.observed.append((time.monotonic(), time.monotonic() - start))
            token = "" if b.empty_tokens and k % 2 else "x"
            choice = {"delta": {"content": token}} if chat else {"text": token}
            await send({"choices": [{"index": 0, "finish_reason": None, **choice}]})
            if k == 0 and every(b.error_event_every):
                await send({"error": {"message": "engine died"}})
                return
        if chat:  # OpenAI closes a choice with an empty event
            await send({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        if b.usage:
            words = len(text.split())
            usage = {
                "prompt_tokens": FIXED_TOKENS + TOKENS_PER_WORD * words,
                "completion_tokens": body["max_tokens"],
            }
            await send({"choices": [], "usage": usage})
        await send("[DONE]")


def request_index(text: str) -> int | None:
    """The request index in a sweep's tag (``seed.cell.index``)."""
    parts = text.split(" ", 1)[0].split(".")
    return int(parts[2]) if len(parts) == 3 and parts[2].isdigit() else None


@pytest.fixture
def fake() -> Iterator[Fake]:
    """The fake server in a thread with its own loop (the sweep runs asyncio.run)."""
    server = Fake(Behaviour())
    app = web.Application()
    app.router.add_post("/v1/completions", server.complete)
    app.router.add_post("/v1/chat/completions", server.complete)
    app.router.add_get("/metrics", server.metrics)
    app.router.add_get("/version", server.version)
    app.router.add_get("/info", server.info)
    loop = asyncio.new_event_loop()
    # A handler is cancelled when its client hangs up (how a hanging request ends).
    runner = web.AppRunner(app, shutdown_timeout=0.5, handler_cancellation=True)
    ready = threading.Event()

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        server.url = f"http://127.0.0.1:{port}"
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()))
    thread.start()
    assert ready.wait(10)
    yield server
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def plan(url: str, slos: SLOs | None = None, **flags: Any) -> command.Plan:
    flags = {"url": url, "model": MODEL, "out": "/tmp/unused.yaml", **flags}
    return command.Plan.from_values(resolve(command.OPTIONS, flags, {}, env={}), slos)


def run(plan: command.Plan) -> tuple[command.Sweep, str]:
    stderr = io.StringIO()
    result = asyncio.run(command.run(plan, report.Progress(stderr, plan)))
    return result, stderr.getvalue()


def median_bucket(ttfts: list[float]) -> tuple[float, float]:
    """The bucket of ``BOUNDS`` that holds the median of ``ttfts``: PromQL's p50 of their
    histogram lies in it (past the last finite bound: is that bound)."""
    bounds = [float(le) for le in BOUNDS]
    upper = next(b for b in bounds if sum(t <= b for t in ttfts) >= len(ttfts) / 2)
    lower = max([0.0, *(b for b in bounds if b < upper)])
    return lower, lower if math.isinf(upper) else upper


def test_ttft_itl_and_e2e_are_measured_from_the_stream(fake: Fake) -> None:
    """First token after 0.05 s, then one every 0.1 s: the delays are lower bounds (sleeps).
    A loaded machine may add any time, so what tells the first token from the last is the
    stream's own arithmetic (TTFT, then the gaps, end at the last token, before the end),
    and the server's p50 is checked against the fake's own observations."""
    fake.behaviour = Behaviour(ttft=0.05, itl=0.1)
    result, _ = run(
        plan(
            fake.url, concurrency=(2,), prompt_tokens=(40,), output_tokens=(5,), requests_per_cell=4
        )
    )
    (cell,) = result.results
    assert len(cell.ok) == 4 and not cell.errors
    for s in cell.ok:
        assert s.ttft >= 0.05
        assert len(s.gaps) == 4
        assert s.ttft + sum(s.gaps) <= s.e2e + 1e-9  # the first token, then one per gap
        assert s.e2e >= 0.05 + 4 * 0.1
    c = cell.cell()
    assert c.itl_seconds.p50 >= 0.07
    assert c.output_tokens_per_second == pytest.approx(5 * c.requests_per_second, rel=1e-3)
    # The window holds exactly the 4 requests (the fake's last 4 observations, after the
    # probes'); its p50 lies in the bucket of their median, and the client's p50 trails it
    # but for the width of the bucket it is interpolated in.
    assert cell.server_window.count == 4
    server_p50 = c.server_ttft_seconds.p50
    bucket_lower, bucket_upper = median_bucket([ttft for _, ttft in fake.observed[-4:]])
    assert server_p50 > 0.04
    assert bucket_lower <= server_p50 <= bucket_upper
    upper = min(float(le) for le in BOUNDS if float(le) >= server_p50)
    lower = max(float(le) for le in BOUNDS if float(le) < upper)
    assert c.ttft_seconds.p50 >= server_p50 - (upper - lower)


def test_concurrency_is_held_constant_and_every_request_is_sent(fake: Fake) -> None:
    result, _ = run(
        plan(
            fake.url, concurrency=(3,), prompt_tokens=(10,), output_tokens=(4,), requests_per_cell=9
        )
    )
    assert fake.max_in_flight == 3
    assert len(result.results[0].ok) == 9
    default = plan(fake.url, concurrency=(1, 16))
    assert [default.requests_in(c) for c in (1, 16)] == [8, 32]


def test_prompt_lengths_are_calibrated_and_every_prompt_differs(fake: Fake) -> None:
    result, _ = run(plan(fake.url, concurrency=(2,), prompt_tokens=(50, 300), output_tokens=(2,)))
    calibration = result.metadata["prompt_calibration"]
    assert calibration["tokens_per_word"] == TOKENS_PER_WORD
    for cell in result.results:
        assert abs(cell.mean_prompt_tokens() - cell.prompt_tokens) <= TOKENS_PER_WORD
    texts = [b["prompt"] for b in fake.bodies]
    assert len(set(texts)) == len(texts)
    # Not even their first words coincide: no two share a cached prefix block.
    assert len({" ".join(p.split()[:4]) for p in texts}) == len(texts)
    body = fake.bodies[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["min_tokens"] == body["max_tokens"] == 2


def test_same_seed_same_prompts_fresh_seed_otherwise(fake: Fake) -> None:
    flags = {
        "concurrency": (1,),
        "prompt_tokens": (20,),
        "output_tokens": (2,),
        "requests_per_cell": 2,
    }
    run(plan(fake.url, seed=7, **flags))
    first = [b["prompt"] for b in fake.bodies]
    fake.bodies.clear()
    run(plan(fake.url, seed=7, **flags))
    assert [b["prompt"] for b in fake.bodies] == first
    assert len({plan(fake.url).seed for _ in range(5)}) > 1  # a fresh seed per run


GOODPUT_CELL = {"concurrency": (2,), "prompt_tokens": (10,), "output_tokens": (4,)}


def test_goodput_counts_the_requests_that_met_every_objective_jointly(fake: Fake) -> None:
    # First tokens after 20 ms, gaps of 30 ms; one request in four fails (HTTP 500).
    fake.behaviour = Behaviour(ttft=0.02, itl=0.03, fail_every=4)
    flags = {**GOODPUT_CELL, "requests_per_cell": 8}
    cases = {  # objectives -> the good share: the failures never count, every bound must hold
        (None, None): 0.75,
        (5.0, 5.0): 0.75,
        (0.001, 5.0): 0.0,  # no first token that fast
        (5.0, 0.001): 0.0,  # no gap that short
    }
    for (ttft, itl), share in cases.items():
        result, stderr = run(plan(fake.url, goodput_ttft=ttft, goodput_itl=itl, **flags))
        cell = result.results[0].cell()
        assert cell is not None and cell.goodput_share == share, (ttft, itl, stderr)
        good = share * cell.requests
        assert cell.goodput_requests_per_second == round(good / result.results[0].seconds, 3)
        assert cell.goodput_tokens_per_second == round(4 * good / result.results[0].seconds, 3)
        assert result.metadata["goodput_objectives"] == {
            **({"ttft_seconds": ttft} if ttft else {}),
            **({"itl_seconds": itl, "itl_target": 0.95} if itl else {}),
        }
    # Written to the file and read back.
    back = parse(yaml.safe_load(to_yaml(result.baseline())))
    assert back.cells[0].goodput_share == 0.0


def test_goodput_objectives_come_from_the_config_and_flags_replace_their_bounds(
    fake: Fake,
) -> None:
    # The config's objectives for the model: TTFT within 1 ms (none is), ITL 99 % within
    # 5 s. A flag's bound replaces the config's; the ITL target stays the config's.
    slos = slos_from_config(
        {
            "objectives": {"errors": {"target": 0.999}},
            "models": {
                MODEL: {
                    "ttft": {"target": 0.99, "seconds": 0.001},
                    "itl": {"target": 0.99, "seconds": 5.0},
                }
            },
        },
        "vllm",  # whose bucket bounds the objectives' bounds are
    )
    fake.behaviour = Behaviour(ttft=0.02, itl=0.002)
    flags = {**GOODPUT_CELL, "requests_per_cell": 4}
    from_config = plan(fake.url, slos, **flags)
    assert from_config.objectives.text() == "TTFT <= 0.001 s, 99 % of gaps <= 5 s, no error"
    assert run(from_config)[0].results[0].cell().goodput_share == 0.0
    flagged = plan(fake.url, slos, goodput_ttft=5.0, **flags)
    assert flagged.objectives.text() == "TTFT <= 5 s, 99 % of gaps <= 5 s, no error"
    assert run(flagged)[0].results[0].cell().goodput_share == 1.0
    other = plan(fake.url, slos, model="another", **flags)  # the default group: errors only
    assert other.objectives.text() == "no error"


def test_the_search_finds_the_rate_a_server_of_two_slots_carries(
    fake: Fake, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two requests generate at once, each for 30 ms + 7 x 20 ms: at most 2 / 0.17 s, 11.8
    # requests/s. At constant arrivals below that nothing waits; above it every arrival waits
    # longer than the last, and past ~5 % over, requests outlast twice a service time. Steps
    # of 1.5 s of arrivals (24 requests at 16 requests/s) show it, for a fake this fast.
    monkeypatch.setattr(search, "STEP_SECONDS", 1.5)
    fake.behaviour = Behaviour(ttft=0.03, itl=0.02, slots=2)
    most = 2 / (0.03 + 7 * 0.02)
    flags = {"prompt_tokens": (8,), "output_tokens": (8,), "concurrency": (1,)}
    result, stderr = run(
        plan(
            fake.url, search="on", arrivals="constant", goodput_e2e=0.34, requests_per_cell=24,
            search_start=4.0, **flags,
        )
    )  # fmt: skip
    (capacity,) = result.capacity
    assert capacity.ended == "converged" and capacity.shape == (8, 8), stderr
    assert 0.5 * most <= capacity.requests_per_second <= 1.1 * most, (most, stderr)
    assert capacity.goodput_share >= 0.95 and capacity.concurrency > 0
    rates = [s.rate for s in capacity.steps]
    assert rates[:3] == [4.0, 8.0, 16.0]  # doubled until a rate failed, then bisected
    bad = [s for s in capacity.steps if s.goodput_share < 0.95]
    assert bad and min(s.rate for s in bad) <= 1.1 * capacity.requests_per_second * 1.0001
    assert stderr.count("search prompt 8, output 8: step") == len(capacity.steps)
    # Open loop: more requests in flight than the server's two slots.
    assert fake.max_in_flight > 2
    # A step ended early leaves nothing behind: no task or future whose end went unread.
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
    # Written to the file with the conditions it was measured under, and read back.
    back = parse(yaml.safe_load(to_yaml(result.baseline())))
    assert back.capacity == result.capacity
    assert {"model", "version", "gpu", "date", "seed"} <= set(result.metadata)


def test_through_a_router_the_file_holds_one_replicas_share_of_the_fleet(fake: Fake) -> None:
    """``--url`` a router in front of two like replicas (here the fake stands for both: the
    router's view and one replica's page): the sweep and the search measure the fleet, and
    the file holds each replica's share: its rates, concurrency and capacity halved, every
    latency as measured, the replica's page read for the server side."""
    fake.behaviour = Behaviour(ttft=0.01, itl=0.01)
    flags = {"prompt_tokens": (8,), "output_tokens": (4,), "concurrency": (2, 4)}
    fleet, _ = run(
        plan(
            fake.url, search="on", arrivals="constant", requests_per_cell=16, search_steps=3,
            replicas=2, replica_url=fake.url + "/v1", **flags,
        )
    )  # fmt: skip
    measured = {r.key: r.cell() for r in fleet.results}
    one = fleet.baseline()
    assert one.metadata["replicas"] == 2 and one.metadata["replica_url"] == fake.url
    assert [c.concurrency for c in one.cells] == [1, 2]
    for cell in one.cells:
        whole = measured[(2 * cell.concurrency, 8, 4)]
        assert whole is not None and cell.requests_per_second > 0
        assert cell.requests_per_second == round(whole.requests_per_second / 2, 6)
        assert cell.output_tokens_per_second == round(whole.output_tokens_per_second / 2, 6)
        assert cell.goodput_requests_per_second == round(whole.goodput_requests_per_second / 2, 6)
        assert (cell.ttft_seconds, cell.server_ttft_seconds) == (
            whole.ttft_seconds,
            whole.server_ttft_seconds,
        )
        assert cell.server_ttft_seconds is not None  # the replica's page was read
    (capacity,), (share,) = fleet.capacity, one.capacity
    assert capacity.requests_per_second and share.requests_per_second == round(
        capacity.requests_per_second / 2, 6
    )
    assert [s.rate for s in share.steps] == [round(s.rate / 2, 6) for s in capacity.steps]
    assert [s.ttft_p95 for s in share.steps] == [s.ttft_p95 for s in capacity.steps]
    assert parse(yaml.safe_load(to_yaml(one))) == one  # the file reads back as written
    # What the file's rates set is the replica's: the light cell's half, not the fleet's.
    lightest = min(c.requests_per_second for c in one.cells)
    rate = thresholds_from(one, 1.5, 15.0)["min_request_rate"].value
    assert rate <= lightest / 2 * 1.0001


def test_a_step_holds_its_rate_long_enough_for_a_queue_to_show() -> None:
    # 8 requests sent at once all met their objectives "at 42,000 requests/s" on the demo's
    # vLLM, which answered 129 a second: a step is 15 s of arrivals at least.
    assert search.Search(requests=8).requests_at(1000.0) == 15_000
    assert search.Search(requests=100).requests_at(1.0) == 100  # more where asked
    assert search.Search().requests_at(0.5) == search.MIN_REQUESTS


def test_poisson_arrivals_are_seeded_and_average_the_rate() -> None:
    first = search.arrival_times("poisson", 4.0, 2000, random.Random("7.128.64.0"))
    again = search.arrival_times("poisson", 4.0, 2000, random.Random("7.128.64.0"))
    other = search.arrival_times("poisson", 4.0, 2000, random.Random("8.128.64.0"))
    assert first == again != other and first[0] == 0.0
    assert 0.9 * 4.0 <= len(first) / first[-1] <= 1.1 * 4.0
    assert search.arrival_times("constant", 4.0, 3, random.Random(1)) == [0.0, 0.25, 0.5]


def step(rate: float, share: float, answered: float = 0.0, e2e: float = 1.0) -> Step:
    return Step(rate, 16, answered or rate, share, 1.0, 0.1, 0.01, e2e)


def test_the_next_rate_doubles_halves_then_bisects_and_noise_above_a_bad_rate_is_ignored() -> None:
    assert search.next_rate([step(1, 1.0)], 0.95, 0.1) == 2
    assert search.next_rate([step(1, 0.5)], 0.95, 0.1) == 0.5
    assert search.next_rate([step(1, 1.0), step(2, 1.0), step(4, 0.5)], 0.95, 0.1) == 3
    assert search.next_rate([step(3, 1.0), step(3.25, 0.9)], 0.95, 0.1) is None  # within 10 %
    # A good step above the lowest bad rate does not raise the capacity.
    noisy = [step(1, 1.0), step(2, 0.5), step(4, 1.0)]
    assert search.bounds(noisy, 0.95) == (noisy[0], 2)
    assert search.next_rate(noisy, 0.95, 0.1) == 1.5


def test_the_knee_is_where_latency_outgrows_the_load() -> None:
    # Throughput doubles at 10 % more latency, then again at 3x the latency.
    steps = [step(1, 1.0, 1, 1.0), step(2, 1.0, 2, 1.1), step(4, 1.0, 4, 3.3), step(8, 0.2, 4.1)]
    assert search.knee(steps) == 2
    assert search.knee(steps[:2]) is None  # three steps with answers at least
    assert search.knee([step(1, 1.0, 1, 1.0), step(2, 1, 2, 1.2), step(4, 1, 4, 1.3)]) is None
    # The throughput that stops growing is past the knee.
    assert search.knee([step(1, 1, 1, 1.0), step(2, 1, 2, 1.1), step(4, 0.5, 1.9, 1.2)]) == 2


def test_failures_are_counted_and_never_stop_the_sweep(fake: Fake) -> None:
    fake.behaviour = Behaviour(fail_every=8, error_event_every=5, hang_every=6)
    result, stderr = run(
        plan(
            fake.url,
            concurrency=(2,),
            prompt_tokens=(10,),
            output_tokens=(3,),
            requests_per_cell=8,
            request_timeout=1.5,
        )
    )
    (cell,) = result.results
    errors = sorted(s.error for s in cell.errors)
    assert len(cell.samples) == 8 and len(errors) == 3, errors  # requests 1, 6 and 7
    assert errors[0] == "HTTP 500: boom"
    assert errors[1] == "error event: engine died"
    assert errors[2] == "no complete answer within 1.5 s"
    assert cell.cell().errors == 3 and cell.cell().requests == 8
    assert "3 errors, the first:" in stderr
    # The client gave up on the hanging request and hung up: the server saw it cancelled.
    assert fake.hung_up.wait(10)


def test_a_server_that_rejects_ignore_eos_is_asked_without(fake: Fake) -> None:
    fake.behaviour = Behaviour(reject_exact_length=True)
    result, stderr = run(
        plan(
            fake.url, concurrency=(1,), prompt_tokens=(10,), output_tokens=(2,), requests_per_cell=2
        )
    )
    assert len(result.results[0].ok) == 2
    assert "rejects ignore_eos/min_tokens" in stderr
    assert "ignore_eos" not in fake.bodies[-1]


def test_chat_counts_tokens_not_the_role_announcement_nor_the_closing_event(fake: Fake) -> None:
    fake.behaviour = Behaviour(ttft=0.08, itl=0.01, empty_tokens=True)
    result, _ = run(
        plan(
            fake.url,
            api="chat",
            concurrency=(1,),
            prompt_tokens=(20,),
            output_tokens=(4,),
            requests_per_cell=2,
        )
    )
    for s in result.results[0].ok:
        assert s.ttft >= 0.08  # the role event came at once
        assert len(s.gaps) == 3  # 4 tokens, two of them without text
    assert fake.bodies[-1]["messages"][0]["role"] == "user"


def test_without_usage_output_tokens_are_counted_from_events(fake: Fake) -> None:
    fake.behaviour = Behaviour(usage=False)
    result, stderr = run(
        plan(
            fake.url, concurrency=(1,), prompt_tokens=(13,), output_tokens=(3,), requests_per_cell=2
        )
    )
    assert "no usable prompt token usage" in stderr
    assert [s.output_tokens for s in result.results[0].ok] == [3, 3]
    assert (
        result.metadata["prompt_calibration"]["tokens_per_word"] == prompts.FALLBACK_TOKENS_PER_WORD
    )


def test_inferwatch_page_gives_the_server_ttft_and_lags_are_waited_for(fake: Fake) -> None:
    fake.behaviour = Behaviour(ttft=0.03, metrics="inferwatch", metrics_lag=0.4)
    result, _ = run(
        plan(
            fake.url,
            concurrency=(2,),
            prompt_tokens=(10, 20),
            output_tokens=(2,),
            requests_per_cell=4,
        )
    )
    assert result.metadata["backend"] == "vllm" and result.metadata["version"] == "9.9.9"
    observed = [ttft for _, ttft in fake.observed[-8:]]  # after the probes': 4 per cell
    for cell, mine in zip(result.results, (observed[:4], observed[4:]), strict=True):
        assert cell.server_window.count == 4  # the lag did not push a request into the next cell
        p50 = cell.server_quantiles().p50
        bucket_lower, bucket_upper = median_bucket(mine)  # the cell's own requests, no other
        assert p50 > 0.02
        assert bucket_lower <= p50 <= bucket_upper


def test_a_tgi_page_gives_its_decode_steps_where_it_has_no_itl_histogram(fake: Fake) -> None:
    # TGI: no TTFT or inter-token histogram; its decode steps are what the rules judge its
    # per-token latency on, so the sweep reads them and calibrate derives from them.
    fake.behaviour = Behaviour(itl=0.03, metrics="tgi")
    result, stderr = run(
        plan(
            fake.url, concurrency=(2,), prompt_tokens=(10,), output_tokens=(4,), requests_per_cell=4
        )
    )
    assert "no server-side" not in stderr
    assert (result.metadata["backend"], result.metadata["version"]) == ("tgi", "3.3.6")
    cell = result.results[0].cell()
    assert cell is not None
    assert cell.server_ttft_seconds is None and cell.server_itl_seconds is None
    steps = cell.server_decode_step_seconds
    assert steps is not None and 0.02 < steps.p50 <= 0.04  # the gaps' bucket (0.02, 0.04]
    assert cell.itl() == (steps, "server decode step")
    assert cell.ttft()[1] == "client"
    derived = thresholds_from(Baseline(result.metadata, (cell,)), 1.5, 300.0)
    assert derived["itl_p95_seconds"].value == float(f"{1.5 * steps.p95:.4g}")
    assert "the server's decode step p95" in derived["itl_p95_seconds"].source
    assert "the client's TTFT p95" in derived["ttft_p95_seconds"].source


def test_vllm_page_names_backend_and_version(fake: Fake) -> None:
    result, _ = run(
        plan(
            fake.url, concurrency=(1,), prompt_tokens=(10,), output_tokens=(2,), requests_per_cell=2
        )
    )
    assert (result.metadata["backend"], result.metadata["version"]) == ("vllm", "9.9.9")
    assert result.metadata["metrics_url"] == fake.url + "/metrics"


def calibrate(fake: Fake, out: Path, *flags: str) -> int:
    """The calibrate's sweep and files alone: the fake has no normal traffic, engine steps or
    capacity to read (tests/test_calibrate_real.py reads them from a real vLLM)."""
    return main(
        [
            "calibrate", "--url", fake.url, "--model", MODEL, "--out", str(out),
            "--concurrency", "1", "--prompt-tokens", "10", "--output-tokens", "2",
            "--requests-per-cell", "2", "--normal-windows", "0", "--engine-step", "off",
            "--search", "off", *flags,
        ]
    )  # fmt: skip


# A server's version with a line break: the config keys it would add below the comment.
INJECTED = '1.0\nalerting:\n  runbook_url_base: "javascript:alert(1)//"\n  exporter_selector: x'


@pytest.mark.parametrize(
    ("reply", "shown"),
    [
        (json.dumps({"version": INJECTED}), INJECTED.replace("\n", "\\n")),
        (json.dumps({"version": "1.0\n: [broken"}), "1.0\\n: [broken"),  # YAML that breaks
        ("[" * 100_000, ""),  # nested deeper than a parser recurses
        ('{"version": {"nested": 1}}', ""),
        ("not json", ""),
    ],
    ids=["keys", "broken-yaml", "too-deep", "an-object", "not-json"],
)
def test_calibrate_writes_what_the_server_says_as_data(
    fake: Fake, tmp_path: Path, capsys: pytest.CaptureFixture, reply: str, shown: str
) -> None:
    fake.behaviour = Behaviour(version=reply)
    out = tmp_path / "inferwatch.yaml"
    assert calibrate(fake, out) == 0, capsys.readouterr().err
    config = yaml.safe_load(out.read_text())
    assert "alerting" not in config and "slos" in config
    header = out.read_text().splitlines()[1]
    assert header.startswith(f"# Measured: vllm {shown} serving 'm' at "), header
    assert load(tmp_path / "baseline.yaml").metadata["version"] == shown.replace("\\n", "\n")


def test_outputs_follow_no_file_planted_under_their_temporary_name(
    fake: Fake, tmp_path: Path, cli
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("the operator's\n")
    for name in ("b.yaml", "inferwatch.yaml", "baseline.yaml"):
        (tmp_path / f".{name}.partial").symlink_to(victim)
    args = ["--url", fake.url, "--model", MODEL, "--out", str(tmp_path / "b.yaml")]
    args += ["--concurrency", "1", "--prompt-tokens", "10", "--output-tokens", "2"]
    assert cli(*args).returncode == 0
    assert calibrate(fake, tmp_path / "inferwatch.yaml") == 0
    assert victim.read_text() == "the operator's\n"
    assert load(tmp_path / "b.yaml").cells and load(tmp_path / "baseline.yaml").cells
    assert sorted(p.name for p in tmp_path.glob(".*")) == sorted(
        f".{name}.partial" for name in ("b.yaml", "inferwatch.yaml", "baseline.yaml")
    )  # the planted links, and nothing left behind


@pytest.mark.parametrize(
    "secret",
    [{"backend_header": "X-Api-Key: s3cret"}, {"backend_url": "http://u:s3cret@127.0.0.1:9"}],
    ids=["header", "url"],
)
def test_calibrate_writes_a_config_holding_a_secret_for_its_user_only(
    fake: Fake, tmp_path: Path, secret: dict[str, str]
) -> None:
    given = tmp_path / "given.yaml"
    given.write_text(yaml.safe_dump(secret))
    given.chmod(0o600)
    out = tmp_path / "inferwatch.yaml"
    assert calibrate(fake, out, "--config", str(given)) == 0
    assert "s3cret" in out.read_text()
    assert out.stat().st_mode & 0o777 == 0o600
    assert "s3cret" not in (tmp_path / "baseline.yaml").read_text()
    assert calibrate(fake, tmp_path / "plain.yaml") == 0  # nothing secret: the umask's mode
    assert (tmp_path / "plain.yaml").stat().st_mode & 0o777 == 0o666 & ~current_umask()


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_without_a_metrics_page_the_sweep_runs_client_side_only(fake: Fake) -> None:
    fake.behaviour = Behaviour(metrics="none")
    result, stderr = run(
        plan(
            fake.url, concurrency=(1,), prompt_tokens=(10,), output_tokens=(2,), requests_per_cell=2
        )
    )
    assert "no server-side latency" in stderr and "HTTP 404" in stderr
    assert result.results[0].cell().server_ttft_seconds is None
    assert result.metadata["backend"] == "unknown"


def test_real_prompts_from_jsonl(fake: Fake, tmp_path: Path) -> None:
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "one two three"}\n\n{"prompt": "four five"}\n')
    result, _ = run(
        plan(
            fake.url,
            prompts=jsonl,
            concurrency=(1,),
            output_tokens=(2,),
            requests_per_cell=3,
        )
    )
    assert [r.key for r in result.results] == [(1, 0, 2)]
    sent = [b["prompt"].split(" ", 1)[1] for b in fake.bodies]
    assert sent[-3:] == ["one two three", "four five", "one two three"]
    assert result.metadata["prompts"] == str(jsonl)
    assert "prompt_calibration" not in result.metadata


@pytest.mark.parametrize(
    ("content", "api", "message"),
    [
        ("not json\n", "completions", "line 1: not JSON"),
        ('{"prompt": "a"}\n[1]\n', "completions", "line 2: expected a JSON object"),
        ('{"text": "a"}\n', "completions", "needs exactly one of 'prompt' and 'messages'"),
        ('{"prompt": ""}\n', "completions", "'prompt' must be a non-empty string"),
        ('{"messages": [{"role": "user", "content": "a"}]}\n', "completions", "need --api chat"),
        ('{"messages": []}\n', "chat", "'messages' must be a non-empty list"),
        ('{"messages": [{"role": "user"}]}\n', "chat", "messages[0] must have string"),
        ("\n\n", "completions", "no prompts"),
    ],
)
def test_bad_jsonl_is_a_one_line_error(
    tmp_path: Path, content: str, api: str, message: str
) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    with pytest.raises(
        ConfigError, match=rf"{path}.*{message}".replace("[", r"\[").replace("]", r"\]")
    ):
        prompts.load_prompts(path, api)


def test_jsonl_prompt_becomes_a_user_message_for_chat(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hi"}\n{"messages": [{"role": "system", "content": "s"}]}\n')
    assert prompts.load_prompts(path, "chat") == (
        {"messages": [{"role": "user", "content": "hi"}]},
        {"messages": [{"role": "system", "content": "s"}]},
    )


async def test_sse_parsing_across_reads_and_its_bounds() -> None:
    async def events(*chunks: bytes) -> list[str]:
        protocol = mock.Mock(_reading_paused=False)
        reader = aiohttp.StreamReader(protocol, 2**16, loop=asyncio.get_running_loop())
        for chunk in chunks:
            reader.feed_data(chunk)
        reader.feed_eof()
        return [data async for _, data in client.sse_data(reader)]

    assert await events(
        b'data: {"a"', b": 1}\r\n\r\n: comment\n\ndata: x\ndata: y\n\ndata:[DONE]"
    ) == [
        '{"a": 1}',
        "x\ny",
        "[DONE]",
    ]
    with pytest.raises(client.StreamError, match="SSE line exceeds"):
        await events(b"data: " + b"x" * (client.MAX_LINE_BYTES + 1))


# --- regressions, table, output ----------------------------------------------------------


def q(p50: float, p95: float) -> Quantiles:
    return Quantiles(p50, p95, p95)


def baseline_cell(concurrency: int, ttft_p95: float, itl_p95: float, output: int = 2) -> Cell:
    return Cell(
        concurrency, 10, output, 8, 0, q(0.01, ttft_p95), q(0.001, itl_p95), q(0.1, 0.2), 5.0, 10.0
    )


def result(concurrency: int, ttft: float, itl: float, ok: bool = True) -> cells.CellResult:
    sample = client.Sample(ttft=ttft, gaps=(itl,), e2e=0.1, output_tokens=2)
    failed = client.Sample(error="HTTP 500: boom")
    return cells.CellResult(concurrency, 10, 2, (sample if ok else failed,) * 4, 1.0)


def test_regressions_are_marked_cell_by_cell() -> None:
    previous = Baseline(
        {},
        (
            baseline_cell(1, 0.02, 0.002),
            baseline_cell(2, 0.02, 0.002),
            baseline_cell(4, 0.02, 0.002),
        ),
    )
    marks = report.regressions(
        [
            result(1, 0.025, 0.002),
            result(2, 0.05, 0.004),
            result(4, 0.01, 0.001, ok=False),
            result(8, 1, 1),
        ],
        previous,
        1.5,
    )
    assert marks == {
        (1, 10, 2): "",
        (2, 10, 2): "TTFT p95 x2.50, ITL p95 x2.00",
        (4, 10, 2): "every request failed",
    }
    table = report.table([result(1, 0.025, 0.002), result(2, 0.05, 0.004), result(8, 1, 1)], marks)
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["conc", "prompt", "output", "TTFT"]
    assert lines[1].endswith("ok") and "REGRESSED TTFT p95 x2.50" in lines[2]
    assert lines[3].endswith("new")


def test_table_rows_and_units(fake: Fake) -> None:
    fake.behaviour = Behaviour(ttft=0.05, itl=0.01)
    result_, _ = run(
        plan(
            fake.url, concurrency=(1,), prompt_tokens=(10,), output_tokens=(3,), requests_per_cell=2
        )
    )
    header, row = report.table(result_.results, None).splitlines()[:2]
    values = dict(zip(re.sub(r" (p\d\d)", r"_\1", header).split(), row.split(), strict=True))
    assert values["conc"] == "1" and values["prompt"] == "10" and values["errors"] == "0"
    ttft_p50 = result_.results[0].cell().ttft_seconds.p50
    assert float(values["TTFT_p50"]) >= 50  # milliseconds: the delay is 0.05 s
    assert float(values["TTFT_p50"]) == pytest.approx(ttft_p50 * 1000, abs=0.051)
    gap = float(values["TTFT_p50"]) - float(values["server_p50"])
    assert float(values["gap"]) == pytest.approx(gap, abs=0.11)


# --- the command ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str


def subprocess_cli(*args: str) -> Outcome:
    """The command as a user runs it (one test: imports, entry point, real stdio)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")}
    proc = subprocess.run(
        [sys.executable, "-m", "inferwatch", "baseline", *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch):
    """``inferwatch baseline ARGS`` in this process, with only ``env`` of INFERWATCH_*."""

    def run_cli(*args: str, env: dict[str, str] | None = None) -> Outcome:
        for name in [n for n in os.environ if n.startswith("INFERWATCH_")]:
            monkeypatch.delenv(name)
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        try:
            status = main(["baseline", *args])
        except SystemExit as exc:  # argparse's usage errors
            status = exc.code
        out = capsys.readouterr()
        return Outcome(status, out.out, out.err)

    return run_cli


def test_command_writes_a_loadable_file_and_prints_the_table(fake: Fake, tmp_path: Path) -> None:
    out = tmp_path / "b.yaml"
    proc = subprocess_cli(
        "--url", fake.url + "/v1", "--model", MODEL, "--out", str(out),
        "--concurrency", "1,2", "--prompt-tokens", "10", "--output-tokens", "3",
        "--gpu-name", "H100", "--seed", "42",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 3 + 1  # header, two cells, legend
    baseline = load(out)
    assert [c.key for c in baseline.cells] == [(1, 10, 3), (2, 10, 3)]
    meta = baseline.metadata
    assert meta["gpu"] == "H100" and meta["seed"] == 42 and meta["model"] == MODEL
    assert meta["url"] == fake.url and meta["api"] == "completions"
    assert meta["inferwatch"] and meta["date"].endswith("+00:00")
    assert all(c.server_ttft_seconds is not None for c in baseline.cells)
    assert f"wrote {out}" in proc.stderr


def test_command_exits_3_on_a_regression_and_still_writes(fake: Fake, tmp_path: Path, cli) -> None:
    previous = tmp_path / "old.yaml"
    previous.write_text(to_yaml(Baseline({}, (baseline_cell(1, 0.0001, 1.0, output=3),))))
    out = tmp_path / "new.yaml"
    args = ["--url", fake.url, "--model", MODEL, "--out", str(out), "--concurrency", "1,2"]
    args += ["--prompt-tokens", "10", "--output-tokens", "3", "--previous", str(previous)]
    proc = cli(*args)
    assert proc.returncode == 3, proc.stderr
    assert "REGRESSED TTFT p95" in proc.stdout and "new" in proc.stdout
    assert "1 of 2 cells regressed" in proc.stderr
    assert out.exists()
    proc = cli(*args, env={"INFERWATCH_REGRESSION_FACTOR": "1000"})
    assert proc.returncode == 0, proc.stdout


def test_command_fails_in_one_line_when_the_server_is_unreachable(tmp_path: Path, cli) -> None:
    proc = cli("--url", "http://127.0.0.1:9", "--model", "m", "--out", str(tmp_path / "b.yaml"))
    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "inferwatch: error: probe request to http://127.0.0.1:9/v1/completions failed: cannot connect"
        )
    )
    assert not (tmp_path / "b.yaml").exists()


@pytest.mark.parametrize(
    ("args", "env", "fragments"),
    [
        (["--concurrency", "1,x"], {}, ["--concurrency", "'1,x': 'x' is not a number"]),
        (["--concurrency", "1,1"], {}, ["lists 1 twice"]),
        (["--output-tokens", "1"], {}, ["below the minimum of 2"]),
        (["--api", "embeddings"], {}, ["not one of completions, chat"]),
        (["--regression-factor", "0.5"], {}, ["must be between 1 and 1000"]),
        (["--url", "localhost:8000"], {}, ["not an http:// or https:// URL"]),
        (["--out", "/nonexistent/b.yaml"], {}, ["directory /nonexistent does not exist"]),
        (["--previous", "/nope.yaml"], {}, ["/nope.yaml: no such file"]),
        ([], {"INFERWATCH_CONCURRENCY": "four"}, ["INFERWATCH_CONCURRENCY", "'four'"]),
        (["--replicas", "2"], {}, ["--replicas 2 needs --replica-url", "no replica's own page"]),
        (["--replica-url", "http://127.0.0.1:10"], {}, ["give --replicas too"]),
        (
            ["--replicas", "2", "--replica-url", "http://127.0.0.1:10", "--concurrency", "2,3"],
            {},
            ["--concurrency 3 is not a multiple of --replicas 2"],
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, cli, args: list[str], env: dict[str, str], fragments: list[str]
) -> None:
    base = ["--url", "http://127.0.0.1:9", "--model", "m", "--out", str(tmp_path / "b.yaml")]
    proc = cli(*base, *args, env=env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_required_flags_prompts_conflict_and_bad_files_exit_2(tmp_path: Path, cli) -> None:
    proc = cli("--url", "http://127.0.0.1:9", "--out", str(tmp_path / "b.yaml"))
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "inferwatch: error: --model is required (or INFERWATCH_MODEL)"
    )
    proc = cli(env={"INFERWATCH_URL": "http://127.0.0.1:9", "INFERWATCH_MODEL": "m"})
    assert proc.stderr.strip() == "inferwatch: error: --out is required (or INFERWATCH_OUT)"
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a"}\n')
    base = ["--url", "http://127.0.0.1:9", "--model", "m", "--out", str(tmp_path / "b.yaml")]
    proc = cli(*base, "--prompts", str(jsonl), "--prompt-tokens", "64")
    assert proc.returncode == 2 and "--prompts replaces --prompt-tokens" in proc.stderr
    jsonl.write_text("{oops\n")
    proc = cli(*base, "--prompts", str(jsonl))
    assert proc.returncode == 2 and f"{jsonl} line 1: not JSON" in proc.stderr
    bad = tmp_path / "old.yaml"
    bad.write_text("inferwatch_baseline: 2\n")
    proc = cli(*base, "--previous", str(bad))
    assert proc.returncode == 2 and f"baseline {bad}: not an inferwatch baseline" in proc.stderr


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_redraws_one_line_on_a_terminal_and_prints_lines_otherwise(fake: Fake) -> None:
    p = plan(fake.url, concurrency=(1, 2), prompt_tokens=(10,), output_tokens=(2,))
    terminal, log = _Terminal(), io.StringIO()
    for stream in (terminal, log):
        progress = report.Progress(stream, p)
        progress.start_cell(0, (1, 10, 2), 8)
        for _ in range(8):
            progress.request_done()
        progress.note("something to know")
        progress.end_cell(result(1, 0.05, 0.01))
        progress.close()
    shown = terminal.getvalue()
    assert "\n" not in shown.split("something to know\n")[1].rstrip("\n")  # redrawn in place
    assert "\r\x1b[K[############............] 8/16 requests  cell 1/2: concurrency 1" in shown
    assert log.getvalue().splitlines() == [
        "inferwatch: something to know",
        "cell 1/2: concurrency 1, prompt 10, output 2: 4/4 ok, TTFT p50 50.0 ms, 1.0 s",
    ]
