"""inferwatch in front of a real vLLM on CPU: KV overflow, an engine stall, a dead server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from demo.stack import Inferwatch, VllmServer, http_get, metric_value
from demo.traffic import Burst, burst

from conftest import page_value

pytestmark = pytest.mark.vllm

POLL = 0.5


@pytest.fixture
def sidecar(vllm_server: VllmServer, tmp_path: Path):
    vllm_server.ensure_running()
    iw = Inferwatch(tmp_path, vllm_server.url, ["--backend", "auto", "--poll-interval", str(POLL)])
    iw.start()
    yield iw
    iw.stop()


def test_numbers_match_the_servers_own_page(vllm_server: VllmServer, sidecar: Inferwatch) -> None:
    asyncio.run(burst(vllm_server.url, Burst(requests=4, max_tokens=20)))
    time.sleep(2 * POLL)  # one full poll after the burst has finished
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
        page = await asyncio.to_thread(sidecar.page)
        peak = max(peak, metric_value(page, "inferwatch_requests_waiting"))
        await asyncio.sleep(0.05)
    return peak


def test_kv_overflow_shows_a_queue_during_the_burst_and_preemptions_after(
    vllm_server: VllmServer, sidecar: Inferwatch
) -> None:
    preempted_before = sidecar.metric("inferwatch_preemptions_total")

    async def scenario() -> tuple[float, list[int]]:
        task = asyncio.create_task(
            burst(vllm_server.url, Burst(requests=24, max_tokens=300), salt=1)
        )
        peak = await _watch_waiting(sidecar, task)
        return peak, await task

    peak_waiting, statuses = asyncio.run(scenario())
    assert statuses == [200] * 24
    assert peak_waiting > 0, "inferwatch never saw a queue while the burst overflowed the KV cache"
    time.sleep(2 * POLL)
    assert sidecar.metric("inferwatch_preemptions_total") > preempted_before
    assert sidecar.metric("inferwatch_requests_waiting") == 0.0


def test_engine_stall_with_a_queue_counts_queued_while_idle_seconds(
    vllm_server: VllmServer, sidecar: Inferwatch
) -> None:
    before = sidecar.metric("inferwatch_queued_while_idle_seconds_total")
    engine = vllm_server.engine_core_pid()

    async def scenario() -> float:
        task = asyncio.create_task(
            burst(vllm_server.url, Burst(requests=24, max_tokens=300), salt=2)
        )
        deadline = time.monotonic() + 60
        # Act the moment the server itself reports a queue (the burst is over in seconds).
        while await asyncio.to_thread(vllm_server.metric, "vllm:num_requests_waiting") <= 0:
            assert time.monotonic() < deadline, "the burst never queued"
            await asyncio.sleep(0.005)
        os.kill(engine, signal.SIGSTOP)
        stalled_at = time.monotonic()
        try:
            await asyncio.sleep(3.0)
            flag = metric_value(
                await asyncio.to_thread(sidecar.page), "inferwatch_queued_while_idle"
            )
        finally:
            os.kill(engine, signal.SIGCONT)
        stalled = time.monotonic() - stalled_at
        assert flag == 1.0, "queued_while_idle was not raised during the stall"
        await task
        return stalled

    stalled = asyncio.run(scenario())
    time.sleep(2 * POLL)
    grew = sidecar.metric("inferwatch_queued_while_idle_seconds_total") - before
    assert 2.0 <= grew <= 4.0, f"stalled {stalled:.2f} s, counted {grew:.2f} s"


def test_dead_server_flips_backend_up_while_metrics_keeps_answering(
    vllm_server: VllmServer, sidecar: Inferwatch
) -> None:
    assert sidecar.metric("inferwatch_backend_up") == 1.0
    vllm_server.stop()
    deadline = time.monotonic() + 10
    while sidecar.metric("inferwatch_backend_up") != 0.0:
        assert time.monotonic() < deadline, "backend_up stayed 1 after the server died"
        time.sleep(0.1)
    page = sidecar.page()
    assert 'inferwatch_collector_success{collector="backend"} 0.0' in page
    assert "inferwatch_requests_waiting" not in page
    assert "inferwatch_queued_while_idle_seconds_total" in page  # our own counters survive
    log = sidecar.process.tail(50)
    assert "backend scrape failing: cannot connect to" in log
