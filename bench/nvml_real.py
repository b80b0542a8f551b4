"""The NVML path on a real GPU, measured (prints figures; needs a GPU; not a test).

CI and the development machines have no GPU, so the tests drive the GPU source through a
fake NVML at the ``pynvml`` boundary. This script checks the same path against the real
driver, with a real ``inferwatch serve`` process:

1. every GPU series a poll renders for GPU 0 (utilization, memory, peak bandwidth, clocks,
   power, temperature, clock-event reasons, GPM where the GPU has it), and the decode floor
   for ``--model-weights-bytes`` (16 GB) over that GPU's peak bandwidth;
2. the exporter's central judgement against the real GPU: a backend reporting requests
   waiting, first while the GPU idles (queued-while-idle must grow by about the elapsed
   time, busy seconds barely), then while a PyTorch matrix-multiply loop keeps it busy (the
   reverse);
3. the cost of one NVML sample of all GPUs (in-process, 200 samples), next to the cost of a
   bare ``nvmlDeviceGetUtilizationRates`` call as the reference.

    python bench/nvml_real.py [--seconds 6]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from demo.stack import free_port, http_get  # noqa: E402
from inferwatch.collect.gpu import GpuSource  # noqa: E402

# A vLLM page with requests waiting and none running: whether they wait "while idle" is
# then the GPU's to say.
PAGE = (
    b'vllm:num_requests_waiting{engine="0",model_name="m"} 5\n'
    b'vllm:num_requests_running{engine="0",model_name="m"} 0\n'
)
WEIGHTS = 16e9
LOAD = (
    "import time, torch\n"
    "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
    "end = time.time() + {seconds}\n"
    "while time.time() < end:\n"
    "    (a @ a).sum().item()\n"
)


def serve_page(port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(PAGE)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    status, body = http_get(f"{url}/metrics")
    assert status == 200, status
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def total(page: dict, name: str, **where: str) -> float:
    return sum(
        v
        for (n, labels), v in page.items()
        if n == name and all(dict(labels).get(k) == w for k, w in where.items())
    )


def phase(url: str, seconds: float, load: bool) -> tuple[float, float, dict]:
    """(queued-while-idle seconds, GPU 0 busy seconds) gained over ``seconds``, and the
    last page. With ``load``, the window opens once NVML reports the GPU busy."""
    worker = None
    if load:
        # Runs until terminated: the window below decides how long it is measured.
        worker = subprocess.Popen([sys.executable, "-c", LOAD.format(seconds=3600)])
        deadline = time.monotonic() + 120
        while total(scrape(url), "inferwatch_gpu_utilization_ratio", gpu="0") < 0.5:
            if time.monotonic() > deadline or worker.poll() is not None:
                raise SystemExit("the matrix-multiply loop never made the GPU busy")
            time.sleep(0.2)
    try:
        before = scrape(url)
        time.sleep(seconds)
        after = scrape(url)
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait()
    qwi = "inferwatch_queued_while_idle_seconds_total"
    busy = "inferwatch_gpu_busy_seconds_total"
    return (
        total(after, qwi) - total(before, qwi),
        total(after, busy, gpu="0") - total(before, busy, gpu="0"),
        after,
    )


def sample_cost() -> tuple[float, float]:
    """(ms per GpuSource.sample() of all GPUs, ms per bare utilization call)."""
    source = GpuSource()
    source.start()
    try:
        source.sample()
        start = time.perf_counter()
        for _ in range(200):
            source.sample()
        per_sample = (time.perf_counter() - start) / 200 * 1000
        nv = source.nvml
        handle = nv.nvmlDeviceGetHandleByIndex(0)
        start = time.perf_counter()
        for _ in range(200):
            nv.nvmlDeviceGetUtilizationRates(handle)
        per_call = (time.perf_counter() - start) / 200 * 1000
    finally:
        source.close()
    return per_sample, per_call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    backend = free_port()
    server = serve_page(backend)
    port = free_port()
    exporter = subprocess.Popen(
        [
            sys.executable, "-m", "inferwatch", "serve",
            "--backend", "vllm", "--backend-url", f"http://127.0.0.1:{backend}",
            "--web.listen-address", f"127.0.0.1:{port}",
            "--gpu", "on", "--poll-interval", "0.2", "--model-weights-bytes", f"{WEIGHTS:g}",
        ]
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if total(scrape(url), "inferwatch_gpu_memory_total_bytes") > 0:
                    break
            except (OSError, AssertionError):
                pass
            if time.monotonic() > deadline or exporter.poll() is not None:
                raise SystemExit("inferwatch serve --gpu on did not come up with GPU series")
            time.sleep(0.2)
        idle_qwi, idle_busy, _ = phase(url, args.seconds, load=False)
        busy_qwi, busy_busy, page = phase(url, args.seconds, load=True)
        print("1. GPU 0 and derived series, at the end of the busy window:")
        for (name, labels), value in sorted(page.items()):
            labels_d = dict(labels)
            if labels_d.get("gpu", "0") == "0" and (
                name.startswith("inferwatch_gpu_")
                or name.startswith("inferwatch_decode_floor")
                or name == "inferwatch_collector_success"
            ):
                shown = {k: v for k, v in labels_d.items() if k not in ("uuid", "gpu")}
                print(f"   {name}{shown or ''} {value:g}")
        print(f"2. {args.seconds:g} s with 5 requests waiting:")
        print(f"   GPU idle: queued-while-idle +{idle_qwi:.2f} s, GPU 0 busy +{idle_busy:.2f} s")
        print(f"   GPU busy: queued-while-idle +{busy_qwi:.2f} s, GPU 0 busy +{busy_busy:.2f} s")
        per_sample, per_call = sample_cost()
        print(
            f"3. NVML sample of all GPUs: {per_sample:.3f} ms "
            f"(one nvmlDeviceGetUtilizationRates call: {per_call:.3f} ms)"
        )
    finally:
        exporter.terminate()
        exporter.wait(10)
        server.shutdown()


if __name__ == "__main__":
    main()
