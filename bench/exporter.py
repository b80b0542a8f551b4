"""Exporter cost, measured (prints figures; not a test).

1. CPU per poll of the real ~50 KB vLLM captures served over loopback (the backend runs in
   another process, so only the exporter's CPU is counted), split into fetch, normalize
   (what a poll maps: the signals and the latency window's histograms; and the whole page,
   as a scrape or the verdict reads it) and render. The backend rotates through the vLLM 0.32 captures, so every family's values
   change on every poll and some families come and go (the worst case: on a real server
   most histograms only move when a request finishes). Next to it, prometheus_client's full
   text parser over the same page, measured in the same run, as the reference. And the CPU
   per poll of a page equal to the last (one capture, always: an idle server's).
2. CPU share of a real ``inferwatch serve`` process polling at 10 Hz (the median of
   :data:`SHARE_RUNS` runs, each a new process, and their range), next to the share of an
   empty asyncio loop waking at 10 Hz (this machine's floor) and of one that only fetches
   the page at 10 Hz (the floor of polling over loopback here), each in a process of its
   own, measured in the same run and under the same load: against the rotating captures
   (worst case) and, with ``--vllm``, against a real vLLM on CPU under a steady load of 8
   concurrent requests.
3. ``/metrics`` latency p50/p99 under 8 concurrent scrapers against that process: bursts of 8
   every 100 ms (each burst meets a new poll, so it pays the page's render), and 8 back to
   back (saturation: mostly queueing). The reference is ``/healthz`` (a tiny JSON answer)
   scraped the same way in the same run: this machine's floor for one HTTP round trip.
4. RSS of an in-process poller after 1,000 / 5,000 / 10,000 polls.
5. ``/healthz`` p99 while the exporter polls a hostile page of 100,000 series of a mapped
   family, with the default ``--backend-max-series`` (the page is refused) and with a budget
   raised above it (the page is mapped, off the event loop), once its memory has settled
   (:data:`BIG_PAGE_SETTLING`), and its RSS meanwhile (the median and the highest of a
   reading every 0.5 s) and its peak since it started.
6. RSS of ``inferwatch serve`` after :data:`HOSTILE_SECONDS` of polling, at the default poll
   interval and limits and scraped as Prometheus scrapes it every 15 s, the security
   issue's hostile page (:func:`hostile_page`: 9,000 series whose 1,600-character model
   names change at every poll, within ``--backend-max-series``, ``--backend-max-bytes``
   and ``--backend-max-label-bytes``) next to the rotating captures, both in the same run:
   the memory the sidecar can be made to hold (docs/security.md, "Memory"), and the
   highest reading of each (every 0.5 s) and its peak since it started.

With ``--write-docs`` (``make bench`` passes it) the figures it printed, with the date and
the machine (cores, CPU model), also replace the generated region of docs/performance.md:
the only place they are written down.

    .venv/bin/python bench/exporter.py [--seconds 20] [--vllm] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from demo.stack import Process, VllmServer, free_port  # noqa: E402
from demo.traffic import complete, prompt  # noqa: E402
from inferwatch.collect.backends import VLLM, Mapper  # noqa: E402
from inferwatch.collect.poller import Poller, PollSettings  # noqa: E402
from inferwatch.collect.upstream import Upstream  # noqa: E402
from inferwatch.collect.window import SUMMARIZED  # noqa: E402
from inferwatch.model import BackendSample  # noqa: E402
from inferwatch.serve.exposition import Renderer, render  # noqa: E402
from inferwatch.tools.measured import PERFORMANCE, this_machine, write_figures  # noqa: E402

MANIFEST = REPO / "deploy" / "kubernetes" / "base" / "deployment.yaml"
CAPTURES = sorted((REPO / "tests" / "fixtures").glob("vllm-0.32.0-cpu-*.prom"))
# How many runs of `inferwatch serve` a CPU share is the median of: one run of this noisy a
# figure (a few hundred milliseconds of CPU) moves with whatever else the machine does.
SHARE_RUNS = 3
# How long the sidecar polls the huge page before it is measured: its memory grows for the
# first verdicts (one every 5 s) and then moves around where it stays.
BIG_PAGE_SETTLING = 20.0
# The security issue's hostile page, and how long it is polled before the RSS is read.
HOSTILE_SERIES = 9_000
HOSTILE_CHARS = 1_600
HOSTILE_SECONDS = 90.0
# What Prometheus asks for when it scrapes.
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0;q=0.5,"
    "text/plain;version=0.0.4;q=0.4,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}


class Report:
    """Prints each figure as it is measured and keeps it, in order, for docs/performance.md."""

    def __init__(self) -> None:
        self.figures: dict[str, str] = {}

    def __call__(self, name: str, value: str) -> None:
        self.figures[name] = value
        print(f"{name}: {value}", flush=True)


def machine(args: argparse.Namespace) -> dict[str, str]:
    """Where and when the figures were measured, and with which options."""
    options = f"--seconds {args.seconds:g}" + (" --vllm" if args.vllm else "")
    return {**this_machine(), "options": options}


def big_page(series: int = 100_000) -> str:
    """A page of ``series`` series of one mapped family, 75 bytes each."""
    return 'vllm:num_requests_waiting{model_name="m"} 1\n' + "".join(
        f'vllm:num_requests_running{{engine="{i:07d}",model_name="some-model-name"}} 1\n'
        for i in range(series)
    )


def hostile_page(poll: int, series: int = HOSTILE_SERIES) -> str:
    """The security issue's hostile page: ``series`` series of a mapped family whose model
    names, :data:`HOSTILE_CHARS` characters of noise, change at every poll."""
    chars = HOSTILE_CHARS
    noise = base64.b64encode(random.Random(poll).randbytes(series * chars)).decode()
    return 'vllm:num_requests_waiting{model_name="m"} 1\n' + "".join(
        f'vllm:num_requests_running{{engine="{i}",model_name="{noise[i * chars : i * chars + chars]}"}} 1\n'
        for i in range(series)
    )


def manifest_max_bytes() -> int:
    """The ``--backend-max-bytes`` the Kubernetes manifest gives the sidecar."""
    deployment = yaml.safe_load(MANIFEST.read_text())
    for container in deployment["spec"]["template"]["spec"]["containers"]:
        for arg in container.get("args", []):
            if arg.startswith("--backend-max-bytes="):
                return int(arg.split("=", 1)[1])
    raise SystemExit(f"{MANIFEST}: no --backend-max-bytes")


def hostile_series_within(max_bytes: int) -> int:
    """The most series of :func:`hostile_page` whose page fits ``max_bytes``."""
    per_series = len(hostile_page(0, 100).encode()) / 100
    return int(max_bytes / per_series * 0.98)


def serve_capture(port: int, page: str = "capture", series: int = HOSTILE_SERIES) -> None:
    """The fake backend (run in a child process): the captures in turn on /metrics (and
    always the first on /unchanged, as an idle server's), always the same :func:`big_page`,
    or a new :func:`hostile_page` at each request."""
    bodies = [big_page()] if page == "big" else [c.read_text() for c in CAPTURES]
    served = 0

    async def metrics(_: web.Request) -> web.Response:
        nonlocal served
        served += 1
        body = hostile_page(served, series) if page == "hostile" else bodies[served % len(bodies)]
        return web.Response(text=body, content_type="text/plain")

    async def unchanged(_: web.Request) -> web.Response:
        return web.Response(text=bodies[0], content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/unchanged", unchanged)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def cpu_ms(fn, repeat: int) -> float:
    start = time.process_time()
    for _ in range(repeat):
        fn()
    return (time.process_time() - start) / repeat * 1000


def polled(sample: BackendSample) -> None:
    """Read what a poll reads of a page besides the signals (which normalize maps): the
    latency window's histograms."""
    for key in SUMMARIZED:
        sample.histograms.get(key)


def read_all(sample: BackendSample) -> None:
    """Read every series of a page, as a scrape does."""
    dict(sample.values)
    dict(sample.histograms)
    tuple(sample.dropped)


async def poll_ms(url: str, polls: int) -> float:
    """CPU per poll of ``url``'s page, past the first polls (connection and caches warm)."""
    upstream = Upstream(url, timeout=5, max_bytes=16 * 1024 * 1024)
    poller = Poller(upstream, VLLM, None, PollSettings(interval=0.1))
    for _ in range(50):
        await poller.poll_once()
    start = time.process_time()
    for _ in range(polls):
        await poller.poll_once()
    await upstream.close()
    return (time.process_time() - start) / polls * 1000


async def per_poll(url: str, polls: int) -> dict[str, float]:
    poll = await poll_ms(url, polls)
    unchanged = await poll_ms(f"{url}/unchanged", polls)
    upstream = Upstream(url, timeout=5, max_bytes=16 * 1024 * 1024)
    poller = Poller(upstream, VLLM, None, PollSettings(interval=0.1))
    await poller.poll_once()
    start = time.process_time()
    for _ in range(polls):
        await upstream.get_exposition("/metrics")
    fetch = (time.process_time() - start) / polls * 1000
    pages = [await upstream.get_exposition("/metrics") for _ in CAPTURES]
    turn = iter(range(10**9))
    mapper = Mapper(VLLM)  # as a poller keeps one, past its first pages (layouts, plans)
    for page in pages * 3:
        read_all(mapper.normalize(page))
    normalize = cpu_ms(lambda: polled(mapper.normalize(pages[next(turn) % len(pages)])), polls)
    whole = cpu_ms(lambda: read_all(mapper.normalize(pages[next(turn) % len(pages)])), polls)
    text = pages[0]
    snapshot = poller.snapshot
    render_ms = cpu_ms(lambda: render(snapshot), polls)
    reference = cpu_ms(lambda: list(text_string_to_metric_families(text)), 200)
    await upstream.close()
    return {
        "poll": poll,
        "unchanged": unchanged,
        "fetch": fetch,
        "normalize": normalize,
        "whole page": whole,
        "render": render_ms,
        "reference": reference,
        "bytes": len(text),
    }


async def rss_after_polls(url: str) -> list[tuple[int, float]]:
    upstream = Upstream(url, timeout=5, max_bytes=16 * 1024 * 1024)
    poller = Poller(upstream, VLLM, None, PollSettings(interval=0.1))
    renderer = Renderer(lambda: poller.snapshot)
    out = []
    for n in range(1, 10_001):
        await poller.poll_once()
        if n % 10 == 0:
            renderer.render()  # a scrape every 10 polls, as at 10 Hz with a 1 s scraper
        if n in (1_000, 5_000, 10_000):
            out.append((n, rss_mib()))
    await upstream.close()
    return out


def rss_mib(pid: str = "self", field: str = "VmRSS") -> float:
    """A process's resident memory now (or ``VmHWM``: its peak), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def process_cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def scrape_latency(
    url: str, seconds: float, scrapers: int = 8, period: float = 0.0
) -> list[float]:
    """Milliseconds per scrape of ``scrapers`` clients, each scraping every ``period`` seconds
    (all at the same instant: a burst of concurrent requests), or back to back when 0."""
    latencies: list[float] = []
    deadline = time.monotonic() + seconds

    async def scraper(session: aiohttp.ClientSession) -> None:
        next_at = time.monotonic()
        while time.monotonic() < deadline:
            started = time.perf_counter()
            async with session.get(url) as resp:
                await resp.read()
            latencies.append((time.perf_counter() - started) * 1000)
            next_at += period
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(scraper(session) for _ in range(scrapers)))
    return latencies


async def loop_share(seconds: float, url: str | None = None) -> float:
    """CPU share of an asyncio loop that wakes at 10 Hz and does nothing (the machine's
    floor), or only GETs ``url`` over one kept connection (the floor of polling it here:
    the loopback round trip, waking the backend, no parsing)."""
    upstream = Upstream(url, timeout=5, max_bytes=16 * 1024 * 1024) if url else None

    async def tick() -> None:
        while True:
            if upstream is not None:
                await upstream.get_exposition("/metrics")
            await asyncio.sleep(0.1)

    task = asyncio.create_task(tick())
    await asyncio.sleep(1)
    cpu0, wall0 = time.process_time(), time.monotonic()
    await asyncio.sleep(seconds)
    share = (time.process_time() - cpu0) / (time.monotonic() - wall0)
    task.cancel()
    if upstream is not None:
        await upstream.close()
    return share


@contextlib.contextmanager
def exporter_polling(
    backend_url: str, workdir: Path, *options: str
) -> Iterator[tuple[Process, int]]:
    """A real `inferwatch serve` process polling ``backend_url`` at 10 Hz."""
    port = free_port()
    argv = [
        sys.executable, "-m", "inferwatch", "serve",
        "--backend", "vllm", "--backend-url", backend_url, "--gpu", "off",
        "--poll-interval", "0.1", "--web.listen-address", f"127.0.0.1:{port}", *options,
    ]  # fmt: skip
    exporter = Process("inferwatch", argv, workdir / "inferwatch.log").start()
    try:
        exporter.wait_http(f"http://127.0.0.1:{port}/healthz", 30)
        yield exporter, port
    finally:
        exporter.stop()


def serve_share(backend_url: str, seconds: float, workdir: Path) -> float:
    """CPU share (of one core) of `inferwatch serve` polling ``backend_url`` at 10 Hz."""
    with exporter_polling(backend_url, workdir) as (exporter, _):
        time.sleep(2)
        cpu0, wall0 = process_cpu_seconds(exporter.pid), time.monotonic()
        time.sleep(seconds)
        return (process_cpu_seconds(exporter.pid) - cpu0) / (time.monotonic() - wall0)


def floor_share(backend_url: str | None, seconds: float) -> float:
    """:func:`loop_share` in a process of its own (this one may be loading the backend)."""
    argv = [sys.executable, __file__, "--loop-share", backend_url or "", "--seconds", f"{seconds}"]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=seconds + 60)
    return float(done.stdout)


def shares(backend_url: str, seconds: float, workdir: Path) -> str:
    """The CPU share of `inferwatch serve` polling ``backend_url`` at 10 Hz, with its floors."""
    runs = sorted(serve_share(backend_url, seconds, workdir) for _ in range(SHARE_RUNS))
    floor = floor_share(None, seconds)
    fetching = floor_share(backend_url, seconds)
    return (
        f"{statistics.median(runs) * 100:.2f} % of one core (median of {len(runs)} runs of "
        f"{seconds:g} s: {runs[0] * 100:.2f} to {runs[-1] * 100:.2f} %; an empty asyncio loop "
        f"waking at 10 Hz: {floor * 100:.2f} %; one that only fetches the page at 10 Hz: "
        f"{fetching * 100:.2f} %)"
    )


async def steady_load(base_url: str, stop: asyncio.Event, concurrency: int = 8) -> int:
    """``concurrency`` clients sending 64-token completions back to back until ``stop``."""
    done = 0

    async def client(session: aiohttp.ClientSession, n: int) -> None:
        nonlocal done
        while not stop.is_set():
            await complete(session, base_url, prompt(30, salt=n * 10_000 + done), 64)
            done += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session, n) for n in range(concurrency)))
    return done


def vllm_share(seconds: float, workdir: Path) -> tuple[str, int]:
    """:func:`shares` next to a real vLLM under a steady load, and the requests it served."""
    server = VllmServer(workdir / "vllm").start()
    try:

        async def run() -> tuple[str, int]:
            stop = asyncio.Event()
            load = asyncio.create_task(steady_load(server.url, stop))
            await asyncio.sleep(5)  # let the load settle
            figure = await asyncio.to_thread(shares, server.url, seconds, workdir)
            stop.set()
            return figure, await load

        return asyncio.run(run())
    finally:
        server.stop()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def scraped_and_sized(url: str, pid: str, seconds: float = 10.0) -> tuple[list, list]:
    """:func:`scrape_latency` of ``url`` every 100 ms, and the RSS of ``pid`` every 0.5 s
    meanwhile (MiB): the memory of a sidecar mapping a huge page moves with each poll and
    each verdict, so one reading says little."""
    sizes: list[float] = []

    async def sample() -> None:
        while True:
            sizes.append(rss_mib(pid))
            await asyncio.sleep(0.5)

    sampler = asyncio.create_task(sample())
    try:
        latencies = await scrape_latency(url, seconds, period=0.1)
    finally:
        sampler.cancel()
    return latencies, sizes


def healthz_while_polling_a_big_page(workdir: Path, report: Report) -> None:
    """Figure 5: /healthz latency and RSS of `inferwatch serve` polling :func:`big_page`."""
    port = free_port()
    argv = [sys.executable, __file__, "--serve-big-page", str(port)]
    backend = Process("big-page", argv, workdir / "big-page.log").start()
    runs = {
        "default budget: refused": (),
        "budget raised to 200000: mapped": ("--backend-max-series", "200000"),
    }
    try:
        backend.wait_http(f"http://127.0.0.1:{port}/metrics", 60)
        size = len(big_page().encode()) / 1e6
        for label, options in runs.items():
            with exporter_polling(f"http://127.0.0.1:{port}", workdir, *options) as (proc, at):
                time.sleep(BIG_PAGE_SETTLING)
                lat, rss = asyncio.run(
                    scraped_and_sized(f"http://127.0.0.1:{at}/healthz", str(proc.pid))
                )
                report(
                    f"/healthz while polling a {size:.1f} MB page of 100,000 series ({label})",
                    f"p50 {percentile(lat, 50):.2f} ms, p99 {percentile(lat, 99):.2f} ms; "
                    f"RSS meanwhile: median {statistics.median(rss):.1f} MiB, highest "
                    f"{max(rss):.1f} MiB (peak since it started, VmHWM: "
                    f"{rss_mib(str(proc.pid), 'VmHWM'):.1f} MiB)",
                )
    finally:
        backend.stop()


async def scraped_every_15_s(urls: list[str], pids: list[str], seconds: float) -> list[list]:
    """Scrape each of ``urls`` as Prometheus does, every 15 s, for ``seconds``; the RSS of
    each of ``pids`` every 0.5 s meanwhile (MiB)."""
    sizes: list[list[float]] = [[] for _ in pids]
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(headers=PROMETHEUS_HEADERS) as session:
        next_scrape = time.monotonic()
        while time.monotonic() < deadline:
            if time.monotonic() >= next_scrape:
                for url in urls:
                    async with session.get(url) as resp:
                        await resp.read()
                next_scrape += 15.0
            for size, pid in zip(sizes, pids, strict=True):
                size.append(rss_mib(pid))
            await asyncio.sleep(0.5)
    return sizes


def rss_under_a_hostile_page(workdir: Path, report: Report) -> None:
    """Figure 6: the RSS of `inferwatch serve` after polling :func:`hostile_page` next to
    one polling the captures, at once, for :data:`HOSTILE_SECONDS`; and of one run with the
    Kubernetes manifest's ``--backend-max-bytes``, polling the same page cut to fit it."""
    max_bytes = manifest_max_bytes()
    cut = hostile_series_within(max_bytes)
    ports = {"capture": free_port(), "hostile-page": free_port(), "manifest": free_port()}
    backends = [
        Process(name, [sys.executable, __file__, *argv], workdir / f"{name}.log")
        for name, argv in (
            ("capture", ["--serve-capture", str(ports["capture"])]),
            ("hostile-page", ["--serve-hostile-page", str(ports["hostile-page"])]),
            (
                "manifest",
                ["--serve-hostile-page", str(ports["manifest"]), "--hostile-series", str(cut)],
            ),
        )
    ]
    interval = ("--poll-interval", "0.5")  # the default: the page changes at every poll
    try:
        for backend, port in zip(backends, ports.values(), strict=True):
            backend.start().wait_http(f"http://127.0.0.1:{port}/metrics", 60)
        urls = [f"http://127.0.0.1:{port}" for port in ports.values()]
        with (
            exporter_polling(urls[0], workdir / "normal", *interval) as (normal, at_normal),
            exporter_polling(urls[1], workdir / "hostile", *interval) as (hostile, at_hostile),
            exporter_polling(
                urls[2], workdir / "manifest", *interval, f"--backend-max-bytes={max_bytes}"
            ) as (manifest, at_manifest),
        ):
            pids = [str(normal.pid), str(hostile.pid), str(manifest.pid)]
            metrics = [
                f"http://127.0.0.1:{at}/metrics" for at in (at_normal, at_hostile, at_manifest)
            ]
            sizes = asyncio.run(scraped_every_15_s(metrics, pids, HOSTILE_SECONDS))
            peaks = [rss_mib(pid, "VmHWM") for pid in pids]
        size = len(hostile_page(0).encode()) / 2**20
        cut_size = len(hostile_page(0, cut).encode()) / 2**20
        (normal_rss, hostile_rss, manifest_rss) = sizes
        (normal_peak, hostile_peak, manifest_peak) = peaks
        report(
            f"RSS of `inferwatch serve` after {HOSTILE_SECONDS:.0f} s polling every 0.5 s, "
            "scraped every 15 s: the hostile page",
            f"{hostile_rss[-1]:.1f} MiB (highest reading {max(hostile_rss):.1f} MiB, peak "
            f"VmHWM {hostile_peak:.1f} MiB; {HOSTILE_SERIES:,} series whose "
            f"{HOSTILE_CHARS:,}-character model names change at every poll, {size:.1f} MiB)",
        )
        report(
            f"  the same with the Kubernetes manifest's --backend-max-bytes={max_bytes}",
            f"{manifest_rss[-1]:.1f} MiB (highest reading {max(manifest_rss):.1f} MiB, peak "
            f"VmHWM {manifest_peak:.1f} MiB; the page cut to {cut:,} series, {cut_size:.1f} MiB)",
        )
        report(
            "  the same, the rotating captures",
            f"{normal_rss[-1]:.1f} MiB (highest reading {max(normal_rss):.1f} MiB, peak "
            f"VmHWM {normal_peak:.1f} MiB)",
        )
    finally:
        for backend in backends:
            backend.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0, help="duration of the 10 Hz run")
    parser.add_argument("--vllm", action="store_true", help="also measure against a real vLLM")
    parser.add_argument(
        "--write-docs",
        action="store_true",
        help=f"also write the figures into {PERFORMANCE} (make bench)",
    )
    parser.add_argument("--serve-capture", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-big-page", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-hostile-page", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--hostile-series", type=int, default=HOSTILE_SERIES, help=argparse.SUPPRESS
    )
    parser.add_argument("--loop-share", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loop_share is not None:
        print(asyncio.run(loop_share(args.seconds, args.loop_share or None)))
        return
    for page in ("capture", "big_page", "hostile_page"):
        if getattr(args, f"serve_{page}"):
            serve_capture(
                getattr(args, f"serve_{page}"), page.removesuffix("_page"), args.hostile_series
            )
            return
    workdir = Path("/tmp/inferwatch-bench")
    report = Report()
    port = free_port()
    argv = [sys.executable, __file__, "--serve-capture", str(port)]
    backend = Process("capture", argv, workdir / "capture.log").start()
    try:
        backend.wait_http(f"http://127.0.0.1:{port}/metrics", 30)
        url = f"http://127.0.0.1:{port}"
        cost = asyncio.run(per_poll(url, 2000))
        names = ", ".join(c.name for c in CAPTURES)
        report("captures in rotation", f"{names} (~{cost['bytes'] / 1024:.0f} KiB each)")
        report("CPU per poll (fetch + normalize + derive)", f"{cost['poll']:.3f} ms")
        report("  of which loopback HTTP fetch", f"{cost['fetch']:.3f} ms")
        report("  of which normalize (what a poll maps)", f"{cost['normalize']:.3f} ms")
        report(
            "CPU per poll of a page equal to the last (an idle server's)",
            f"{cost['unchanged']:.3f} ms",
        )
        report("normalize, the whole page (as a scrape reads it)", f"{cost['whole page']:.3f} ms")
        report("rendering a poll's /metrics page (once per poll)", f"{cost['render']:.3f} ms")
        report(
            "reference: prometheus_client's full parser on the same page",
            f"{cost['reference']:.3f} ms ({cost['reference'] / cost['poll']:.1f}x the poll, "
            f"{cost['reference'] / cost['normalize']:.1f}x normalize)",
        )
        report(
            "CPU share of `inferwatch serve` polling at 10 Hz, rotating captures",
            shares(url, args.seconds, workdir),
        )
        with exporter_polling(url, workdir) as (exporter, ex_port):
            base = f"http://127.0.0.1:{ex_port}"
            for label, period in (("every 100 ms, together", 0.1), ("back to back", 0.0)):
                lat = asyncio.run(scrape_latency(f"{base}/metrics", 10.0, period=period))
                ref = asyncio.run(scrape_latency(f"{base}/healthz", 10.0, period=period))
                report(
                    f"/metrics latency, 8 scrapers {label}, polling at 10 Hz",
                    f"p50 {percentile(lat, 50):.2f} ms, p99 {percentile(lat, 99):.2f} ms "
                    f"({len(lat)} scrapes in 10 s; /healthz the same way: "
                    f"p50 {percentile(ref, 50):.2f} ms, p99 {percentile(ref, 99):.2f} ms)",
                )
            report(
                "RSS of that `inferwatch serve` after the scrapes",
                f"{rss_mib(str(exporter.pid)):.1f} MiB",
            )
        rss = asyncio.run(rss_after_polls(url))
        report(
            "RSS of an in-process poller",
            ", ".join(f"{n} polls {m:.1f} MiB" for n, m in rss),
        )
    finally:
        backend.stop()
    healthz_while_polling_a_big_page(workdir, report)
    rss_under_a_hostile_page(workdir, report)
    if args.vllm:
        figure, requests = vllm_share(args.seconds, workdir)
        report(
            "CPU share of `inferwatch serve` polling at 10 Hz, real vLLM (CPU) under load",
            f"{figure}; {requests} requests completed meanwhile",
        )
    if args.write_docs:
        write_figures(REPO / PERFORMANCE, report.figures, machine(args))
        print(f"wrote the figures into {PERFORMANCE}")


if __name__ == "__main__":
    main()
