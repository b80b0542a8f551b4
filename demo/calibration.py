"""Baseline first, on the machine at hand: ``inferwatch calibrate``, then the faults' sizes.

Before any fault, the demo and the e2e tests run the product's ``inferwatch calibrate``
against the real vLLM, as a user would next to a real server, at the demo's normal traffic,
with the canary through the users' path (``demo/proxy.py``): every threshold and the
capacity come from it (nothing here computes one). Then each fault is sized from
measurements of the same server, never from a constant that assumes a CPU's speed:

- **long prompts**: prompts grow until the server's own TTFT histogram (read as PromQL's
  ``histogram_quantile`` reads it) puts their prefill at :data:`PREFILL_MULTIPLE` x the
  calibrated TTFT threshold;
- **overload**, **engine stall**: client counts are multiples of the batch the engine runs
  at once (``--max-num-seqs``, capped by what the KV cache holds);
- **KV-cache pressure**: a batch of requests whose tokens add up to twice the KV cache the
  server reports (``vllm:cache_config_info``);
- **slow path**: the proxy in front of the server holds each request twice the calibrated
  client-gap threshold.
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

from demo.stack import MODEL_NAME, VLLM_ARGS, StackError, VllmServer, http_get
from demo.traffic import Request, complete, complete_many, prompt
from inferwatch.capacity import parse
from inferwatch.collect.textparse import parse_labels, scan
from inferwatch.method.quantile import histogram_quantile
from inferwatch.method.spec import Spec, spec_from_config
from inferwatch.settings import load_config_file
from inferwatch.tools.sweep.histograms import TTFT, ServerHistograms

# The demo's normal traffic: two clients, short prompts, short answers (normal_load).
NORMAL_CLIENTS, NORMAL_WORDS, NORMAL_OUTPUT = 2, 6, 16
# The demo service is calibrated at its normal load, which is sent as the sweep sends it, back
# to back: a server that idles between requests answers slower (the engine wakes up first),
# so light traffic with pauses would sit above thresholds measured without them.
CALIBRATED_CONCURRENCY = (NORMAL_CLIENTS,)
# At least enough that a p95 rests on ten requests, not on the two slowest; and as many as the
# normal traffic sends in CELL_WINDOWS of the rules' rate windows (its rate measured first,
# for THROUGHPUT_SECONDS).
REQUESTS_PER_CELL = 200
CELL_WINDOWS = 3
THROUGHPUT_SECONDS = 5.0
# The most the capacity search may take (a guard: on 2 cores it converges in well under it).
SEARCH_SECONDS = 180.0
# A long-prompt fault's prefill, as a multiple of the calibrated TTFT threshold.
PREFILL_MULTIPLE = 2.0
LONG_PROMPT_OUTPUT = 8
PROBES_PER_LENGTH = 3
# The overload: clients per place in the engine's batch, each sending short requests back
# to back (one server's, or through a router every replica's).
OVERLOAD_PER_BATCH, OVERLOAD_WORDS, OVERLOAD_OUTPUT = 4, 2, 12


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
        return OVERLOAD_PER_BATCH * self.batch

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
class Calibration:
    config: Path  # written by `inferwatch calibrate`
    spec: Spec
    faults: FaultSizes
    engine_step: float | None  # the server's longest step, as calibrate measured it

    def summary(self) -> list[str]:
        """The calibration as the demo's first screen shows it."""
        t, f = self.spec.threshold, self.faults
        step = f"{self.engine_step:.2f} s" if self.engine_step is not None else "not measured"
        return [
            f"calibrated on this machine by `inferwatch calibrate` ({self.config}):",
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
            f"frontend CPU {t('frontend_cpu_cores'):g} cores; noisy neighbour {f.neighbours} busy "
            f"loop(s); ITL tail: over {t('itl_tail_share'):.1%} of token gaps above "
            f"{t('itl_tail_bound_seconds') * 1000:g} ms",
            f"  longest engine step {step}; capacity {f.capacity:.1f} requests/s with 95 % of "
            "first tokens within the TTFT threshold",
            *(f"  uncalibrated: {name}" for name in self.spec.uncalibrated()),
        ]


def calibrate(vllm: VllmServer, base_config: Path, workdir: Path, canary_url: str) -> Calibration:
    """``inferwatch calibrate`` against the server at the demo's normal traffic, its canary
    through ``canary_url``; then the fault sizes from the same server."""
    per_word = asyncio.run(tokens_per_word(vllm.url))
    out = run_calibrate(vllm.url, base_config, workdir, per_word, ["--canary-url", canary_url])
    config = load_config_file(out)
    spec = spec_from_config(config)
    capacity = measured_capacity(Path(config["baseline"]))
    faults = asyncio.run(_size_faults(vllm, spec, per_word, capacity))
    return Calibration(out, spec, faults, config.get("engine_step_seconds"))


def run_calibrate(
    url: str,
    base_config: Path,
    workdir: Path,
    tokens_per_word: float,
    more: list[str],
    replicas: int = 1,
) -> Path:
    """``inferwatch calibrate`` as a user runs it, against ``url`` at the demo's normal
    traffic (through a router in front of ``replicas``: that many times the clients, each
    replica's normal share), with ``more`` of its flags; the config it wrote, in ``workdir``."""
    out = workdir / "inferwatch.yaml"
    normal_tokens = round(NORMAL_WORDS * tokens_per_word + 1)
    window = spec_from_config(load_config_file(base_config)).window_seconds
    rate = asyncio.run(normal_rate(url, THROUGHPUT_SECONDS, replicas))
    requests = max(REQUESTS_PER_CELL, math.ceil(rate * CELL_WINDOWS * window))
    argv = [
        sys.executable, "-m", "inferwatch", "calibrate",
        "--url", url, "--model", MODEL_NAME,
        "--config", str(base_config), "--out", str(out),
        "--concurrency", ",".join(str(replicas * c) for c in CALIBRATED_CONCURRENCY),
        "--prompt-tokens", str(normal_tokens), "--output-tokens", str(NORMAL_OUTPUT),
        "--requests-per-cell", str(requests),
        "--search-seconds", f"{SEARCH_SECONDS:g}",
        *more,
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
    (workdir / "calibrate.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise StackError(f"inferwatch calibrate failed ({done.returncode}):\n{done.stderr}")
    return out


def measured_capacity(baseline: Path) -> float:
    """The capacity calibrate found at the normal shape (requests/s)."""
    found = yaml.safe_load(baseline.read_text()).get("capacity") or []
    rate = parse(found[0], f"{baseline}: capacity").requests_per_second if found else None
    if not rate:
        raise StackError(f"{baseline}: calibrate found no rate that met its target")
    return rate


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


async def normal_load(
    url: str,
    stop: asyncio.Event,
    most_per_second: float | None = None,
    log: list[Request] | None = None,
    replicas: int = 1,
) -> int:
    """The demo's normal traffic until ``stop`` (at most ``most_per_second`` requests a
    second, where given; each request added to ``log``; through a router, that of
    ``replicas``); returns the requests sent."""
    return await complete_many(
        url,
        stop,
        clients=replicas * NORMAL_CLIENTS,
        prompt_words=NORMAL_WORDS,
        max_tokens=NORMAL_OUTPUT,
        most_per_second=most_per_second,
        log=log,
    )


async def normal_rate(url: str, seconds: float, replicas: int = 1) -> float:
    """Requests per second the normal traffic (of ``replicas``) sends, over ``seconds`` of it."""
    stop = asyncio.Event()
    traffic = asyncio.create_task(normal_load(url, stop, replicas=replicas))
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
