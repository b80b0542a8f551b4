"""The engine's biggest batch and its longest step, measured with two bursts: what
``inferwatch calibrate`` writes as ``engine_step_seconds`` (``collect/steps.py`` reads it).

A burst of short requests with long answers finds the most the server runs at once; then one
and a half such batches that fill its KV cache twice over make it preempt and recompute,
while the sidecar's polls time the longest stretch without a step. Sample of what calibrate
prints::

    inferwatch: engine_step_seconds 1.62 (the longest stretch without an engine step while
    24 requests of 640 tokens ran on a batch of 16 and a KV cache of 5120 tokens)
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from inferwatch.collect.stream import Client
from inferwatch.tools.normal_traffic import EmbeddedSidecar
from inferwatch.tools.sweep.prompts import Prompts

# The first burst: this many requests at once, each answering this many tokens.
BATCH_PROBE_REQUESTS = 64
BATCH_PROBE_OUTPUT = 64
# Tokens a request leaves free of the context, for what the API adds around the prompt.
CONTEXT_SLACK = 8


@dataclass(frozen=True)
class LongestStep:
    seconds: float
    source: str  # where it came from, for the config's comment


async def _watch(sidecar: EmbeddedSidecar, burst: asyncio.Task, on_poll: Callable) -> None:
    """Call ``on_poll(now, snapshot)`` at every poll of the sidecar until ``burst`` ends."""
    loop = asyncio.get_running_loop()
    while not burst.done():
        on_poll(loop.time(), sidecar.snapshot)
        await asyncio.sleep(sidecar.poller.settings.interval)
    await burst


async def biggest_batch(
    sidecar: EmbeddedSidecar, client: Client, prompts: Prompts, prompt_tokens: int, tag: int
) -> int:
    """The most requests the server ran at once under a burst of
    :data:`BATCH_PROBE_REQUESTS` (0: it reports no running requests)."""
    sends = [
        client.stream(prompts.for_request(tag, i, prompt_tokens), BATCH_PROBE_OUTPUT)
        for i in range(BATCH_PROBE_REQUESTS)
    ]
    most = 0.0

    def on_poll(_: float, snapshot) -> None:
        nonlocal most
        if snapshot.backend is not None:
            most = max(most, snapshot.backend.total("requests_running") or 0.0)

    await _watch(sidecar, asyncio.ensure_future(asyncio.gather(*sends)), on_poll)
    return int(most)


async def max_model_len(root: str, model: str, timeout: float) -> int | None:
    """The context length the server says the model has (``/v1/models``: vLLM's and
    SGLang's ``max_model_len``), or None."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.get(f"{root}/v1/models") as response,
        ):
            if response.status != 200:
                return None
            doc = await response.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None
    cards = doc.get("data") if isinstance(doc, dict) else None
    for card in cards if isinstance(cards, list) else []:
        length = card.get("max_model_len") if isinstance(card, dict) else None
        if card.get("id") == model and isinstance(length, int) and length > 0:
            return length
    return None


async def longest_step(
    sidecar: EmbeddedSidecar,
    client: Client,
    prompts: Prompts,
    prompt_tokens: int,
    tag: int,
    context: int | None,
) -> LongestStep | str:
    """The longest stretch without an engine step while requests run or wait, over a burst
    that overflows the KV cache at the server's biggest batch; or why it cannot be
    measured."""
    snapshot = sidecar.snapshot
    kv = snapshot.backend.total("kv_cache_capacity_tokens") if snapshot.backend else None
    if not kv:
        return "the server reports no KV-cache capacity to size the burst on"
    batch = await biggest_batch(sidecar, client, prompts, prompt_tokens, tag)
    if batch == 0:
        return "the server reports no running requests"
    tokens = math.ceil(2 * kv / batch)
    if context is not None:
        tokens = min(tokens, context - CONTEXT_SLACK)
    requests = batch + batch // 2
    output = max(2, tokens - prompt_tokens)
    sends = [
        client.stream(prompts.for_request(tag + 1, i, prompt_tokens), output)
        for i in range(requests)
    ]
    longest, since, steps = 0.0, None, None

    def on_poll(now: float, snapshot) -> None:
        nonlocal longest, since, steps
        sample = snapshot.backend
        if sample is None:
            return
        working = (sample.total("requests_running") or 0) + (
            sample.total("requests_waiting") or 0
        ) > 0
        count = sample.total("engine_steps")
        if count != steps or not working:
            if since is not None and count != steps and working:
                longest = max(longest, now - since)
            since, steps = now, count

    await _watch(sidecar, asyncio.ensure_future(asyncio.gather(*sends)), on_poll)
    if steps is None:
        return "the server reports no engine steps"
    return LongestStep(
        round(longest, 3),
        f"the longest stretch without an engine step while {requests} requests of "
        f"{prompt_tokens + output} tokens ran on a batch of {batch} and a KV cache of "
        f"{kv:g} tokens (read every {sidecar.poller.settings.interval:g} s)",
    )
