"""Traffic for the demo and the real-stack tests: bursts of OpenAI completions."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

MODEL = "tiny"


@dataclass(frozen=True)
class Burst:
    """``requests`` concurrent completions of ``prompt_words`` words, ``max_tokens`` out."""

    requests: int = 24
    prompt_words: int = 40
    max_tokens: int = 300


@dataclass(frozen=True)
class Request:
    """One request as its client saw it: monotonic times, and the HTTP status (0: none)."""

    sent: float
    answered: float
    status: int

    @property
    def seconds(self) -> float:
        return self.answered - self.sent


def prompt(words: int, salt: int = 0) -> str:
    """A prompt of about ``words`` tokens; ``salt`` defeats the prefix cache."""
    return f"{salt} " + " ".join(f"word{(salt * 31 + i) % 97}" for i in range(words))


async def complete(
    session: aiohttp.ClientSession,
    base_url: str,
    text: str,
    max_tokens: int,
    model: str = MODEL,
) -> int:
    """One non-streaming completion (of ``model``: the served model, or a LoRA adapter's
    name); returns the HTTP status."""
    body = {
        "model": model,
        "prompt": text,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    async with session.post(f"{base_url}/v1/completions", json=body) as resp:
        await resp.read()
        return resp.status


async def burst(base_url: str, spec: Burst, salt: int = 0) -> list[int]:
    """Send the burst at once and wait for all of it; returns the HTTP statuses."""
    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=spec.requests)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        return await asyncio.gather(
            *(
                complete(
                    session, base_url, prompt(spec.prompt_words, salt * 1000 + i), spec.max_tokens
                )
                for i in range(spec.requests)
            )
        )


async def complete_many(
    base_url: str,
    stop: asyncio.Event,
    *,
    clients: int,
    prompt_words: int,
    max_tokens: int,
    most_per_second: float | None = None,
    log: list[Request] | None = None,
) -> int:
    """``clients`` concurrent clients sending completions back to back until ``stop``; with
    ``most_per_second``, together at most that many a second (each waits out its share).

    Every request has its own prompt (no prefix-cache hits); failed requests (a server
    that died) are counted, not raised, and each is added to ``log`` as the client saw it.
    Returns the number of requests sent.
    """
    sent = 0
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=clients)
    spacing = clients / most_per_second if most_per_second else 0.0  # each client's

    async def client(session: aiohttp.ClientSession, n: int) -> None:
        nonlocal sent
        while not stop.is_set():
            sent += 1
            started = time.monotonic()
            status = 0
            try:
                status = await complete(
                    session, base_url, prompt(prompt_words, n * 1_000_000 + sent), max_tokens
                )
            except (aiohttp.ClientError, asyncio.TimeoutError):
                await asyncio.sleep(0.5)  # the server is down: do not spin
            if log is not None:
                log.append(Request(started, time.monotonic(), status))
            wait = started + spacing - time.monotonic()
            if wait > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)

    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await asyncio.gather(*(client(session, n) for n in range(clients)))
    return sent


async def open_loop(
    base_url: str,
    stop: asyncio.Event,
    stairs: Sequence[tuple[float, float]],
    *,
    prompt_words: int,
    max_tokens: int,
    max_in_flight: int = 512,
) -> int:
    """Completions sent at a rate whether or not the earlier ones have finished, as users
    send them: evenly spaced at each stair's requests/s for its seconds, in turn; then none
    until ``stop``. At most ``max_in_flight`` at once: past it an arrival is dropped, as a
    user gives up. Failed requests are counted, not raised; those still running at ``stop``
    are cancelled. Returns the number of requests sent."""
    sent = 0
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:

        async def one(n: int) -> None:
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                await complete(session, base_url, prompt(prompt_words, 7_000_000 + n), max_tokens)

        running: set[asyncio.Task] = set()
        loop = asyncio.get_running_loop()
        for rate, seconds in stairs:
            began = loop.time()
            for i in itertools.count():
                at = began + i / rate
                if at - began >= seconds:
                    break
                await asyncio.sleep(max(0.0, at - loop.time()))
                if stop.is_set():
                    break
                if len(running) >= max_in_flight:
                    continue
                sent += 1
                task = asyncio.create_task(one(sent))
                running.add(task)
                task.add_done_callback(running.discard)
            if stop.is_set():
                break
        await stop.wait()
        for task in list(running):
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    return sent
