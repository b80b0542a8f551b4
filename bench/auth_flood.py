"""Authenticated ``/metrics`` latency under a flood of wrong passwords (prints figures; not a
test).

A real ``inferwatch serve`` process with basic auth at bcrypt cost 12 (docs/security.md,
"Password checks under a flood"), polling a loopback backend that serves a real vLLM
capture. One scraper with the right password (its check cached after the first scrape) asks
for ``/metrics`` every 100 ms: first with no flood, then while the security issue's flood
runs, 240 requests with distinct wrong passwords at concurrency 120, repeated back to back
for ``--seconds``. Printed: the scraper's p50/p99 latency in both phases, measured in the
same run, and what the flood got (401: its password was checked; 503: every check slot was
taken).

    .venv/bin/python bench/auth_flood.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import bcrypt
from aiohttp import web

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from demo.stack import Inferwatch, Process, free_port  # noqa: E402

CAPTURE = REPO / "tests" / "fixtures" / "vllm-0.32.0-cpu-loaded-kv-full.prom"
PASSWORD = "correct horse battery staple"
COST = 12
FLOOD_REQUESTS = 240
FLOOD_CONCURRENCY = 120
SCRAPE_EVERY = 0.1


def serve_capture(port: int) -> None:
    """The backend (run in a child process): the capture on /metrics."""
    page = CAPTURE.read_text()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


@dataclass
class Phase:
    """What the scraper saw in one phase."""

    scrapes: list[tuple[float, int]] = field(default_factory=list)  # (seconds, status)
    poll_ages: list[float] = field(default_factory=list)  # /healthz' last_poll_age_seconds

    def line(self, label: str) -> str:
        latencies = [s for s, _ in self.scrapes]
        failed = sum(status != 200 for _, status in self.scrapes)
        return (
            f"  {label:<17} /metrics p50 {percentile(latencies, 50) * 1000:7.1f} ms  "
            f"p99 {percentile(latencies, 99) * 1000:7.1f} ms  ({len(self.scrapes)} scrapes, "
            f"{failed} not 200); oldest poll seen {max(self.poll_ages):.1f} s"
        )


async def scrape(url: str, stop: asyncio.Event) -> Phase:
    """The scraper (its pass cached) and a look at /healthz every tick until ``stop``."""
    phase = Phase()
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while not stop.is_set():
            start = time.perf_counter()
            async with session.get(f"{url}/metrics", headers=basic("prometheus", PASSWORD)) as r:
                await r.read()
            phase.scrapes.append((time.perf_counter() - start, r.status))
            async with session.get(f"{url}/healthz") as r:
                phase.poll_ages.append((await r.json())["last_poll_age_seconds"])
            await asyncio.sleep(SCRAPE_EVERY)
    return phase


async def flood(url: str, first: int) -> collections.Counter[int]:
    """The issue's flood: distinct wrong passwords numbered from ``first``; statuses counted."""
    statuses: collections.Counter[int] = collections.Counter()
    gate = asyncio.Semaphore(FLOOD_CONCURRENCY)
    connector = aiohttp.TCPConnector(limit=FLOOD_CONCURRENCY)
    timeout = aiohttp.ClientTimeout(total=600)

    async def guess(session: aiohttp.ClientSession, n: int) -> None:
        wrong = basic("prometheus", f"guess {n}")
        async with gate, session.get(f"{url}/metrics", headers=wrong) as resp:
            await resp.read()
            statuses[resp.status] += 1

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(guess(session, first + n) for n in range(FLOOD_REQUESTS)))
    return statuses


async def first_scrape(url: str, delay: float) -> tuple[float, int]:
    """(seconds, status) of the first scrape of a user not seen before, after ``delay``."""
    await asyncio.sleep(delay)
    start = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=120)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"{url}/metrics", headers=basic("late", PASSWORD)) as resp,
    ):
        await resp.read()
    return time.perf_counter() - start, resp.status


async def phase(url: str, seconds: float, flooded: bool) -> tuple[Phase, str]:
    """The scraper for ``seconds``, or while the flood runs back to back for ``seconds`` (at
    least once); with the flood, what it and a first-time user got."""
    stop = asyncio.Event()
    scraper = asyncio.create_task(scrape(url, stop))
    if not flooded:
        await asyncio.sleep(seconds)
        stop.set()
        return await scraper, ""
    late = asyncio.create_task(first_scrape(url, delay=1.0))
    statuses: collections.Counter[int] = collections.Counter()
    floods, start = 0, time.monotonic()
    while floods == 0 or time.monotonic() - start < seconds:
        statuses += await flood(url, floods * FLOOD_REQUESTS)
        floods += 1
    took = time.monotonic() - start
    stop.set()
    late_seconds, late_status = await late
    answers = ", ".join(f"{count} x {status}" for status, count in sorted(statuses.items()))
    return await scraper, (
        f"  flood: {floods} x {FLOOD_REQUESTS} wrong passwords at concurrency "
        f"{FLOOD_CONCURRENCY} in {took:.1f} s: {answers}\n"
        f"  a user's first scrape 1 s into the flood: {late_status} "
        f"in {late_seconds * 1000:.0f} ms"
    )


async def measure(url: str, seconds: float) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/metrics", headers=basic("prometheus", PASSWORD)) as resp,
    ):
        assert resp.status == 200, resp.status  # the scraper's pass, cached from now on
    quiet, _ = await phase(url, seconds, flooded=False)
    loud, flood_lines = await phase(url, seconds, flooded=True)
    print(f"bcrypt cost {COST}; the scraper (its password checked once) every {SCRAPE_EVERY:g} s")
    print(quiet.line("no flood"))
    print(loud.line("during the flood"))
    print(flood_lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--serve-capture", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_capture:
        serve_capture(args.serve_capture)
        return
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        users = {
            user: bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=COST)).decode()
            for user in ("prometheus", "late")
        }
        web_config = workdir / "web-config.yml"
        web_config.write_text(json.dumps({"basic_auth_users": users}))
        port = free_port()
        argv = [sys.executable, __file__, "--serve-capture", str(port)]
        backend = Process("backend", argv, workdir / "backend.log").start()
        sidecar = Inferwatch(
            workdir,
            f"http://127.0.0.1:{port}",
            ["--backend", "vllm", "--gpu", "off", "--web.config.file", str(web_config)],
        )
        try:
            backend.wait_http(f"http://127.0.0.1:{port}/metrics", 30)
            sidecar.start()
            asyncio.run(measure(sidecar.url, args.seconds))
        finally:
            sidecar.stop()
            backend.stop()


if __name__ == "__main__":
    main()
