"""LoRA adapters on the real vLLM (CPU): two tiny adapters and room for one in the batch.

Requests for the second adapter wait for the slot the first holds: vLLM counts them as
waiting ``reason="deferred"``, and the sidecar maps them to ``inferwatch_requests_deferred``
(the queue that more capacity would not shorten) beside the adapters in use and the most the
batch holds.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from demo.stack import Inferwatch, VllmServer, tiny_lora
from demo.traffic import complete

pytestmark = pytest.mark.vllm

GIVE_UP = 120.0  # a guard against a hang, not a bound on how fast anything must be


def test_requests_waiting_for_their_adapter_are_deferred_not_capacity(tmp_path: Path) -> None:
    adapters = {"lora-a": tiny_lora("a", 1), "lora-b": tiny_lora("b", 2)}
    server = VllmServer(
        tmp_path,
        extra_args=[
            "--enable-lora", "--max-loras", "1", "--max-lora-rank", "8",
            "--lora-modules", *(f"{name}={path}" for name, path in adapters.items()),
        ],
    ).start()  # fmt: skip
    sidecar = Inferwatch(
        tmp_path, server.url, ["--backend", "vllm", "--gpu", "off", "--poll-interval", "0.25"]
    ).start()
    seen: dict[str, float] = {}
    try:

        async def load() -> None:
            async with aiohttp.ClientSession() as session:
                requests = [
                    complete(session, server.url, "the request waits", 400, model=name)
                    for name in ("lora-a",) * 3 + ("lora-b",) * 3
                ]
                watch = asyncio.create_task(asyncio.to_thread(watch_deferred, sidecar, seen))
                assert set(await asyncio.gather(*requests)) == {200}
                await watch

        asyncio.run(load())
    finally:
        sidecar.stop()
        server.stop()
    print(f"\nLoRA, 3 requests per adapter, one adapter slot: the sidecar saw {seen}")
    assert seen["inferwatch_requests_deferred"] >= 1
    assert seen["inferwatch_lora_adapters_max"] == 1
    assert seen["inferwatch_lora_adapters_active"] >= 1


def watch_deferred(sidecar: Inferwatch, seen: dict[str, float]) -> None:
    """Until the sidecar's page shows a deferred request: what it shows then."""
    started = time.monotonic()
    names = (
        "inferwatch_requests_deferred",
        "inferwatch_lora_adapters_active",
        "inferwatch_lora_adapters_max",
    )
    while time.monotonic() - started < GIVE_UP:
        page = sidecar.page()
        try:
            values = {name: sidecar.metric(name) for name in names}
        except KeyError:
            values = {}
        if values.get("inferwatch_requests_deferred", 0) > 0:
            seen.update(values)
            return
        assert "inferwatch_backend_up" in page
        time.sleep(0.1)
    raise AssertionError(f"no deferred request seen in {GIVE_UP:g} s")
