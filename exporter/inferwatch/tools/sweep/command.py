"""``inferwatch baseline``: a load sweep against an OpenAI-compatible server.

Every cell of concurrency x prompt tokens x output tokens sends ``--requests-per-cell``
streamed requests from ``concurrency`` closed-loop workers, and times each on the client:
TTFT (to the first SSE event that delivers a token), ITL (the gaps between token events; events
of one network read share a timestamp, so their gap is 0) and e2e (to ``[DONE]``). A failed
request is an error of its cell and never stops the sweep. Prompts are built to a token target,
no two sharing a KV-cache block (:mod:`.prompts`), or read from ``--prompts FILE.jsonl``. The
server's TTFT and ITL histograms (``--metrics-url``) are read around each cell
(:mod:`.histograms`); ``gap`` = client TTFT p50 - server TTFT p50 is what the server does not
see (network, HTTP, tokenization, SSE). A row per cell: TTFT p50/p95, server TTFT p50 and gap,
ITL p50/p95, e2e p95, requests and tokens per second, errors, and what regressed against
``--previous``.

Exit status: 0; 3 when a cell regressed against ``--previous`` (the file is written either
way); 1 when the sweep cannot run or no cell got an answer; 2 for bad input.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from inferwatch import __version__
from inferwatch.baseline import Baseline, to_yaml
from inferwatch.baseline import load as load_baseline
from inferwatch.capacity import Capacity
from inferwatch.collect.stream import Client, SweepError
from inferwatch.logs import printable
from inferwatch.method.spec import spec_from_config
from inferwatch.settings import resolve
from inferwatch.tools.sweep.cells import CellResult, run_cell
from inferwatch.tools.sweep.histograms import ITL, TTFT, Histograms, ServerHistograms
from inferwatch.tools.sweep.plan import DEFAULT_PROMPT_TOKENS, OPTIONS, Plan, new_file, plan_from
from inferwatch.tools.sweep.prompts import Prompts, calibrate
from inferwatch.tools.sweep.report import LEGEND, Progress, regressions, table
from inferwatch.tools.sweep.search import search_shape, summary
from inferwatch.urls import redact_url

# The options and the plan are imported from here too: ``inferwatch calibrate`` runs the
# sweep through this module.
__all__ = [
    "DEFAULT_PROMPT_TOKENS",
    "EXIT_FAILED",
    "EXIT_REGRESSION",
    "OPTIONS",
    "Plan",
    "Sweep",
    "SweepFailed",
    "main",
    "measure",
    "new_file",
    "plan_from",
    "run",
    "write_file",
]

EXIT_FAILED = 1
EXIT_REGRESSION = 3


@dataclass(frozen=True)
class Sweep:
    """What the sweep measured: the file's metadata and every cell's result (through a
    router, the fleet's: ``replicas`` like replicas behind it)."""

    metadata: Mapping[str, Any]
    results: tuple[CellResult, ...]
    capacity: tuple[Capacity, ...] = ()
    replicas: int = 1

    def baseline(self) -> Baseline:
        """The file: one replica's share of what was measured."""
        cells = (r.cell() for r in self.results)
        return Baseline(
            metadata=self.metadata,
            cells=tuple(c for c in cells if c is not None),
            capacity=self.capacity,
        ).share(self.replicas)


async def run(plan: Plan, progress: Progress) -> Sweep:
    """Probe, calibrate, then every cell in turn with its server-side window."""
    started = time.monotonic()
    date = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    client = Client(
        plan.root,
        plan.api,
        plan.model,
        timeout=plan.request_timeout,
        # Open-loop arrivals keep as many requests in flight as the server lets pile up.
        connections=0 if plan.search else max(plan.concurrency),
        api_key=plan.api_key,
    )
    server = ServerHistograms(plan.metrics_url, plan.server_root, plan.model, progress.note)
    try:
        before = await server.start()
        bounds = _bucket_bounds(before)
        prompts, probes = await _probe(plan, client, progress)
        if not client.ask_exact_length:
            progress.note("the server rejects ignore_eos/min_tokens: outputs may end early")
        if server.problem:
            progress.note(server.problem)
        # Behind a router, the replica's page counts its share of the requests.
        before, _ = await server.window(before, probes // plan.replicas)
        results = []
        for index, key in enumerate(plan.keys()):
            requests = plan.requests_in(key[0])
            progress.start_cell(index, key, requests)
            samples, seconds = await run_cell(
                client, prompts, key, index, requests, progress.request_done
            )
            streamed = sum(s.streamed for s in samples)
            before, window = await server.window(before, streamed // plan.replicas)
            result = CellResult(*key, samples, seconds, window, plan.objectives)
            results.append(result)
            progress.end_cell(result)
        capacity = await _search(plan, client, prompts, progress) if plan.search else ()
    finally:
        await client.close()
        await server.close()
    duration = round(time.monotonic() - started, 1)
    metadata = _metadata(plan, server, prompts, date, duration, bounds)
    return Sweep(metadata, tuple(results), capacity, plan.replicas)


async def _search(
    plan: Plan, client: Client, prompts: Prompts, progress: Progress
) -> tuple[Capacity, ...]:
    """The load search at every shape, after the cells (tags past theirs and the probe's)."""
    assert plan.search is not None
    found = []
    for index, shape in enumerate(plan.shapes()):
        first_tag = len(plan.keys()) + 1 + index * (plan.search.steps + 1)
        found.append(
            await search_shape(
                client, prompts, shape, plan.search, plan.objectives, plan.seed, first_tag,
                progress.note,
            )
        )  # fmt: skip
    return tuple(found)


def _bucket_bounds(page: Histograms | None) -> dict[str, list[float]]:
    """The finite bucket bounds of the server's TTFT and ITL histograms, where it has them."""
    return {
        kind: [float(le) for le, _ in page[name].buckets if le != "+Inf"]
        for kind, name in (("ttft", TTFT), ("itl", ITL))
        if page and name in page
    }


async def _probe(plan: Plan, client: Client, progress: Progress) -> tuple[Prompts, int]:
    """The probe requests before the cells: (the prompts, fitted to the server's tokenizer
    where generated, and how many probe requests were sent)."""
    prompts = Prompts(plan.api, plan.seed, file=plan.file_prompts)
    probe_cell = len(plan.keys())  # tagged as one more cell: no prefix shared with a request
    if plan.file_prompts:
        await client.probe(prompts.for_request(probe_cell, 0, 0))
        return prompts, 1
    return await calibrate(client, prompts, probe_cell, progress.note), 2


def _metadata(
    plan: Plan,
    server: ServerHistograms,
    prompts: Prompts,
    date: str,
    duration: float,
    bounds: Mapping[str, list[float]],
) -> dict[str, Any]:
    """The baseline file's metadata: what was measured, against what, when and how."""
    metadata: dict[str, Any] = {
        "date": date,
        "backend": server.backend,
        "version": server.version,
        "model": plan.model,
        "gpu": plan.gpu_name,
        "api": plan.api,
        "url": redact_url(plan.root),
        "metrics_url": redact_url(plan.metrics_url),
        **({"replica_url": redact_url(plan.replica_root)} if plan.replica_root else {}),
        "prompts": str(plan.prompts_file) if plan.prompts_file else "generated",
        "seed": plan.seed,
        "inferwatch": __version__,
        "duration_seconds": duration,
    }
    metadata["goodput_objectives"] = plan.objectives.document()
    if bounds:  # where an objective's latency bound can go (see calibrate)
        metadata["server_bucket_bounds"] = bounds
    if prompts.calibration is not None:
        metadata["prompt_calibration"] = {
            "fixed_tokens": round(prompts.calibration.fixed, 2),
            "tokens_per_word": round(prompts.calibration.per_word, 3),
        }
    return metadata


class SweepFailed(Exception):
    """The sweep ended without a baseline; ``code`` is the exit status (already reported)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def measure(
    plan: Plan, previous: Baseline | None = None, factor: float = 1.5
) -> tuple[Sweep, dict[tuple[int, int, int], str]]:
    """Run the sweep with progress on stderr and print its table; (the sweep, what
    regressed against ``previous`` per cell). SweepFailed when it cannot run or no cell got
    an answer."""
    progress = Progress(sys.stderr, plan)
    try:
        sweep = asyncio.run(run(plan, progress))
    except SweepError as exc:
        progress.close()
        print(f"inferwatch: error: {printable(str(exc))}", file=sys.stderr)
        raise SweepFailed(EXIT_FAILED) from None
    except KeyboardInterrupt:
        progress.close()
        print("inferwatch: interrupted; nothing written", file=sys.stderr)
        raise SweepFailed(130) from None
    progress.close()
    marks = regressions(sweep.results, previous, factor, plan.replicas) if previous else None
    print(table(sweep.results, marks))
    print(f"{LEGEND}; good: {plan.objectives.text()})")
    for capacity in sweep.capacity:
        print(summary(capacity))
    if plan.replicas > 1:
        print(f"(measured through {redact_url(plan.root)}: the file holds one of the "
              f"{plan.replicas} replicas' share of these rates and concurrency)")  # fmt: skip
    if not sweep.baseline().cells:
        first = next(s.error for r in sweep.results for s in r.errors)
        print(
            f"inferwatch: error: every request failed (first: {printable(first)})", file=sys.stderr
        )
        raise SweepFailed(EXIT_FAILED)
    return sweep, marks or {}


def write_file(path: Path, text: str, private: bool = False) -> None:
    """Replace ``path`` only once the whole file is written, through a file of a fresh name
    that this call creates (never one planted under that name, nor a link's target);
    ``private``: readable by this user only, for a file that holds a secret."""
    partial = path.with_name(f".{path.name}.{secrets.token_hex(8)}.partial")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(partial, flags, 0o600 if private else 0o666)  # less the umask
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)  # gone already once in place


def main(flags: Mapping[str, Any], config: Mapping[str, Any]) -> int:
    """``inferwatch baseline``; returns the exit status (ConfigError for bad input)."""
    values = resolve(OPTIONS, flags, {})
    plan = plan_from(values, spec_from_config(config).slos)
    previous = load_baseline(values["previous"]) if values["previous"] else None
    factor = values["regression_factor"] or spec_from_config(config).threshold("regression_factor")
    try:
        sweep, marks = measure(plan, previous, factor)
    except SweepFailed as failed:
        return failed.code
    write_file(values["out"], to_yaml(sweep.baseline()))
    print(f"inferwatch: wrote {values['out']}", file=sys.stderr)
    regressed = [key for key, mark in marks.items() if mark]
    if regressed:
        print(
            f"inferwatch: {len(regressed)} of {len(sweep.results)} cells regressed against "
            f"{values['previous']} (factor {factor:g})",
            file=sys.stderr,
        )
        return EXIT_REGRESSION
    return 0
