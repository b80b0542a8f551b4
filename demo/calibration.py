"""Baseline first, on the machine at hand: the demo's thresholds and fault sizes, measured.

Before any fault, the demo and the e2e tests run ``inferwatch calibrate`` against the real
vLLM, as a user would next to a real server: its thresholds (latency from the measured
percentiles, traffic minimums from the measured throughput) become the config that
inferwatch serves with and the rules are generated from. Then each fault is sized from
measurements of the same server, never from a constant that assumes a CPU's speed:

- **long prompts**: prompts grow until the server's own TTFT histogram (read as PromQL's
  ``histogram_quantile`` reads it) puts their prefill at :data:`PREFILL_MULTIPLE` x the
  calibrated TTFT threshold;
- **overload**, **engine stall**: client counts are multiples of the batch the engine runs
  at once (``--max-num-seqs``, capped by what the KV cache holds);
- **KV-cache pressure**: a batch of requests whose tokens add up to twice the KV cache the
  server reports (``vllm:cache_config_info``);
- **slow path**: the proxy in front of the server holds each request twice the client-gap
  threshold, itself raised to what the canary measures through that proxy under normal
  traffic (:meth:`Measured.with_client_gap`).

The server's longest step is measured too: one burst of the KV fault's size (its biggest
batch, with the recompute of preempted requests) while its page is read every
:data:`STEP_POLL` seconds; the longest stretch without a step while requests run or wait
becomes ``engine_step_seconds``, so that without NVML inferwatch knows a long step from a
stall (measured here: 1.2-1.9 s on 2 cores).
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp

from demo.capacity import measure_capacity
from demo.stack import MODEL_NAME, VLLM_ARGS, StackError, VllmServer, http_get
from demo.traffic import Burst, burst, complete, complete_many, prompt
from inferwatch.collect.textparse import parse_labels, scan
from inferwatch.method.quantile import histogram_quantile
from inferwatch.method.spec import Spec, spec_from_config
from inferwatch.settings import load_config_file
from inferwatch.tools.sweep.histograms import TTFT, ServerHistograms

# The demo's normal traffic: two clients, short prompts, short answers (normal_load).
NORMAL_CLIENTS, NORMAL_WORDS, NORMAL_OUTPUT = 2, 6, 16
# The demo service is calibrated at its normal load, which is sent as the sweep sends it, back
# to back: a server that idles between requests answers slower (the engine wakes up first;
# measured here: TTFT p95 15-17 ms with 0.2 s pauses, 9-10 ms back to back), so light traffic
# with pauses would sit above thresholds measured without them. One level only: the load
# (running requests averaged over the rate window) sits between 1 and 2 under this traffic,
# and a cell at 1 would hold it to half the load's latency.
CALIBRATED_CONCURRENCY = (NORMAL_CLIENTS,)
# At least enough that a p95 rests on ten requests, not on the two slowest; and as many as the
# normal traffic sends in CELL_WINDOWS of the rules' rate windows (its rate measured first,
# for THROUGHPUT_SECONDS): the rules read a p95 per window, which varies from window to
# window, and a short cell caught one quiet moment (measured here: 200 requests in 6 s, p95
# 12.7 ms, where the 15 s windows then read 15-25 ms under the same load).
REQUESTS_PER_CELL = 200
CELL_WINDOWS = 3
THROUGHPUT_SECONDS = 5.0
# The canary's gap and the server's CPU wait under normal traffic are read over this many
# rate windows, and their thresholds set NORMAL_MARGIN x above the largest reading (where
# above the default): a machine whose cores the engine's threads hold leaves the proxy and
# the sidecar waiting for CPU (measured here before the server ran at VLLM_NICENESS: gaps
# of 100-250 ms), and the server, niced, waits for the rest of the stack.
NORMAL_WINDOWS = 2
NORMAL_MARGIN = 2.0
# The server's CPU wait varies from window to window with whatever else runs (a diagnose
# started beside it, a burst of scrapes): measured here from 26 to 58 % of its ready time
# with the healthy stack, across runs. Its threshold is the share at which the server waits
# CPU_WAIT_MARGIN x as long per CPU second as the most it did under normal traffic.
CPU_WAIT_MARGIN = 4.0
# A long-prompt fault's prefill, as a multiple of the calibrated TTFT threshold.
PREFILL_MULTIPLE = 2.0
LONG_PROMPT_OUTPUT = 8
PROBES_PER_LENGTH = 3
# The server's page is read this often while its longest step is measured.
STEP_POLL = 0.05


@dataclass(frozen=True)
class FaultSizes:
    """What each fault sends, sized from measurements of the server at hand."""

    batch: int  # requests the engine runs at once
    kv_tokens: int  # KV-cache capacity in tokens
    tokens_per_word: float  # of the demo's generated prompts
    long_prompt_words: int
    long_prompt_ttft: float  # the server's TTFT p50 for such a prompt, alone
    client_gap: float  # the client-gap threshold
    capacity: float  # requests/s of the normal shape at the goodput target (demo/capacity.py)
    # Busy loops of the noisy neighbour: one per CPU this process may run on (all of the
    # machine's, or the one core of a pinned run).
    neighbours: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))

    @property
    def path_delay(self) -> float:
        """Seconds the slow path holds each request: twice the client-gap threshold."""
        return 2 * self.client_gap

    @property
    def streams(self) -> int:
        """Streams decoding while long prompts arrive: four, as in the tracker's report, or
        what the batch leaves beside the long prompt."""
        return min(4, self.batch - 1)

    @property
    def stream_tokens(self) -> int:
        """Each stream's answer: long enough to decode through several long prompts, short
        enough that the streams and a long prompt hold under half the KV cache."""
        long_prompt = math.ceil(self.long_prompt_words * self.tokens_per_word)
        return max(NORMAL_OUTPUT, (self.kv_tokens // 2 - long_prompt) // self.streams)

    @property
    def kv_requests(self) -> int:
        return self.batch + self.batch // 2

    @property
    def overload_clients(self) -> int:
        return 4 * self.batch

    @property
    def stall_clients(self) -> int:
        return 2 * self.batch

    @property
    def kv_request_tokens(self) -> int:
        """Tokens per request so that a full batch holds twice the KV cache: the scheduler
        must preempt."""
        return math.ceil(2 * self.kv_tokens / self.batch)

    @property
    def kv_prompt_words(self) -> int:
        """The normal traffic's short prompts: the cache fills while the batch decodes (a
        long prompt would make each burst's first step a long prefill, the prefill layer's
        cause, not this one's)."""
        return NORMAL_WORDS

    @property
    def kv_output_tokens(self) -> int:
        return self.kv_request_tokens - math.ceil(NORMAL_WORDS * self.tokens_per_word)


@dataclass(frozen=True)
class NormalReadings:
    """What the sidecar read under normal traffic, with the stack running: the latency
    quantiles of its window and the canary's gap at each read, the shares over each rate
    window between reads."""

    ttft_p95: list[float]
    itl_p95: list[float]
    itl_p99: list[float]
    canary_gaps: list[float]
    cpu_wait_shares: list[float]
    itl_tail_shares: list[float]


# The latency thresholds and what the sidecar reads for each under normal traffic.
_LATENCY = (
    ("ttft_p95_seconds", "ttft_p95", "TTFT p95"),
    ("itl_p95_seconds", "itl_p95", "ITL p95"),
    ("itl_p99_seconds", "itl_p99", "ITL p99"),
)


@dataclass(frozen=True)
class Measured:
    """The config ``inferwatch calibrate`` wrote, as the demo adds what it measures."""

    config: Path
    spec: Spec

    def with_readings(self, readings: NormalReadings) -> Measured:
        """The thresholds of what the sidecar reads under normal traffic, from readings."""
        return (
            self.with_latency(readings)
            .with_client_gap(readings.canary_gaps)
            .with_cpu_wait(readings.cpu_wait_shares)
            .with_itl_tail(readings.itl_tail_shares)
        )

    def with_latency(self, readings: NormalReadings) -> Measured:
        """Each latency threshold raised to :data:`NORMAL_MARGIN` x the largest window
        quantile the sidecar read under normal traffic, if that is more, and the regression
        factor with them: the sweep's percentile is over all its requests, a window's over
        a few hundred, and the rules judge windows (measured here: a sweep's TTFT p95 of
        83 ms, then windows of normal traffic from 95 to 210 ms)."""
        measured, raised = self, 1.0
        for name, field_name, label in _LATENCY:
            values = getattr(readings, field_name)
            wanted = NORMAL_MARGIN * max(values)
            current = measured.spec.threshold(name)
            if wanted <= current:
                continue
            raised = max(raised, wanted / current)
            why = (
                f"{NORMAL_MARGIN:g} x {max(values) * 1000:.1f} ms, the largest {label} of the "
                f"sidecar's window over {len(values)} reads of normal traffic"
            )
            measured = measured._with_threshold(name, wanted, why)
        if raised == 1.0:
            return measured
        factor = measured.spec.threshold("regression_factor")
        why = f"{factor:g} x {raised:.3g}, as far as the latency thresholds were raised"
        return measured._with_threshold("regression_factor", factor * raised, why)

    def with_client_gap(self, gaps: list[float]) -> Measured:
        """The client-gap threshold raised to :data:`NORMAL_MARGIN` x the largest gap the
        canary measured under normal traffic, if that is more (the slow path's delay is
        sized from it). The config file says where the number came from."""
        measured = NORMAL_MARGIN * max(gaps)
        if measured <= self.spec.threshold("client_gap_seconds"):
            return self
        why = (
            f"{NORMAL_MARGIN:g} x {max(gaps) * 1000:.1f} ms, the canary's largest gap over "
            f"{len(gaps)} readings under normal traffic"
        )
        return self._with_threshold("client_gap_seconds", measured, why)

    def with_cpu_wait(self, shares: list[float]) -> Measured:
        """The server-CPU wait threshold raised to the share at which the server waits
        :data:`CPU_WAIT_MARGIN` x as long per second of CPU as it did at most under normal
        traffic (each share measured over a rate window), if that is more: on this machine
        the engine shares its cores with the sidecar, Prometheus and the traffic, niced."""
        most = max(shares)
        odds = CPU_WAIT_MARGIN * most / (1 - most) if most < 1 else math.inf
        measured = odds / (1 + odds) if math.isfinite(odds) else 1.0
        if measured <= self.spec.threshold("server_cpu_wait_share"):
            return self
        why = (
            f"the share at which the server waits {CPU_WAIT_MARGIN:g} x as long per CPU second as "
            f"at most under normal traffic ({most:.1%} of its ready time, {len(shares)} "
            "windows)"
        )
        return self._with_threshold("server_cpu_wait_share", measured, why)

    def with_itl_tail(self, shares: list[float]) -> Measured:
        """The ITL tail share raised to :data:`NORMAL_MARGIN` x the largest share of token
        gaps above the tail bound under normal traffic, if that is more (under half the
        gaps: the tail's condition needs most of them under the bound)."""
        measured = NORMAL_MARGIN * max(shares)
        if measured <= self.spec.threshold("itl_tail_share"):
            return self
        if measured >= 0.5:
            raise StackError(
                f"{max(shares):.1%} of the token gaps under normal traffic are above the "
                f"tail bound ({self.spec.threshold('itl_tail_bound_seconds'):g} s): no tail "
                "can be told from the normal"
            )
        why = (
            f"{NORMAL_MARGIN:g} x {max(shares):.2%}, the largest share of token gaps above "
            f"the tail bound over {len(shares)} windows of normal traffic"
        )
        return self._with_threshold("itl_tail_share", measured, why)

    def with_engine_step(self, seconds: float) -> Measured:
        """The config with the server's longest step, measured (:func:`longest_step`)."""
        why = (
            "# measured by the demo: the longest stretch without an engine step while one "
            "burst of the KV fault's size ran\n"
        )
        self.config.write_text(
            self.config.read_text() + why + f"engine_step_seconds: {seconds:.4g}\n"
        )
        return self

    def _with_threshold(self, name: str, value: float, why: str) -> Measured:
        """The config with ``name`` set to ``value``, and a comment that says why."""
        text = self.config.read_text()
        line = re.search(rf"^  {name}: .*$", text, re.M)
        if line is None:
            raise StackError(f"{self.config} sets no {name}")
        comment = f"  # measured by the demo: {why}\n"
        setting = f"  {name}: {value:.4g}"
        self.config.write_text(text[: line.start()] + comment + setting + text[line.end() :])
        return replace(self, spec=spec_from_config(load_config_file(self.config)))


@dataclass(frozen=True)
class Calibration:
    config: Path  # written by `inferwatch calibrate`, with what the demo measured added
    spec: Spec
    faults: FaultSizes
    engine_step: float  # the server's longest step

    def summary(self) -> list[str]:
        """The calibration as the demo's first screen shows it."""
        t, f = self.spec.threshold, self.faults
        return [
            f"calibrated on this machine ({self.config}):",
            f"  TTFT p95 threshold {t('ttft_p95_seconds') * 1000:.1f} ms, ITL p95 "
            f"{t('itl_p95_seconds') * 1000:.1f} ms, ITL p99 {t('itl_p99_seconds') * 1000:.1f} ms "
            f"(regression factor {t('regression_factor'):g}), min traffic "
            f"{t('min_request_rate'):g} requests/s",
            f"  faults: overload {f.overload_clients} clients on a batch of {f.batch}; long "
            f"prompts ~{f.long_prompt_words * f.tokens_per_word:.0f} tokens "
            f"(prefill {f.long_prompt_ttft * 1000:.0f} ms alone), also into {f.streams} streams "
            f"of {f.stream_tokens} tokens; KV pressure "
            f"{f.kv_requests} x {f.kv_request_tokens} tokens on {f.kv_tokens}; slow path "
            f"+{f.path_delay * 1000:.0f} ms (client-gap threshold "
            f"{t('client_gap_seconds') * 1000:.0f} ms)",
            f"  server CPU wait threshold {t('server_cpu_wait_share'):.0%} of its ready time; "
            f"noisy neighbour {f.neighbours} busy loop(s); ITL tail: over "
            f"{t('itl_tail_share'):.1%} of token gaps above {t('itl_tail_bound_seconds') * 1000:g} ms",
            f"  longest engine step {self.engine_step:.2f} s (a burst of the KV fault); "
            f"capacity {f.capacity:.1f} requests/s with 95 % of first tokens within the "
            "TTFT threshold",
        ]


def calibrate(
    vllm: VllmServer,
    base_config: Path,
    workdir: Path,
    readings: Callable[[Spec], Awaitable[NormalReadings]],
) -> Calibration:
    """``inferwatch calibrate`` against the server; the thresholds of what the sidecar
    reads under normal traffic (``readings``: the stack's, given the spec calibrated so
    far); then the fault sizes and the longest step."""
    out = workdir / "inferwatch.yaml"
    per_word = asyncio.run(tokens_per_word(vllm.url))
    normal_tokens = round(NORMAL_WORDS * per_word + 1)
    window = spec_from_config(load_config_file(base_config)).window_seconds
    rate = asyncio.run(normal_rate(vllm.url, THROUGHPUT_SECONDS))
    requests = max(REQUESTS_PER_CELL, math.ceil(rate * CELL_WINDOWS * window))
    argv = [
        sys.executable, "-m", "inferwatch", "calibrate",
        "--url", vllm.url, "--model", MODEL_NAME,
        "--config", str(base_config), "--out", str(out),
        "--concurrency", ",".join(map(str, CALIBRATED_CONCURRENCY)),
        "--prompt-tokens", str(normal_tokens), "--output-tokens", str(NORMAL_OUTPUT),
        "--requests-per-cell", str(requests),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    (workdir / "calibrate.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise StackError(f"inferwatch calibrate failed ({done.returncode}):\n{done.stderr}")
    measured = Measured(out, spec_from_config(load_config_file(out)))
    measured = measured.with_readings(asyncio.run(readings(measured.spec)))
    ttft = measured.spec.threshold("ttft_p95_seconds")
    shape = (normal_tokens, NORMAL_OUTPUT)
    capacity = measure_capacity(vllm.url, workdir, out.with_name("baseline.yaml"), shape, ttft)
    faults = asyncio.run(_size_faults(vllm, measured.spec, per_word, capacity))
    step = asyncio.run(longest_step(vllm.url, faults))
    measured = measured.with_engine_step(step)
    return Calibration(measured.config, measured.spec, faults, step)


async def longest_step(url: str, faults: FaultSizes) -> float:
    """The longest stretch without an engine step while requests run or wait, over one burst
    of the KV fault's size (vLLM's ``iteration_tokens_total`` counts its steps)."""
    names = {
        "vllm:iteration_tokens_total_count",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
    }
    spec = Burst(faults.kv_requests, faults.kv_prompt_words, faults.kv_output_tokens)
    load = asyncio.create_task(burst(url, spec, salt=9_000_000))
    longest, since, steps = 0.0, None, None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        while not load.done():
            async with session.get(f"{url}/metrics") as resp:
                page = scan(await resp.text(), names).samples
            now = asyncio.get_running_loop().time()
            value = {name: sum(v for _, v in page.get(name, [])) for name in names}
            working = value["vllm:num_requests_running"] + value["vllm:num_requests_waiting"] > 0
            count = value["vllm:iteration_tokens_total_count"]
            if count != steps or not working:
                if since is not None and count != steps and working:
                    longest = max(longest, now - since)
                since, steps = now, count
            await asyncio.sleep(STEP_POLL)
    await load
    return longest


async def tokens_per_word(url: str) -> float:
    """Tokens per word of the demo's prompts, from the server's own count (the usage of a
    one-token answer to prompts of two lengths: the difference is the words' cost)."""
    counts = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for words in (10, 110):
            body = {"model": MODEL_NAME, "prompt": prompt(words, words), "max_tokens": 1}
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                counts.append((await resp.json())["usage"]["prompt_tokens"])
    return (counts[1] - counts[0]) / 100


async def normal_load(url: str, stop: asyncio.Event, most_per_second: float | None = None) -> int:
    """The demo's normal traffic until ``stop`` (at most ``most_per_second`` requests a
    second, where given); returns the requests sent."""
    return await complete_many(
        url,
        stop,
        clients=NORMAL_CLIENTS,
        prompt_words=NORMAL_WORDS,
        max_tokens=NORMAL_OUTPUT,
        most_per_second=most_per_second,
    )


async def normal_rate(url: str, seconds: float) -> float:
    """Requests per second the normal traffic sends, over ``seconds`` of it."""
    stop = asyncio.Event()
    traffic = asyncio.create_task(normal_load(url, stop))
    await asyncio.sleep(seconds)
    stop.set()
    return await traffic / seconds


def _vllm_arg(flag: str) -> int:
    return int(VLLM_ARGS[VLLM_ARGS.index(flag) + 1])


def kv_cache(url: str) -> tuple[int, int]:
    """(blocks, tokens per block) of the KV cache, as the server reports them."""
    name = "vllm:cache_config_info"
    for labels, _ in scan(http_get(f"{url}/metrics")[1].decode(), {name}).samples.get(name, []):
        info = dict(parse_labels(labels))
        return int(info["num_gpu_blocks"]), int(info["block_size"])
    raise StackError(f"vLLM reports no {name}")


async def _size_faults(
    vllm: VllmServer, spec: Spec, tokens_per_word: float, capacity: float
) -> FaultSizes:
    blocks, block_size = kv_cache(vllm.url)
    kv_tokens = blocks * block_size
    context = _vllm_arg("--max-model-len")
    target = PREFILL_MULTIPLE * spec.threshold("ttft_p95_seconds")
    longest = int((context - LONG_PROMPT_OUTPUT - 8) / tokens_per_word)
    words, ttft = max(8, NORMAL_WORDS * 4), 0.0
    while True:
        ttft = await _server_ttft(vllm.url, words)
        if ttft >= target or words >= longest:
            break
        words = min(longest, words * 2)
    if ttft < target:
        raise StackError(
            f"a prompt of {context} tokens prefills in {ttft * 1000:.0f} ms here, under "
            f"{PREFILL_MULTIPLE:g} x the calibrated TTFT threshold ({target * 1000:.0f} ms): "
            "the long-prompts fault cannot be shown on this machine"
        )
    short_request = round(NORMAL_WORDS * tokens_per_word) + NORMAL_OUTPUT
    batch = min(_vllm_arg("--max-num-seqs"), kv_tokens // short_request)
    gap = spec.threshold("client_gap_seconds")
    return FaultSizes(
        batch, kv_tokens, tokens_per_word, words, ttft, client_gap=gap, capacity=capacity
    )


async def _server_ttft(url: str, words: int) -> float:
    """The server's TTFT p50 over a few lone requests with prompts of ``words`` words."""
    server = ServerHistograms(f"{url}/metrics", url, MODEL_NAME, note=lambda _: None)
    try:
        before = await server.start()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            for i in range(PROBES_PER_LENGTH):
                await complete(session, url, prompt(words, 7_000_000 + words * 10 + i), 2)
        _, window = await server.window(before, PROBES_PER_LENGTH)
    finally:
        await server.close()
    if TTFT not in window:
        raise StackError(f"no server TTFT for prompts of {words} words: {server.problem}")
    return histogram_quantile(0.5, window[TTFT].buckets)
