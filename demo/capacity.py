"""The demo service's capacity, measured once the thresholds are: ``inferwatch baseline
--search on`` at the normal traffic's shape, its capacity written into the calibrated
baseline file that ``serve --baseline`` reads (what a user does with a capacity file of
their own).

A request is good when its first token comes within the calibrated TTFT threshold, the
bound InferenceQueueingDelay compares TTFT p95 with: at a rate whose goodput meets its
target, TTFT p95 holds under that bound, so the capacity ticket (InferenceNearCapacity, a
share of that rate) comes while requests still meet it, before the queue and the page.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from demo.stack import MODEL_NAME, StackError
from inferwatch.capacity import parse

# The most the search may take (a guard: on 2 cores it converges in well under it).
SEARCH_SECONDS = 180.0


def measure_capacity(
    url: str, workdir: Path, baseline: Path, shape: tuple[int, int], ttft: float
) -> float:
    """Requests/s the server carries with 95 % of first tokens within ``ttft`` seconds, at
    ``shape`` (prompt, output tokens); written into ``baseline``'s ``capacity:``."""
    out = workdir / "capacity.yaml"
    argv = [
        sys.executable, "-m", "inferwatch", "baseline",
        "--url", url, "--model", MODEL_NAME, "--out", str(out),
        "--concurrency", "1",
        "--prompt-tokens", str(shape[0]), "--output-tokens", str(shape[1]),
        "--search", "on", "--goodput-ttft", f"{ttft:g}",
        "--search-seconds", f"{SEARCH_SECONDS:g}",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=SEARCH_SECONDS + 300)
    (workdir / "capacity.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise StackError(f"inferwatch baseline --search failed ({done.returncode}):\n{done.stderr}")
    found = yaml.safe_load(out.read_text())["capacity"]
    rate = parse(found[0], f"{out}: capacity").requests_per_second
    if not rate:
        raise StackError(f"the search found no rate that met its target:\n{done.stderr}")
    doc = yaml.safe_load(baseline.read_text())
    doc["capacity"] = found
    baseline.write_text(yaml.safe_dump(doc, sort_keys=False))
    return rate
