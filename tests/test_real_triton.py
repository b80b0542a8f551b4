"""inferwatch in front of a real Triton Inference Server on CPU.

``tritonserver`` comes in the PyPI wheel ``nvidia-pytriton`` (installed in its own
environment: it pins numpy < 2); its Python is looked up at ``$INFERWATCH_TRITON_PYTHON``,
else ``.venv-triton/bin/python`` (``make test`` installs it). The model is
tests/pytriton_tiny.py: one slow Python model, so requests queue in Triton, and a model
that can be stalled (SIGSTOP) while Triton keeps serving metrics: queued-while-idle, for
real, from engine progress alone (no NVML).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from demo.stack import Process, free_port
from inferwatch.collect.backends import TRITON
from inferwatch.collect.poller import Poller
from inferwatch.collect.steps import STEP_FLOOR

from conftest import auto_poller, page_value

pytestmark = pytest.mark.triton

HERE = Path(__file__).resolve().parent
TRITON_PYTHON = Path(
    os.environ.get("INFERWATCH_TRITON_PYTHON", HERE.parent / ".venv-triton/bin/python")
)
SECONDS_PER_EXECUTION = 0.3
TINY = (("model", "tiny"),)


class TritonServer:
    """PyTriton's tritonserver with the tiny model, in its own process group, always stopped."""

    def __init__(self, log: Path) -> None:
        self.http, grpc, metrics = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.http}"
        self.metrics_url = f"http://127.0.0.1:{metrics}"
        argv = [str(TRITON_PYTHON), str(HERE / "pytriton_tiny.py")]
        argv += [str(self.http), str(grpc), str(metrics), str(SECONDS_PER_EXECUTION)]
        self.process = Process("triton", argv, log).start()

    def wait_ready(self, timeout: float = 120.0) -> None:
        self.process.wait_http(self.url + "/v2/models/tiny/ready", timeout)

    def stall_model(self, stalled: bool) -> None:
        """Stop or resume the process that runs the model (Triton itself keeps running)."""
        os.kill(self.process.pid, signal.SIGSTOP if stalled else signal.SIGCONT)

    def stop(self) -> None:
        """Stop the whole group (PyTriton, tritonserver, the Python-backend stub)."""
        self.stall_model(False)
        self.process.stop(timeout=20)


@pytest.fixture(scope="module")
def triton_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    assert TRITON_PYTHON.is_file(), (
        f"no nvidia-pytriton Python at {TRITON_PYTHON}: run `make test` (or set "
        "INFERWATCH_TRITON_PYTHON)"
    )
    server = TritonServer(tmp_path_factory.mktemp("triton") / "triton.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture
async def poller(triton_server: TritonServer) -> AsyncIterator[Poller]:
    async with auto_poller(triton_server.metrics_url, 0.25) as made:
        yield made


async def infer(session: aiohttp.ClientSession, server: TritonServer) -> int:
    body = {"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]}
    async with session.post(server.url + "/v2/models/tiny/infer", json=body) as resp:
        return resp.status


async def raw_page(session: aiohttp.ClientSession, server: TritonServer) -> str:
    async with session.get(server.metrics_url + "/metrics") as resp:
        return await resp.text()


async def test_recognised_on_the_metrics_port_and_queue_and_progress_exact(
    triton_server, poller
) -> None:
    await poller.poll_once()
    assert poller.backend is TRITON
    assert poller.snapshot.backend.model == "tiny"
    async with aiohttp.ClientSession() as session:
        before = await raw_page(session, triton_server)
        burst = asyncio.gather(*(infer(session, triton_server) for _ in range(6)))
        waiting_seen = 0.0
        while not burst.done():
            snapshot = await poller.poll_once()
            waiting_seen = max(waiting_seen, snapshot.backend.total("requests_waiting") or 0)
            await asyncio.sleep(0.05)
        assert await burst == [200] * 6
        after = await raw_page(session, triton_server)
    await poller.poll_once()
    assert waiting_seen >= 1  # one execution at a time: the rest wait in Triton's queue
    executions = page_value(after, "nv_inference_exec_count", model="tiny")
    assert executions - page_value(before, "nv_inference_exec_count", model="tiny") == 6
    values = poller.snapshot.backend.values
    assert values["engine_steps"] == {TINY: executions}
    assert values["requests_waiting"] == {TINY: 0.0}


async def test_stalled_model_with_a_queue_is_queued_while_idle(triton_server, poller) -> None:
    key = (("backend", "triton"), ("model", "tiny"))
    async with aiohttp.ClientSession() as session:
        await poller.poll_once()
        stall_began = poller.last_poll_at
        triton_server.stall_model(True)
        try:
            requests = asyncio.gather(*(infer(session, triton_server) for _ in range(4)))
            states = []
            for _ in range(8):  # 2 s of polls while the model is stopped
                await asyncio.sleep(0.25)
                snapshot = await poller.poll_once()
                states.append(snapshot.derived.queued_while_idle.get(key, False))
            stalled_seconds = snapshot.derived.queued_while_idle_seconds_total[key]
            snapshot_at = poller.last_poll_at
            page = await raw_page(session, triton_server)
            assert page_value(page, "nv_inference_pending_request_count", model="tiny") >= 1
        finally:
            triton_server.stall_model(False)
        assert await requests == [200] * 4
    assert states[-1] is True and states.count(True) >= 5
    # Counted from the stall's start once it outlasted STEP_FLOOR, on the poll's clock.
    assert STEP_FLOOR < stalled_seconds <= snapshot_at - stall_began
    for _ in range(3):  # resumed and drained: nothing more is counted
        snapshot = await poller.poll_once()
    assert snapshot.derived.queued_while_idle[key] is False
    total = snapshot.derived.queued_while_idle_seconds_total[key]
    await asyncio.sleep(0.3)
    assert (await poller.poll_once()).derived.queued_while_idle_seconds_total[key] == total
