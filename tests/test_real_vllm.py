"""inferwatch in front of a real vLLM on CPU: KV overflow, an engine stall, a dead server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from demo.stack import Inferwatch, VllmServer, http_get, metric_value
from demo.traffic import Burst, burst

from conftest import page_value

pytestmark = pytest.mark.vllm

POLL = 0.5
# Seconds after which a wait gives up: a guard against a hang, not a bound on how fast vLLM
# or inferwatch must be.
GIVE_UP = 300.0


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GIVE_UP
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def generated(server: VllmServer) -> float:
    return server.metric("vllm:generation_tokens_total")


def polled(sidecar: Inferwatch, name: str) -> float | None:
    """``name`` on the sidecar's page, or None where its last poll of vLLM failed: under a
    burst on this 2-core machine vLLM's /metrics can miss the poll's timeout, and the page
    then says ``backend_up 0`` without the backend's series, as it must."""
    page = sidecar.page()
    if metric_value(page, "inferwatch_backend_up") == 0.0:
        return None
    return metric_value(page, name)


def seen_after(server: VllmServer, sidecar: Inferwatch, tokens: float) -> None:
    """Returns once vLLM has counted ``tokens`` generated tokens in all and the sidecar has
    polled it since: the sidecar's page is then of a poll after the traffic that made them.

    A burst makes exactly requests x max_tokens tokens (``ignore_eos``); vLLM counts them
    just after it answers, so the count is awaited on its own page first.
    """
    wait_until(lambda: generated(server) >= tokens, f"vLLM never counted {tokens:g} tokens")
    final = generated(server)
    wait_until(
        lambda: (polled(sidecar, "inferwatch_generation_tokens_total") or 0.0) >= final,
        "the sidecar never polled vLLM after the burst",
    )


@pytest.fixture
def sidecar(vllm_server: VllmServer, tmp_path: Path):
    vllm_server.ensure_running()
    iw = Inferwatch(tmp_path, vllm_server.url, ["--backend", "auto", "--poll-interval", str(POLL)])
    iw.start()
    yield iw
    iw.stop()


def test_numbers_match_the_servers_own_page(vllm_server: VllmServer, sidecar: Inferwatch) -> None:
    tokens = generated(vllm_server) + 4 * 20
    asyncio.run(burst(vllm_server.url, Burst(requests=4, max_tokens=20)))
    seen_after(vllm_server, sidecar, tokens)
    assert sidecar.metric("inferwatch_backend_up") == 1.0
    for ours, theirs in [
        ("inferwatch_prompt_tokens_total", "vllm:prompt_tokens_total"),
        ("inferwatch_generation_tokens_total", "vllm:generation_tokens_total"),
        ("inferwatch_engine_steps_total", "vllm:iteration_tokens_total_count"),
        ("inferwatch_time_to_first_token_seconds_count", "vllm:time_to_first_token_seconds_count"),
    ]:
        assert sidecar.metric(ours) == vllm_server.metric(theirs), ours
    version = json.loads(http_get(f"{vllm_server.url}/version")[1])["version"]
    info = {"backend": "vllm", "model": "tiny", "version": version}
    assert page_value(sidecar.page(), "inferwatch_backend_info", **info) == 1.0


async def _watch_waiting(sidecar: Inferwatch, task: asyncio.Task) -> float:
    peak = 0.0
    while not task.done():
        waiting = await asyncio.to_thread(polled, sidecar, "inferwatch_requests_waiting")
        peak = max(peak, waiting or 0.0)
        await asyncio.sleep(0.05)
    return peak


def test_kv_overflow_shows_a_queue_during_the_burst_and_preemptions_after(
    vllm_server: VllmServer, sidecar: Inferwatch
) -> None:
    preempted_before = sidecar.metric("inferwatch_preemptions_total")
    tokens = generated(vllm_server) + 24 * 300

    async def scenario() -> tuple[float, list[int]]:
        task = asyncio.create_task(
            burst(vllm_server.url, Burst(requests=24, max_tokens=300), salt=1)
        )
        peak = await _watch_waiting(sidecar, task)
        return peak, await task

    peak_waiting, statuses = asyncio.run(scenario())
    assert statuses == [200] * 24
    assert peak_waiting > 0, "inferwatch never saw a queue while the burst overflowed the KV cache"
    seen_after(vllm_server, sidecar, tokens)
    assert sidecar.metric("inferwatch_preemptions_total") > preempted_before
    assert sidecar.metric("inferwatch_requests_waiting") == 0.0


def test_engine_stall_with_a_queue_counts_queued_while_idle_seconds(
    vllm_server: VllmServer, sidecar: Inferwatch
) -> None:
    before = sidecar.metric("inferwatch_queued_while_idle_seconds_total")
    tokens = generated(vllm_server) + 24 * 300
    engine = vllm_server.engine_core_pid()

    def flag() -> float | None:
        return polled(sidecar, "inferwatch_queued_while_idle")

    def counted() -> float:
        return sidecar.metric("inferwatch_queued_while_idle_seconds_total") - before

    async def scenario() -> float:
        task = asyncio.create_task(
            burst(vllm_server.url, Burst(requests=24, max_tokens=300), salt=2)
        )
        deadline = time.monotonic() + GIVE_UP
        # Act the moment the server itself reports a queue (the burst is over in seconds),
        # noting when its engine last stepped: a long step just before the stop is stalled
        # time too, as far as any poll can tell.
        steps, last_step_at = -1.0, time.monotonic()
        while True:
            page = (await asyncio.to_thread(http_get, f"{vllm_server.url}/metrics"))[1].decode()
            if (now_steps := metric_value(page, "vllm:iteration_tokens_total_count")) != steps:
                steps, last_step_at = now_steps, time.monotonic()
            if metric_value(page, "vllm:num_requests_waiting") > 0:
                break
            assert time.monotonic() < deadline, "the burst never queued"
            await asyncio.sleep(0.005)
        os.kill(engine, signal.SIGSTOP)
        try:
            # Stopped until the sidecar has raised the flag and counted 2 s of the stall.
            await asyncio.to_thread(
                wait_until, lambda: flag() == 1.0, "queued_while_idle was not raised in the stall"
            )
            await asyncio.to_thread(wait_until, lambda: counted() >= 2.0, "the stall never counted")
        finally:
            os.kill(engine, signal.SIGCONT)
        # The first poll that sees the engine step again ends the stall: the flag and the
        # count are read from that one page (a long step of the queue's prefill after the
        # resume is a stretch of its own, judged afresh).
        await asyncio.to_thread(
            wait_until, stall_ended, "queued_while_idle stayed raised after the stall"
        )
        seen = time.monotonic() - last_step_at
        await task
        return seen

    ended: list[float] = []  # the count on the first page that shows the stall over

    def stall_ended() -> bool:
        page = sidecar.page()
        if metric_value(page, "inferwatch_backend_up") == 0.0:
            return False
        if metric_value(page, "inferwatch_queued_while_idle") != 0.0:
            return False
        ended.append(metric_value(page, "inferwatch_queued_while_idle_seconds_total") - before)
        return True

    seen = asyncio.run(scenario())
    seen_after(vllm_server, sidecar, tokens)
    grew = ended[-1]
    # Counted from the last poll that saw the engine step before the stop (at most a poll
    # interval after its last step, two for a poll late under the burst's load) to the last
    # before the sidecar saw it step again.
    assert 2.0 <= grew <= seen + 2 * POLL, f"no step for {seen:.2f} s, counted {grew:.2f} s"
    assert counted() >= grew  # a counter


def test_dead_server_flips_backend_up_while_metrics_keeps_answering(
    vllm_server: VllmServer, sidecar: Inferwatch
) -> None:
    assert sidecar.metric("inferwatch_backend_up") == 1.0
    vllm_server.stop()
    wait_until(
        lambda: sidecar.metric("inferwatch_backend_up") == 0.0,
        "backend_up stayed 1 after the server died",
    )
    page = sidecar.page()
    assert 'inferwatch_collector_success{collector="backend"} 0.0' in page
    assert "inferwatch_requests_waiting" not in page
    assert "inferwatch_queued_while_idle_seconds_total" in page  # our own counters survive
    log = sidecar.process.tail(50)
    assert "backend scrape failing: cannot connect to" in log
