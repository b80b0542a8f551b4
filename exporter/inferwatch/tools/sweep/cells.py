"""One cell of the sweep (a concurrency, a prompt and an output length): its requests at
constant load, and :class:`CellResult`, what they measured, as a baseline cell.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from inferwatch.baseline import Cell, Quantiles
from inferwatch.collect.stream import Client, Sample
from inferwatch.method.quantile import histogram_quantile, sample_quantile
from inferwatch.model import Histogram
from inferwatch.tools.sweep.goodput import Goodput, Objectives
from inferwatch.tools.sweep.histograms import DECODE_STEP, ITL, TTFT
from inferwatch.tools.sweep.prompts import Prompts


def _quantiles(values: Sequence[float]) -> Quantiles:
    return Quantiles(*(round(sample_quantile(q, values), 6) for q in (0.5, 0.95, 0.99)))


@dataclass(frozen=True)
class CellResult:
    """What one cell measured: every request's sample, its wall time, the server window."""

    concurrency: int
    prompt_tokens: int
    output_tokens: int
    samples: tuple[Sample, ...]
    seconds: float
    server_windows: Mapping[str, Histogram] = field(default_factory=dict)
    objectives: Objectives = field(default_factory=Objectives)  # what a good request meets

    @property
    def goodput(self) -> Goodput:
        return Goodput.of(self.samples, self.seconds, self.objectives)

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.concurrency, self.prompt_tokens, self.output_tokens)

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.ok]

    @property
    def errors(self) -> list[Sample]:
        return [s for s in self.samples if not s.ok]

    @property
    def server_window(self) -> Histogram | None:
        """The server's TTFT histogram over the cell."""
        return self.server_windows.get(TTFT)

    def server_quantiles(self, name: str = TTFT) -> Quantiles | None:
        """p50/p95/p99 of one of the server's histograms over the cell, as PromQL's
        ``histogram_quantile`` reads it; None without it or without observations."""
        window = self.server_windows.get(name)
        if window is None:
            return None
        values = [histogram_quantile(q, window.buckets) for q in (0.5, 0.95, 0.99)]
        if any(math.isnan(v) for v in values):
            return None
        return Quantiles(*(round(v, 6) for v in values))

    def cell(self) -> Cell | None:
        """The baseline cell, or None when no request succeeded."""
        ok = self.ok
        if not ok:
            return None
        goodput = self.goodput
        return Cell(
            concurrency=self.concurrency,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            requests=len(self.samples),
            errors=len(self.samples) - len(ok),
            ttft_seconds=_quantiles([s.ttft for s in ok]),
            itl_seconds=_quantiles([g for s in ok for g in s.gaps] or [0.0]),
            e2e_seconds=_quantiles([s.e2e for s in ok]),
            requests_per_second=round(len(ok) / self.seconds, 3),
            output_tokens_per_second=round(sum(s.output_tokens for s in ok) / self.seconds, 3),
            server_ttft_seconds=self.server_quantiles(TTFT),
            server_itl_seconds=self.server_quantiles(ITL),
            server_decode_step_seconds=self.server_quantiles(DECODE_STEP),
            goodput_share=goodput.share,
            goodput_requests_per_second=goodput.requests_per_second,
            goodput_tokens_per_second=goodput.tokens_per_second,
        )

    def mean_prompt_tokens(self) -> float | None:
        counts = [s.prompt_tokens for s in self.ok if s.prompt_tokens is not None]
        return sum(counts) / len(counts) if counts else None


async def run_cell(
    client: Client,
    prompts: Prompts,
    key: tuple[int, int, int],
    cell_index: int,
    requests: int,
    on_request: Callable[[], None],
) -> tuple[tuple[Sample, ...], float]:
    """``requests`` requests by ``concurrency`` workers; (samples, wall seconds)."""
    concurrency, prompt_tokens, output_tokens = key
    samples: list[Sample] = [Sample()] * requests
    pending = iter(range(requests))

    async def worker() -> None:
        for index in pending:
            prompt_input = prompts.for_request(cell_index, index, prompt_tokens)
            samples[index] = await client.stream(prompt_input, output_tokens)
            on_request()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, requests))))
    return tuple(samples), time.perf_counter() - start
