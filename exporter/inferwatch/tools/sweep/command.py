"""``inferwatch baseline``: a load sweep against an OpenAI-compatible server.

For every cell of concurrency x prompt tokens x output tokens, ``N`` streamed requests
(``--requests-per-cell``, default ``max(8, 2 x concurrency)``) are sent by ``concurrency``
workers, each starting its next request the moment its last one ends, so the load is
constant. Per request, on the client (``time.perf_counter``):

- **TTFT**: from sending the request to the arrival of the first SSE event that delivers a
  token (completions ``text``, chat ``delta.content`` or reasoning text, possibly empty: a
  token that ends inside a multi-byte character streams as ""; a chat stream's role
  announcement and a bare ``finish_reason`` event do not count);
- **ITL**: the gaps between successive token events, pooled over the cell's requests
  (events that arrive in one network read share a timestamp; their gap is 0, as the client
  saw it: a server that streams faster than its API process or the client keeps up with,
  such as a tiny model on a busy CPU, delivers bursts, and ITL p50 reads 0);
- **e2e**: from sending to the end of the stream (``[DONE]``).

A request that fails (HTTP status, connection, timeout, an error event, a stream without a
token) counts as an error of its cell and never stops the sweep.

**Prompt length.** Prompts are built locally from a word list, each a different shuffle of
it repeated, behind a tag unique to the run, cell and request (``{seed}.{cell}.{request}``):
any two prompts part within their first few tokens, inside the first KV-cache block, so
the server's prefix cache cannot serve one prompt from another's blocks; the default seed
is fresh each run, so a rerun does not hit the cache the last one left. A word-level
tokenizer never merges across words, so a
full pass of the word list costs a fixed number of tokens: two probe requests of one and
two passes, read from the server's ``usage.prompt_tokens``, give the tokens per pass and
the fixed tokens the API adds (BOS, chat template), and every prompt gets the word count
that hits its token target. ``--prompts FILE.jsonl`` sends real prompts instead (cell
``prompt_tokens`` 0 then marks "not controlled"). ``ignore_eos`` and ``min_tokens`` ask for
exactly ``--output-tokens`` tokens; a server that rejects them is asked without.

**Server-side TTFT and ITL** for the same window: the TTFT and inter-token latency
histograms of ``--metrics-url`` (the server's own ``/metrics``, or inferwatch's) are scraped
before and after each cell; after a cell they are re-read for up to
:data:`.histograms.SETTLE_SECONDS` until the TTFT histogram has counted every request that
streamed a token (a sidecar's page lags by one poll). The window's p50/p95/p99 follow PromQL's ``histogram_quantile``, exactly
as the alert rules read the same histograms (``inferwatch calibrate`` derives the rules'
thresholds from them); ``gap`` = client TTFT p50 - server TTFT p50 is what the
server's histogram does not see: network, HTTP, tokenization, detokenization, SSE. Other
traffic to the server during the sweep lands in the windows too.

Sample of the table it prints (vLLM 0.32, the tiny test model on 2 busy CPU cores)::

    conc  prompt  output  TTFT p50  TTFT p95  server p50   gap  ITL p50  ITL p95  e2e p95  req/s  tok/s  errors
       1      64      32      53.2     265.5        31.4  21.8      4.0     25.2    526.1    3.0   97.5       0
       1     256      32      65.9      69.3        66.7  -0.8      7.5     20.8    305.8    3.5  110.7       0
       4      64      32     110.9     150.3        86.7  24.2      9.7     27.2    435.5   10.1  324.4       0
       4     256      32     155.5     404.3       100.0  55.5      0.0     53.6    710.3    7.3  234.4       0
    (latencies in ms; server p50: the server's TTFT histogram over the cell's window; gap = TTFT p50 - server p50)

A negative gap is the histogram's resolution: the server p50 is interpolated inside a
bucket (vLLM's run 0.06-0.08-0.1-0.25 s), the client p50 is exact.

Exit status: 0, or 3 when ``--previous`` is given and a cell regressed (TTFT p95 or ITL
p95 above ``--regression-factor`` x the previous, or every request of a cell failed); the
file is written either way. 1 when the sweep cannot run (the probe fails) or no cell got a
single answer; 2 for bad input.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from inferwatch import __version__
from inferwatch.baseline import Baseline, to_yaml
from inferwatch.baseline import load as load_baseline
from inferwatch.collect.stream import Client, SweepError
from inferwatch.collect.upstream import redact_url
from inferwatch.method.spec import spec_from_config
from inferwatch.settings import (
    ConfigError,
    Option,
    bounded_float,
    existing_file,
    http_url,
    positive_float,
    positive_int,
    resolve,
)
from inferwatch.tools.sweep.cells import CellResult, run_cell
from inferwatch.tools.sweep.histograms import ITL, TTFT, ServerHistograms
from inferwatch.tools.sweep.prompts import Prompts, calibrate, load_prompts
from inferwatch.tools.sweep.report import LEGEND, Progress, regressions, table

EXIT_FAILED = 1
EXIT_REGRESSION = 3


def _int_list(minimum: int) -> Callable[[str], tuple[int, ...]]:
    def parse(text: str) -> tuple[int, ...]:
        values = []
        for item in text.split(","):
            try:
                value = positive_int(item.strip())
            except ValueError as exc:
                raise ValueError(f"{text!r}: {exc}") from None
            if value < minimum:
                raise ValueError(f"{text!r}: {value} is below the minimum of {minimum}")
            if value in values:
                raise ValueError(f"{text!r} lists {value} twice")
            values.append(value)
        return tuple(values)

    return parse


def _name(text: str) -> str:
    if not text:
        raise ValueError("must not be empty")
    return text


def new_file(text: str) -> Path:
    path = Path(text)
    if not path.parent.is_dir():
        raise ValueError(f"{text}: directory {path.parent} does not exist")
    if path.is_dir():
        raise ValueError(f"{text} is a directory")
    return path


OPTIONS = (
    Option("--url", http_url, None, "OpenAI-compatible server base URL (required)", metavar="URL"),
    Option("--model", _name, None, "model name to request (required)", metavar="NAME"),
    Option("--out", new_file, None, "baseline file to write (required)", metavar="FILE"),
    Option("--api", str, "completions", "completions or chat", choices=("completions", "chat")),
    Option("--concurrency", _int_list(1), "1,4,16", "concurrency levels", metavar="N,N"),
    Option(
        "--prompt-tokens",
        _int_list(1),
        None,
        "prompt lengths in tokens (default: 128,1024; not with --prompts)",
        metavar="N,N",
    ),
    # ITL needs two tokens at least.
    Option("--output-tokens", _int_list(2), "64,256", "output lengths in tokens", metavar="N,N"),
    Option(
        "--requests-per-cell",
        positive_int,
        None,
        "requests per cell (default: max(8, 2 x concurrency))",
        metavar="N",
    ),
    Option(
        "--prompts",
        existing_file,
        None,
        "JSONL of real prompts, one object per line with `prompt` or `messages`",
        metavar="FILE",
    ),
    Option(
        "--metrics-url",
        http_url,
        None,
        "metrics page for the server-side TTFT (default: URL/metrics; inferwatch's works too)",
        metavar="URL",
    ),
    Option("--gpu-name", _name, "unknown", "GPU recorded in the file's metadata", metavar="NAME"),
    Option(
        "--previous",
        existing_file,
        None,
        "earlier baseline to mark regressions against",
        metavar="FILE",
    ),
    Option(
        "--regression-factor",
        bounded_float(1, 1000),
        None,
        "a cell regressed when its TTFT or ITL p95 exceeds this x the previous "
        "(default: the thresholds' regression_factor, 1.5)",
        metavar="X",
    ),
    Option("--request-timeout", positive_float, 300.0, "seconds one request may take", metavar="S"),
    Option(
        "--seed",
        positive_int,
        None,
        "seed of the generated prompts (default: a fresh one, recorded in the file)",
        metavar="N",
    ),
    Option(
        "--api-key", _name, None, "bearer token for the API (prefer the env var)", metavar="KEY"
    ),
)
REQUIRED = ("url", "model", "out")
DEFAULT_PROMPT_TOKENS = "128,1024"


@dataclass(frozen=True)
class Plan:
    """The sweep, validated from the options."""

    root: str
    model: str
    api: str
    concurrency: tuple[int, ...]
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    requests_per_cell: int | None
    metrics_url: str
    gpu_name: str
    request_timeout: float
    seed: int
    api_key: str | None = field(default=None, repr=False)
    prompts_file: Path | None = None
    file_prompts: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> Plan:
        root = values["url"].rstrip("/").removesuffix("/v1")
        prompts_file = values["prompts"]
        if prompts_file is not None and values["prompt_tokens"] is not None:
            raise ConfigError("--prompts replaces --prompt-tokens: give one of them")
        prompt_tokens = values["prompt_tokens"]
        if prompts_file is None and prompt_tokens is None:
            prompt_tokens = _int_list(1)(DEFAULT_PROMPT_TOKENS)
        return cls(
            root=root,
            model=values["model"],
            api=values["api"],
            concurrency=values["concurrency"],
            prompt_tokens=(0,) if prompts_file is not None else prompt_tokens,
            output_tokens=values["output_tokens"],
            requests_per_cell=values["requests_per_cell"],
            metrics_url=values["metrics_url"] or root + "/metrics",
            gpu_name=values["gpu_name"],
            request_timeout=values["request_timeout"],
            seed=values["seed"] or random.randrange(1, 1_000_000),
            api_key=values["api_key"],
            prompts_file=prompts_file,
            file_prompts=load_prompts(prompts_file, values["api"]) if prompts_file else (),
        )

    def keys(self) -> list[tuple[int, int, int]]:
        return [
            (c, p, o)
            for c in self.concurrency
            for p in self.prompt_tokens
            for o in self.output_tokens
        ]

    def requests_in(self, concurrency: int) -> int:
        return self.requests_per_cell or max(8, 2 * concurrency)


@dataclass(frozen=True)
class Sweep:
    metadata: Mapping[str, Any]
    results: tuple[CellResult, ...]

    def baseline(self) -> Baseline:
        cells = (r.cell() for r in self.results)
        return Baseline(metadata=self.metadata, cells=tuple(c for c in cells if c is not None))


async def run(plan: Plan, progress: Progress) -> Sweep:
    """Probe, calibrate, then every cell in turn with its server-side window."""
    started = time.monotonic()
    date = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    client = Client(
        plan.root,
        plan.api,
        plan.model,
        timeout=plan.request_timeout,
        connections=max(plan.concurrency),
        api_key=plan.api_key,
    )
    server = ServerHistograms(plan.metrics_url, plan.root, plan.model, progress.note)
    bounds: dict[str, list[float]] = {}
    try:
        before = await server.start()
        for kind, name in (("ttft", TTFT), ("itl", ITL)):
            if before and name in before:
                bounds[kind] = [float(le) for le, _ in before[name].buckets if le != "+Inf"]
        prompts = Prompts(plan.api, plan.seed, file=plan.file_prompts)
        probe_cell = len(plan.keys())  # tagged as one more cell: no prefix shared with a request
        if plan.file_prompts:
            await client.probe(prompts.for_request(probe_cell, 0, 0))
            probes = 1
        else:
            prompts = await calibrate(client, prompts, probe_cell, progress.note)
            probes = 2
        if not client.ask_exact_length:
            progress.note("the server rejects ignore_eos/min_tokens: outputs may end early")
        if server.problem:
            progress.note(server.problem)
        before, _ = await server.window(before, probes)
        results = []
        for index, key in enumerate(plan.keys()):
            requests = plan.requests_in(key[0])
            progress.start_cell(index, key, requests)
            samples, seconds = await run_cell(
                client, prompts, key, index, requests, progress.request_done
            )
            streamed = sum(s.streamed for s in samples)
            before, window = await server.window(before, streamed)
            result = CellResult(*key, samples, seconds, window)
            results.append(result)
            progress.end_cell(result)
    finally:
        await client.close()
        await server.close()
    metadata: dict[str, Any] = {
        "date": date,
        "backend": server.backend,
        "version": server.version,
        "model": plan.model,
        "gpu": plan.gpu_name,
        "api": plan.api,
        "url": redact_url(plan.root),
        "metrics_url": redact_url(plan.metrics_url),
        "prompts": str(plan.prompts_file) if plan.prompts_file else "generated",
        "seed": plan.seed,
        "inferwatch": __version__,
        "duration_seconds": round(time.monotonic() - started, 1),
    }
    if bounds:  # where an objective's latency bound can go (see calibrate)
        metadata["server_bucket_bounds"] = bounds
    if prompts.calibration is not None:
        metadata["prompt_calibration"] = {
            "fixed_tokens": round(prompts.calibration.fixed, 2),
            "tokens_per_word": round(prompts.calibration.per_word, 3),
        }
    return Sweep(metadata, tuple(results))


class SweepFailed(Exception):
    """The sweep ended without a baseline; ``code`` is the exit status (already reported)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def plan_from(values: Mapping[str, Any]) -> Plan:
    """The plan from resolved option values; ConfigError when a required one is missing."""
    for option in OPTIONS:
        if option.key in REQUIRED and option.key in values and values[option.key] is None:
            raise ConfigError(f"{option.flag} is required (or {option.env})")
    return Plan.from_values(values)


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
        print(f"inferwatch: error: {exc}", file=sys.stderr)
        raise SweepFailed(EXIT_FAILED) from None
    except KeyboardInterrupt:
        progress.close()
        print("inferwatch: interrupted; nothing written", file=sys.stderr)
        raise SweepFailed(130) from None
    progress.close()
    marks = regressions(sweep.results, previous, factor) if previous else None
    print(table(sweep.results, marks))
    print(LEGEND)
    if not sweep.baseline().cells:
        first = next(s.error for r in sweep.results for s in r.errors)
        print(f"inferwatch: error: every request failed (first: {first})", file=sys.stderr)
        raise SweepFailed(EXIT_FAILED)
    return sweep, marks or {}


def write_file(path: Path, text: str) -> None:
    """Replace ``path`` only once the whole file is written."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def main(flags: Mapping[str, Any], config: Mapping[str, Any]) -> int:
    """``inferwatch baseline``; returns the exit status (ConfigError for bad input)."""
    values = resolve(OPTIONS, flags, {})
    plan = plan_from(values)
    previous = load_baseline(values["previous"]) if values["previous"] else None
    factor = values["regression_factor"] or spec_from_config(config).t("regression_factor")
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
