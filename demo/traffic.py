"""Traffic for the demo and the real-stack tests: bursts of OpenAI completions."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

MODEL = "tiny"


@dataclass(frozen=True)
class Burst:
    """``requests`` concurrent completions of ``prompt_words`` words, ``max_tokens`` out."""

    requests: int = 24
    prompt_words: int = 40
    max_tokens: int = 300


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
) -> int:
    """``clients`` concurrent clients sending completions back to back until ``stop``.

    Every request has its own prompt (no prefix-cache hits); failed requests (a server
    that died) are counted, not raised. Returns the number of requests sent.
    """
    sent = 0
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=clients)

    async def client(session: aiohttp.ClientSession, n: int) -> None:
        nonlocal sent
        while not stop.is_set():
            sent += 1
            try:
                await complete(
                    session, base_url, prompt(prompt_words, n * 1_000_000 + sent), max_tokens
                )
            except (aiohttp.ClientError, asyncio.TimeoutError):
                await asyncio.sleep(0.5)  # the server is down: do not spin

    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await asyncio.gather(*(client(session, n) for n in range(clients)))
    return sent
