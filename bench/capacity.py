"""The load search against a brute-force sweep of the same server (prints figures; not a test).

Against a real vLLM on CPU (started here, or ``--url``), at one prompt/output shape:

1. one request alone, warm: its duration ``d``; the objective is end to end <= ``--factor``
   x ``d`` (measured here, so the same on any machine);
2. the search (``inferwatch baseline --search on``'s :func:`search_shape`, Poisson arrivals,
   its defaults: goodput target 0.95, tolerance 0.1) and its run time;
3. brute force: one step at each fixed rate from 0.5x to 1.5x the search's capacity in steps
   of 0.1x, the same requests per step and arrivals; its capacity is the highest rate whose
   goodput met the target below the lowest that did not.

It prints both capacities, their ratio and the run times. Run it pinned to one core
(``taskset -c 0 .venv/bin/python bench/capacity.py``: the server inherits the affinity) and
not, to see the capacity follow the machine.

    .venv/bin/python bench/capacity.py [--url URL] [--prompt-tokens 64] [--output-tokens 32]

Sample output (2 cores, vLLM 0.32 on CPU, tiny model; the lines per step left out):

    cores available: 2
    one request alone: 0.064 s; objective: end to end <= 0.641 s
    search: 92.8 req/s (7 steps, 69 s, converged)
    brute force: 92.8 req/s (11 rates, 102 s)
    search / brute force: 1.000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from demo.stack import MODEL_NAME, VllmServer  # noqa: E402
from inferwatch.capacity import Capacity  # noqa: E402
from inferwatch.collect.stream import Client  # noqa: E402
from inferwatch.tools.sweep.goodput import Objectives  # noqa: E402
from inferwatch.tools.sweep.prompts import Prompts, calibrate  # noqa: E402
from inferwatch.tools.sweep.search import Search, bounds, search_shape  # noqa: E402

SEED = 20261203


def note(line: str) -> None:
    print(f"  {line}", flush=True)


async def measure(url: str, shape: tuple[int, int], factor: float) -> None:
    client = Client(url, "completions", MODEL_NAME, timeout=300, connections=0, api_key=None)
    try:
        prompts = await calibrate(client, Prompts("completions", SEED), 0, note)
        for _ in range(2):  # warm: the first request pays for what later ones do not
            alone = await client.stream(prompts.for_request(1, 0, shape[0]), shape[1])
        assert alone.ok, alone.error
        objectives = Objectives(e2e=round(factor * alone.e2e, 3))
        print(f"one request alone: {alone.e2e:.3f} s; objective: end to end <= {objectives.e2e} s")

        started = time.monotonic()
        found = await search_shape(
            client, prompts, shape, Search(), objectives, SEED, first_tag=10, note=note
        )
        search_seconds = time.monotonic() - started
        if found.requests_per_second is None:
            print("search: no rate met the target")
            return
        print(
            f"search: {found.requests_per_second:.3g} req/s ({len(found.steps)} steps, "
            f"{search_seconds:.0f} s, {found.ended})"
        )

        started = time.monotonic()
        steps = []
        for k in range(5, 16):
            rate = found.requests_per_second * k / 10
            one = Search(start=rate, steps=1)
            fixed: Capacity = await search_shape(
                client, prompts, shape, one, objectives, SEED, first_tag=100 + 10 * k, note=note
            )
            steps.append(fixed.steps[0])
        brute_seconds = time.monotonic() - started
        best, _ = bounds(steps, Search().target)
        if best is None:
            print("brute force: no rate met the target")
            return
        print(f"brute force: {best.rate:.3g} req/s ({len(steps)} rates, {brute_seconds:.0f} s)")
        print(f"search / brute force: {found.requests_per_second / best.rate:.3f}")
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", help="a running vLLM serving `tiny` (default: start one)")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument(
        "--factor", type=float, default=10.0, help="the e2e objective, x one request alone"
    )
    args = parser.parse_args()
    print(f"cores available: {len(os.sched_getaffinity(0))}")
    with tempfile.TemporaryDirectory(prefix="inferwatch-capacity-") as tmp:
        server = None if args.url else VllmServer(Path(tmp)).start()
        try:
            url = args.url or server.url
            shape = (args.prompt_tokens, args.output_tokens)
            asyncio.run(measure(url, shape, args.factor))
        finally:
            if server is not None:
                server.stop()


if __name__ == "__main__":
    main()
