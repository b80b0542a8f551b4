"""The demo's traffic generators (demo/traffic.py) against a server of the test's own."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from demo.traffic import complete_many


async def test_clients_kept_to_a_rate_send_no_more_than_it(aiohttp_server) -> None:
    """The demo's normal traffic is held under a share of the measured capacity: two clients
    that would send back to back as fast as the server answers send at most that rate."""
    answered = 0

    async def completions(_: web.Request) -> web.Response:
        nonlocal answered
        answered += 1
        return web.json_response({"choices": [{"text": "x"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    server = await aiohttp_server(app)
    stop = asyncio.Event()
    started = time.monotonic()
    sending = asyncio.create_task(
        complete_many(
            str(server.make_url("")).rstrip("/"),
            stop,
            clients=2,
            prompt_words=3,
            max_tokens=4,
            most_per_second=10.0,
        )
    )
    await asyncio.sleep(1.0)
    stop.set()
    sent = await asyncio.wait_for(sending, 5)
    seconds = time.monotonic() - started
    assert 2 <= sent == answered <= 10.0 * seconds + 2  # each client's first is at once
