"""What an evidence capture costs the exporter, measured (prints figures; not a test).

A real vLLM on CPU started with its torch profiler on (Python stacks off) serves two clients
back to back;
``inferwatch serve`` polls it with captures on (``--capture-profiler-dir`` the server's trace
folder). For ``--seconds`` without a capture, then during one capture of
``--capture-seconds`` (``POST /capture``), the script asks the sidecar every 50 ms for
``/healthz`` (the age of its last completed poll: it stays under the poll interval plus one
read of vLLM while polls go on) and ``/metrics`` (the latency a scrape sees). It prints
their p50/p99 in both windows (same run, same traffic), the time from the request to the
complete archive and the archive's size and parts.

    .venv/bin/python bench/capture.py [--seconds 20] [--capture-seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from demo.stack import Inferwatch, VllmServer, http_get, http_json  # noqa: E402
from demo.traffic import complete_many  # noqa: E402
from inferwatch.method.quantile import sample_quantile  # noqa: E402


def sample(sidecar: Inferwatch, until) -> tuple[list[float], list[float]]:
    """(last poll ages, /metrics latencies) until ``until()`` is true."""
    ages, latencies = [], []
    while not until():
        ages.append(http_json(f"{sidecar.url}/healthz")["last_poll_age_seconds"])
        started = time.monotonic()
        status, _ = http_get(f"{sidecar.url}/metrics", timeout=30)
        assert status == 200
        latencies.append(time.monotonic() - started)
        time.sleep(0.05)
    return ages, latencies


def line(name: str, ages: list[float], latencies: list[float]) -> str:
    def ms(values: list[float], q: float) -> str:
        return f"{sample_quantile(q, values) * 1e3:8.1f}"

    return (
        f"{name:<16} {len(ages):5d} {ms(ages, 0.5)} {ms(ages, 0.99)} "
        f"{ms(latencies, 0.5)} {ms(latencies, 0.99)}"
    )


async def traffic(url: str, stop: asyncio.Event) -> None:
    await complete_many(url, stop, clients=2, prompt_words=8, max_tokens=16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--capture-seconds", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-capture-") as tmp:
        workdir = Path(tmp)
        traces = workdir / "traces"
        traces.mkdir()
        profiler = {  # as docs/capture.md advises: Python stacks off
            "profiler": "torch",
            "torch_profiler_dir": str(traces),
            "torch_profiler_with_stack": False,
        }
        vllm = VllmServer(workdir, extra_args=["--profiler-config", json.dumps(profiler)])
        vllm.start()
        sidecar = Inferwatch(
            workdir,
            vllm.url,
            ["--backend", "vllm", "--gpu", "off", "--capture-dir", str(workdir / "captures"),
             "--capture-profiler-dir", str(traces),
             "--capture-seconds", f"{args.capture_seconds:g}"],
        )  # fmt: skip
        sidecar.start()
        stop = asyncio.Event()
        loop = asyncio.new_event_loop()
        load = loop.run_in_executor(None, lambda: asyncio.run(traffic(vllm.url, stop)))
        try:
            time.sleep(5)  # the traffic under way
            end = time.monotonic() + args.seconds
            quiet = sample(sidecar, lambda: time.monotonic() > end)
            request = urllib.request.Request(
                f"{sidecar.url}/capture", b"{}", {"Content-Type": "application/json"}, method="POST"
            )
            asked = time.time()
            urllib.request.urlopen(request, timeout=10).read()

            def done() -> bool:
                return http_json(f"{sidecar.url}/captures")["last"] is not None

            during = sample(sidecar, done)
            last = http_json(f"{sidecar.url}/captures")["last"]
        finally:
            stop.set()
            loop.run_until_complete(load)
            sidecar.stop()
            vllm.stop()
    print(f"vLLM 0.32 on CPU, two clients; poll every 0.5 s; capture of {args.capture_seconds:g} s")
    print("window           reads poll age p50   p99 ms /metrics p50   p99 ms")
    print(line("no capture", *quiet))
    print(line("during capture", *during))
    print(
        f"request to complete archive: {last['finished'] - asked:.1f} s; archive "
        f"{last['archive_bytes'] / 2**20:.2f} MiB ({last['result']})"
    )
    for part in last["parts"]:
        print(f"  {part['name']}: {part['result']} {part['bytes'] / 2**20:.2f} MiB "
              f"{part['seconds']:.1f} s {part['detail'][:100]}")  # fmt: skip
    ratio = statistics.median(during[0]) / statistics.median(quiet[0])
    print(f"median poll age during / without: {ratio:.2f}x")


if __name__ == "__main__":
    main()
