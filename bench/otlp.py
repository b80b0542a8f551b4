"""The span receiver's cost: CPU per span and ``/metrics`` latency under a span flood (prints
figures; not a test).

A real ``inferwatch serve --otlp-traces on`` process polling a loopback backend that serves a
real vLLM capture. bench/auth_flood.py's scraper asks for ``/metrics`` every 100 ms as
Prometheus asks (OpenMetrics first: the page whose buckets carry the spans' trace ids as
exemplars), first with no spans, then while a sender posts OTLP/HTTP protobuf exports of vLLM's real ``llm_request``
span (tests/fixtures/vllm-0.32.0-cpu-llm_request-span.json; each copy with its own trace id,
request id and latencies) at ``--spans-per-second`` in batches of ``--batch`` (an OpenTelemetry
batch span processor sends up to 512 at a time). Printed, both phases measured in the same run:
the sidecar's CPU (cores), the CPU time per span received (the flood's CPU less the quiet
phase's, over the spans), its RSS, the scraper's p50/p99, what the exports got, and the
exemplars on the last page.
Both phases follow a few seconds of scrapes that are not counted.

    .venv/bin/python bench/otlp.py [--seconds 20] [--spans-per-second 1000] [--batch 200]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from auth_flood import Phase, percentile, scrape  # noqa: E402
from canary import cpu_seconds, rss_mib  # noqa: E402

from demo.stack import Process, free_port  # noqa: E402

SPAN = REPO / "tests" / "fixtures" / "vllm-0.32.0-cpu-llm_request-span.json"
WARM_UP = 5.0  # seconds of scrapes before the measured phases
BODIES = 20  # distinct export bodies, sent in turn
SCALED = ("gen_ai.latency.time_to_first_token", "gen_ai.latency.e2e")
# What Prometheus 2.42 sends: OpenMetrics first.
PROMETHEUS_ACCEPT = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
}


def export_bodies(batch: int, rng: random.Random) -> list[bytes]:
    """Protobuf exports of ``batch`` copies of the real span, each with its own ids and its
    latencies scaled by a factor of 0.5 to 4 (so that the slowest lists keep changing)."""
    template = json_format.ParseDict(json.loads(SPAN.read_text())["otlp_json_span"], Span())
    bodies = []
    for _ in range(BODIES):
        message = ExportTraceServiceRequest()
        spans = message.resource_spans.add().scope_spans.add().spans
        for _ in range(batch):
            span = spans.add()
            span.CopyFrom(template)
            span.trace_id, span.span_id = rng.randbytes(16), rng.randbytes(8)
            factor = rng.uniform(0.5, 4.0)
            for attribute in span.attributes:
                if attribute.key == "gen_ai.request.id":
                    attribute.value.string_value = f"cmpl-{rng.getrandbits(64):016x}"
                elif attribute.key in SCALED:
                    attribute.value.double_value *= factor
        bodies.append(message.SerializeToString())
    return bodies


async def send(
    url: str, bodies: list[bytes], batch: int, per_second: float, stop: asyncio.Event
) -> collections.Counter[int]:
    """Exports of ``batch`` spans at ``per_second`` spans/s until ``stop``; statuses."""
    got: collections.Counter[int] = collections.Counter()
    every = batch / per_second
    headers = {"Content-Type": "application/x-protobuf"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        start, sent = time.monotonic(), 0
        while not stop.is_set():
            body = bodies[sent % len(bodies)]
            async with session.post(f"{url}/v1/traces", data=body, headers=headers) as r:
                await r.read()
                got[r.status] += 1
            sent += 1
            await asyncio.sleep(max(0.0, start + sent * every - time.monotonic()))
    return got


async def phase(
    url: str, pid: int, seconds: float, flood: tuple[list[bytes], int, float] | None
) -> tuple[Phase, float, collections.Counter[int]]:
    """One phase: the scraper, and the sender with ``flood``; the sidecar's CPU seconds."""
    stop = asyncio.Event()
    cpu = cpu_seconds(pid)
    scraper = asyncio.create_task(scrape(url, stop, PROMETHEUS_ACCEPT))
    sender = asyncio.create_task(send(url, *flood, stop)) if flood else None
    await asyncio.sleep(seconds)
    stop.set()
    seen = await scraper
    statuses = await sender if sender else collections.Counter()
    return seen, cpu_seconds(pid) - cpu, statuses


async def measure(url: str, pid: int, args: argparse.Namespace) -> None:
    bodies = export_bodies(args.batch, random.Random(1))
    await phase(url, pid, WARM_UP, None)  # the first scrapes build the label caches
    quiet, quiet_cpu, _ = await phase(url, pid, args.seconds, None)
    loud, loud_cpu, statuses = await phase(
        url, pid, args.seconds, (bodies, args.batch, args.spans_per_second)
    )
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/verdict.json") as r:
            received = (await r.json())["slow_requests"]["received"]
        async with session.get(f"{url}/metrics", headers=PROMETHEUS_ACCEPT) as r:
            exemplars = (await r.text()).count(" # {")
    spans = statuses[200] * args.batch
    per_span = (loud_cpu - quiet_cpu) / spans if spans else float("nan")
    print(
        f"{args.seconds:g} s a phase; exports of {args.batch} spans at "
        f"{args.spans_per_second:g} spans/s ({len(bodies[0]) / 1024:.0f} KiB each)"
    )
    print(quiet.line("no spans") + f"; CPU {quiet_cpu / args.seconds:.3f} cores")
    print(loud.line("span flood") + f"; CPU {loud_cpu / args.seconds:.3f} cores")
    print(
        f"  exports by status {dict(statuses)}; {spans / args.seconds:.0f} spans/s accepted, "
        f"{received} requests in the verdict's count; CPU per span {per_span * 1e6:.1f} us "
        f"beyond the quiet phase's; RSS {rss_mib(pid):.0f} MiB; {exemplars} exemplars on the "
        "last page"
    )
    p99 = percentile([s for s, _ in loud.scrapes], 99) / percentile(
        [s for s, _ in quiet.scrapes], 99
    )
    print(f"  /metrics p99 with spans / without: {p99:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument("--spans-per-second", type=float, default=1000.0)
    parser.add_argument("--batch", type=int, default=200, help="spans per export")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        port, sidecar_port = free_port(), free_port()
        argv = [sys.executable, str(REPO / "bench" / "auth_flood.py"), "--serve-capture", str(port)]
        backend = Process("backend", argv, workdir / "backend.log").start()
        argv = [sys.executable, "-m", "inferwatch", "serve", "--otlp-traces", "on"]
        argv += ["--backend-url", f"http://127.0.0.1:{port}", "--backend", "vllm", "--gpu", "off"]
        argv += ["--web.listen-address", f"127.0.0.1:{sidecar_port}"]
        sidecar = Process("inferwatch", argv, workdir / "inferwatch.log")
        url = f"http://127.0.0.1:{sidecar_port}"
        try:
            backend.wait_http(f"http://127.0.0.1:{port}/metrics", 30)
            sidecar.start().wait_http(f"{url}/healthz", 30)
            asyncio.run(measure(url, sidecar.pid, args))
        finally:
            sidecar.stop()
            backend.stop()


if __name__ == "__main__":
    main()
