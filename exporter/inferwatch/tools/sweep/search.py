"""The load search (``inferwatch baseline --search on``): per prompt/output shape, the highest
request rate at which goodput stays at its target share, and the throughput knee.

A step sends its requests open loop at one rate (``constant`` or seeded ``poisson``
arrivals); it is good when its share of good requests (:mod:`.goodput`) reaches
``--goodput-target``, and ends early once its verdict is certain. From ``--search-start`` the
rate doubles while steps are good, then bisects between the highest good and lowest bad rate
until within ``--search-tolerance``; the capacity is that good rate, with its mean requests
in flight (Little's law). :func:`knee` is the last step before end-to-end p95 grows faster
than the throughput.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from inferwatch.capacity import Capacity, Step
from inferwatch.collect.stream import Client, Sample
from inferwatch.method.quantile import sample_quantile
from inferwatch.tools.sweep.goodput import Goodput, Objectives
from inferwatch.tools.sweep.prompts import Prompts

MIN_REQUESTS = 16
STEP_SECONDS = 15.0  # of arrivals, by default
CANCELLED = Sample(error="cancelled: the step had failed its target", kind="cancelled")


@dataclass(frozen=True)
class Search:
    """The search's settings (from the options)."""

    arrivals: str = "poisson"
    target: float = 0.95
    tolerance: float = 0.1
    start: float | None = None  # requests/s; None: what one request at a time sustains
    steps: int = 12
    seconds: float = 900.0
    requests: int | None = None  # per step; None: STEP_SECONDS of arrivals

    def requests_at(self, rate: float) -> int:
        """At least :data:`STEP_SECONDS` of arrivals: a shorter step is over before the queue
        a rate builds shows (a handful of requests sent at once all meet their objectives at
        any rate)."""
        return max(self.requests or 0, MIN_REQUESTS, math.ceil(rate * STEP_SECONDS))


def arrival_times(arrivals: str, rate: float, requests: int, rng: random.Random) -> list[float]:
    """Seconds from the step's start at which each request is sent."""
    if arrivals == "constant":
        return [i / rate for i in range(requests)]
    times, at = [], 0.0
    for _ in range(requests):
        times.append(at)
        at += rng.expovariate(rate)
    return times


async def run_step(
    client: Client,
    prompts: Prompts,
    shape: tuple[int, int],
    tag: int,
    times: Sequence[float],
    allowed_bad: int,
    objectives: Objectives,
) -> tuple[list[Sample], float]:
    """The requests of one step at their arrival ``times``; (samples, wall seconds). Stops
    once more than ``allowed_bad`` failed their objectives."""
    prompt_tokens, output_tokens = shape
    samples = [CANCELLED] * len(times)
    failed = asyncio.Event()
    bad = 0

    async def send(index: int, at: float) -> None:
        nonlocal bad
        await asyncio.sleep(max(0.0, started + at - time.perf_counter()))
        sample = await client.stream(prompts.for_request(tag, index, prompt_tokens), output_tokens)
        samples[index] = sample
        if not objectives.met(sample):
            bad += 1
            if bad > allowed_bad:
                failed.set()

    started = time.perf_counter()
    tasks = [asyncio.create_task(send(i, at)) for i, at in enumerate(times)]
    every, watch = asyncio.gather(*tasks), asyncio.create_task(failed.wait())
    try:
        await asyncio.wait([every, watch], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (*tasks, watch):
            task.cancel()
        await asyncio.gather(every, watch, return_exceptions=True)
    return samples, time.perf_counter() - started


def step_of(rate: float, samples: Sequence[Sample], seconds: float, objectives: Objectives) -> Step:
    """What one step measured."""
    ok = [s for s in samples if s.ok]

    def p95(values: list[float]) -> float:  # 0 without an answer
        return round(sample_quantile(0.95, values), 6) if values else 0.0

    return Step(
        rate=round(rate, 4),
        requests=len(samples),
        requests_per_second=round(len(ok) / seconds, 3),
        goodput_share=Goodput.of(samples, seconds, objectives).share,
        concurrency=round(math.fsum(s.e2e for s in ok) / seconds, 3),
        ttft_p95=p95([s.ttft for s in ok]),
        itl_p95=p95([g for s in ok for g in s.gaps]),
        e2e_p95=p95([s.e2e for s in ok]),
    )


def knee(steps: Sequence[Step]) -> float | None:
    """The throughput knee of the steps (see the module's docstring), or None."""
    answered = sorted((s for s in steps if s.requests_per_second and s.e2e_p95), key=_by_rate)
    if len(answered) < 3:
        return None
    for low, high in itertools.pairwise(answered):
        grew = math.log(high.requests_per_second / low.requests_per_second)
        slower = math.log(high.e2e_p95 / low.e2e_p95)
        if grew <= 0 or slower > grew:
            return low.requests_per_second
    return None


def _by_rate(step: Step) -> float:
    return step.rate


def bounds(steps: Sequence[Step], target: float) -> tuple[Step | None, float | None]:
    """(the good step of the highest rate below the lowest bad rate, that bad rate): a good
    step above a bad one is noise, and the lower bad rate stands."""
    bad = min((s.rate for s in steps if s.goodput_share < target), default=None)
    good = max(
        (s for s in steps if s.goodput_share >= target and (bad is None or s.rate < bad)),
        key=_by_rate,
        default=None,
    )
    return good, bad


def next_rate(steps: Sequence[Step], target: float, tolerance: float) -> float | None:
    """The rate to measure next, or None once the good and bad rates are close enough."""
    good, bad = bounds(steps, target)
    if bad is None:
        return 2 * steps[-1].rate
    if good is None:
        return bad / 2
    if bad - good.rate <= tolerance * good.rate:
        return None
    return (good.rate + bad) / 2


async def search_shape(
    client: Client,
    prompts: Prompts,
    shape: tuple[int, int],
    settings: Search,
    objectives: Objectives,
    seed: int,
    first_tag: int,
    note: Callable[[str], None],
) -> Capacity:
    """The capacity at one shape; ``first_tag``: its prompts' first tag (one per step)."""
    deadline = time.monotonic() + settings.seconds
    rate = settings.start or await _sustained_by_one(client, prompts, shape, first_tag)
    steps: list[Step] = []
    ended = "step limit"
    for index in range(settings.steps):
        if time.monotonic() > deadline:
            ended = "time limit"
            break
        rng = random.Random(f"{seed}.{shape[0]}.{shape[1]}.{index}")
        times = arrival_times(settings.arrivals, rate, settings.requests_at(rate), rng)
        allowed_bad = math.floor((1 - settings.target) * len(times) + 1e-9)
        samples, seconds = await run_step(
            client, prompts, shape, first_tag + 1 + index, times, allowed_bad, objectives
        )
        if CANCELLED in samples:  # what the cancelled requests left is worked off first
            await client.stream(prompts.for_request(first_tag, 1 + index, shape[0]), shape[1])
        step = step_of(rate, samples, seconds, objectives)
        steps.append(step)
        note(_progress(shape, index, settings, step))
        following = next_rate(steps, settings.target, settings.tolerance)
        if following is None:
            ended = "converged"
            break
        rate = following
    return _capacity(shape, settings, steps, ended)


async def _sustained_by_one(
    client: Client, prompts: Prompts, shape: tuple[int, int], tag: int
) -> float:
    """What one request at a time sustains: 1 / the duration of one request sent alone."""
    sample = await client.stream(prompts.for_request(tag, 0, shape[0]), shape[1])
    if not sample.ok:
        return 1.0  # the first step says more than this request could
    return 1 / max(sample.e2e, 1e-3)


def _capacity(shape: tuple[int, int], settings: Search, steps: list[Step], ended: str) -> Capacity:
    best, _ = bounds(steps, settings.target)
    return Capacity(
        prompt_tokens=shape[0],
        output_tokens=shape[1],
        requests_per_second=best.rate if best else None,
        concurrency=best.concurrency if best else None,
        goodput_share=best.goodput_share if best else None,
        target_share=settings.target,
        arrivals=settings.arrivals,
        tolerance=settings.tolerance,
        ended=ended if best else "no good rate",
        steps=tuple(steps),
        knee_requests_per_second=knee(steps),
    )


def _progress(shape: tuple[int, int], index: int, settings: Search, step: Step) -> str:
    verdict = ">=" if step.goodput_share >= settings.target else "<"
    return (
        f"search prompt {shape[0] or 'file'}, output {shape[1]}: step {index + 1}/"
        f"{settings.steps} at {step.rate:.3g} req/s ({settings.arrivals}): goodput "
        f"{step.goodput_share:.3f} {verdict} {settings.target:g}, {step.requests_per_second:.3g} "
        f"req/s answered, e2e p95 {step.e2e_p95:.3g} s"
    )


def summary(capacity: Capacity) -> str:
    """One line for the report: ``capacity at prompt 128, output 64: 4.5 req/s ...``."""
    where = (
        f"capacity at prompt {capacity.prompt_tokens or 'file'}, output {capacity.output_tokens}"
    )
    if capacity.requests_per_second is None:
        return f"{where}: no rate measured met the goodput target ({len(capacity.steps)} steps)"
    knee_text = (
        f"; knee {capacity.knee_requests_per_second:.3g} req/s"
        if capacity.knee_requests_per_second is not None
        else ""
    )
    return (
        f"{where}: {capacity.requests_per_second:.3g} req/s, {capacity.concurrency:.3g} in "
        f"flight, goodput {capacity.goodput_share:.3f} >= {capacity.target_share:g} "
        f"({capacity.arrivals} arrivals, {len(capacity.steps)} steps, {capacity.ended}, "
        f"tolerance {capacity.tolerance:g}{knee_text})"
    )
