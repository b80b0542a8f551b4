"""Authenticated ``/metrics`` latency under a flood of wrong passwords, or of connections
held half-sent (prints figures; not a test).

A real ``inferwatch serve`` process with basic auth at bcrypt cost 12 (docs/security.md,
"Password checks under a flood"), polling a loopback backend that serves a real vLLM
capture. One scraper with the right password (its check cached after the first scrape) asks
for ``/metrics`` every 100 ms: first with no flood, then while the security issue's flood
runs, 240 requests with distinct wrong passwords at concurrency 120, repeated back to back
for ``--seconds``. Printed: the scraper's p50/p99 latency in both phases, measured in the
same run, and what the flood got (401: its password was checked; 503: every check slot was
taken).

With ``--held-connections N`` the flood is N connections that each send half a request's
head and hold it (docs/security.md, "Connections"), against a sidecar limited to 1,024 open
files (``prlimit``, a usual container default); each connection the sidecar closes is
opened again at once. Printed: the scraper's p50/p99 latency without and during the flood,
how often the sidecar closed a held connection, and the most files it held open.

    .venv/bin/python bench/auth_flood.py [--seconds 10] [--held-connections 1100]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import json
import os
import resource
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

from demo.stack import Process, free_port  # noqa: E402

CAPTURE = REPO / "tests" / "fixtures" / "vllm-0.32.0-cpu-loaded-kv-full.prom"
PASSWORD = "correct horse battery staple"
COST = 12
FLOOD_REQUESTS = 240
FLOOD_CONCURRENCY = 120
SCRAPE_EVERY = 0.1
OPEN_FILES = 1024  # the sidecar's open-file limit under --held-connections
HALF_SENT = b"GET /metrics HTTP/1.1\r\nHost: sidecar\r\n"  # no blank line: never whole


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


async def scrape(url: str, stop: asyncio.Event, headers: dict[str, str] | None = None) -> Phase:
    """The scraper (with ``headers``: its pass, cached by the sidecar) and a look at /healthz
    every tick until ``stop``."""
    phase = Phase()
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while not stop.is_set():
            start = time.perf_counter()
            async with session.get(f"{url}/metrics", headers=headers) as r:
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
    scraper = asyncio.create_task(scrape(url, stop, basic("prometheus", PASSWORD)))
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


async def hold(host: str, port: int, stop: asyncio.Event) -> int:
    """One connection holding a half-sent request, opened again whenever the sidecar closes
    it, until ``stop``; how many times it was closed."""
    closed = 0
    stopping = asyncio.create_task(stop.wait())
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        writer.write(HALF_SENT)
        ended = asyncio.create_task(reader.read())
        await asyncio.wait([ended, stopping], return_when=asyncio.FIRST_COMPLETED)
        closed += ended.done()
        ended.cancel()
        writer.close()
    return closed


async def held_phase(url: str, seconds: float, connections: int, pid: int) -> tuple[Phase, str]:
    """The scraper for ``seconds`` while ``connections`` half-sent requests are held open."""
    host, port = url.removeprefix("http://").split(":")
    stop = asyncio.Event()
    holders = [asyncio.create_task(hold(host, int(port), stop)) for _ in range(connections)]
    await asyncio.sleep(1.0)  # every connection opened
    files = 0
    scraper = asyncio.create_task(scrape(url, stop, basic("prometheus", PASSWORD)))
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        files = max(files, len(os.listdir(f"/proc/{pid}/fd")))
        await asyncio.sleep(0.1)
    stop.set()
    closed = sum(await asyncio.gather(*holders))
    return await scraper, (
        f"  flood: {connections} connections held half-sent for {seconds:g} s against a "
        f"sidecar limited to {OPEN_FILES} open files: it closed them {closed} times; the "
        f"most files it held open: {files}"
    )


async def measure_held(url: str, seconds: float, connections: int, pid: int) -> None:
    await first_pass(url)
    quiet, _ = await phase(url, seconds, flooded=False)
    loud, flood_lines = await held_phase(url, seconds, connections, pid)
    print(f"the scraper every {SCRAPE_EVERY:g} s; the sidecar limited to {OPEN_FILES} open files")
    print(quiet.line("no flood"))
    print(loud.line("during the flood"))
    print(flood_lines)


async def first_pass(url: str) -> None:
    """The scraper's first scrape: its password checked, cached from then on."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/metrics", headers=basic("prometheus", PASSWORD)) as resp,
    ):
        assert resp.status == 200, resp.status


async def measure(url: str, seconds: float) -> None:
    await first_pass(url)
    quiet, _ = await phase(url, seconds, flooded=False)
    loud, flood_lines = await phase(url, seconds, flooded=True)
    print(f"bcrypt cost {COST}; the scraper (its password checked once) every {SCRAPE_EVERY:g} s")
    print(quiet.line("no flood"))
    print(loud.line("during the flood"))
    print(flood_lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument(
        "--held-connections",
        type=int,
        metavar="N",
        help=f"flood: N half-sent requests held open (the sidecar at {OPEN_FILES} open files)",
    )
    parser.add_argument("--serve-capture", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_capture:
        serve_capture(args.serve_capture)
        return
    held = args.held_connections
    if held:  # this process holds them all
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        users = {
            user: bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=COST)).decode()
            for user in ("prometheus", "late")
        }
        web_config = workdir / "web-config.yml"
        web_config.write_text(json.dumps({"basic_auth_users": users}))
        port, sidecar_port = free_port(), free_port()
        argv = [sys.executable, __file__, "--serve-capture", str(port)]
        backend = Process("backend", argv, workdir / "backend.log").start()
        argv = ["prlimit", f"--nofile={OPEN_FILES}:{OPEN_FILES}"] if held else []
        argv += [sys.executable, "-m", "inferwatch", "serve"]
        argv += ["--backend-url", f"http://127.0.0.1:{port}", "--backend", "vllm", "--gpu", "off"]
        argv += ["--web.config.file", str(web_config)]
        argv += ["--web.listen-address", f"127.0.0.1:{sidecar_port}"]
        sidecar = Process("inferwatch", argv, workdir / "inferwatch.log")
        url = f"http://127.0.0.1:{sidecar_port}"
        try:
            backend.wait_http(f"http://127.0.0.1:{port}/metrics", 30)
            sidecar.start().wait_http(f"{url}/healthz", 30)
            if held:
                asyncio.run(measure_held(url, args.seconds, held, sidecar.pid))
            else:
                asyncio.run(measure(url, args.seconds))
        finally:
            sidecar.stop()
            backend.stop()


if __name__ == "__main__":
    main()
