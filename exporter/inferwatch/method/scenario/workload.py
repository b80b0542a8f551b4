"""What a few replicas of a model serve, as the input series of a promtool unit test.

A :class:`Replica` says what one instance serves (request rate, where TTFT, queue time and
inter-token latency fall in vLLM's own histogram buckets, KV use, GPU busy time...);
:func:`~inferwatch.method.scenario.series.input_series` turns it into realistic series.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

STEP = 30  # seconds between samples, the test's scrape interval
SAMPLES = 40  # 20 minutes of data
EVAL = "15m"  # every alert's `for` has elapsed by then

# vLLM 0.32's default bucket bounds.
# fmt: off
TTFT_LE = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
ITL_LE = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)
LATENCY_LE = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)
TOKENS_LE = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
STEP_TOKENS_LE = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
KV_TRANSFER_LE = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)  # NIXL's
# fmt: on
# TGI's duration buckets (queue, request, batch steps): 0.1 ms x 1.5^i, i = 1..35.
TGI_LE = tuple(0.0001 * 1.5**i for i in range(1, 36))
TOKEN_BUDGET = 16000.0  # a TGI batch's max total tokens

CANARY_RESULTS = ("ok", "http_error", "timeout", "connect_error", "bad_stream")
CANARY_OK = {"ok": 1 / 15}  # a probe every 15 s, all answered
SERVED_MODEL = "llama-3-8b"
A, B, C = "10.0.0.1:10177", "10.0.0.2:10177", "10.0.0.3:10177"
ROUTER = "10.0.0.9:10177"  # the sidecar next to a router
ROUTER_BACKEND = "vllm-router"
ROUTER_MODEL = "unknown"  # a router's series name no model

# An H100 SXM's links per direction: 18 NVLink links at 26.562 GB/s; PCIe 5.0 x16.
NVLINK_PEAK = 18 * 26.562e9
PCIE_PEAK = 16 * 32e9 * 128 / 130 / 8


@dataclass(frozen=True)
class Dist:
    """Observations: ``{bucket upper bound: share}`` and their mean."""

    shares: dict[float, float]
    mean: float


# A healthy TGI's steps: prefill in (65.7, 98.5] ms, decode in (19.5, 29.2] ms.
TGI_PREFILL = Dist({TGI_LE[16]: 1.0}, 0.08)
TGI_DECODE = Dist({TGI_LE[13]: 1.0}, 0.025)


@dataclass(frozen=True)
class KVTransfer:
    """One side of a disaggregated pair's KV transfers: those timed per second, how long
    they took, the bytes each moved, failures and expired requests per second (None: the
    server counts none, as SGLang its expired requests)."""

    per_s: float = 2.0
    seconds: Dist = Dist({0.1: 1.0}, 0.08)
    bytes_each: float = 1.6e8
    failures_per_s: float = 0.0
    expired_per_s: float | None = 0.0


@dataclass(frozen=True)
class Replica:
    """What one instance serves; the defaults are a healthy replica."""

    instance: str
    backend: str = "vllm"
    requests_per_s: float = 2.0
    error_share: float = 0.0
    # The server's per-request latency histograms (None: it has none, as TGI).
    ttft: Dist | None = Dist({0.5: 1.0}, 0.4)  # p95 487.5 ms
    queue: Dist = Dist({0.3: 1.0}, 0.02)
    itl: Dist | None = Dist({0.05: 1.0}, 0.035)  # p95 48.75 ms
    # A server that times its steps instead (TGI): step durations by kind, one prefill step
    # per request and ``steps_per_s`` decode steps; its request durations.
    step_seconds: dict[str, Dist] | None = None
    request_seconds: Dist | None = None
    finished_reason: str = "stop"  # what a good request finishes with (TGI: "success")
    canary_ttft: Dist | None = None  # the canary's first tokens (None: canary off)
    prompt_tokens: Dist = Dist({1000: 1.0}, 800)
    step_tokens: Dist | None = Dist({64: 1.0}, 48)
    steps_per_s: float = 40.0
    generation_tokens_per_request: float = 200
    prefix_hit_share: float | None = 0.25
    running: tuple[float, ...] = (8, 10, 12, 11, 9)
    waiting: tuple[float, ...] = (0, 1, 0, 2, 0)
    deferred: tuple[float, ...] | None = None  # of the waiting, held back by other than capacity
    kv_usage: tuple[float, ...] | None = (0.42, 0.55, 0.61, 0.48)
    token_budget_use: tuple[float, ...] | None = None  # a TGI batch's share of its budget
    preemptions_per_s: float | None = 0.0
    queued_while_idle_share: float = 0.0
    frontend_cpu_cores: float | None = 0.3
    # The CPU under the server (None: not read): cores it runs, seconds per second its
    # threads wait for a CPU, the node's PSI share, its cgroup's throttled seconds per second.
    server_cpu_cores: float | None = None
    server_cpu_wait: float = 0.0
    node_cpu_pressure: float = 0.0
    server_cpu_throttled: float = 0.0
    decode_floor: float | None = 0.0048  # 16 GB of weights / 3.35 TB/s
    gpu_busy: tuple[float, ...] | None = (0.85, 0.85)  # one share per GPU; None: no NVML
    gpu_collector: str = "1x40"
    throttled: dict[str, str] = field(default_factory=dict)  # {reason: values} on GPU 0
    # GPU 0's busier direction as a share of its link's peak (the other direction and GPU 1
    # carry a tenth of the peak); None: no such link.
    nvlink_share: float | None = 0.3
    pcie_share: float = 0.05
    backend_up: str = "1x40"
    server: str | None = None  # the origin its sidecar reads (backend_info's server label)
    role: str | None = None  # its role in a disaggregated deployment (backend_info's role)
    scrape_duration: str = "0.004x40"
    gpu_memory_total: str = "85899345920x40"  # '_' where the GPU's series are gone
    baseline: tuple[float, float] | None = None  # TTFT p95, ITL p95 at concurrency 8
    capacity: float | None = None  # the baseline's requests/s at its goodput target
    # GPU 0's health: values of its series ('0x40': healthy all along).
    uncorrected_ecc: str = "0x40"  # volatile uncorrected ECC errors (a counter)
    row_remap_pending: str = "0x40"
    xid: dict[str, str] = field(default_factory=dict)  # XID -> its counter's values
    canary_gap: str | None = None  # the canary's TTFT gap (None: canary off)
    canary_probes: dict[str, float] | None = None  # probes/s by result (None: canary off)
    kv_transfer: KVTransfer | None = None  # an instance of a prefill/decode pair
    # The share of its prompt tokens whose KV arrived through a KV connector (None: no such
    # counter); vLLM's disk connector counts these and times no transfer.
    kv_transfer_prompt_share: float | None = None


@dataclass(frozen=True)
class Worker:
    """A replica as the router in front of it counts it: requests sent and failed per second
    (no failure series while none failed), its health check and circuit breaker's values."""

    url: str
    requests_per_s: float = 1.0
    failures_per_s: float = 0.0
    healthy: str = "1x40"
    circuit: str = "0x40"


@dataclass(frozen=True)
class Router:
    """A sidecar next to a router (``--backend vllm-router``) and the workers it routes to."""

    instance: str
    workers: tuple[Worker, ...]
    backend: str = ROUTER_BACKEND
    duration: Dist | None = None  # its time per answered request, tries and backoffs in it


def healthy(instance: str, **changes: object) -> Replica:
    return dataclasses.replace(Replica(instance), **changes)


def tgi(instance: str, **changes: object) -> Replica:
    """A healthy TGI replica: step durations instead of TTFT and inter-token histograms, a
    token budget instead of KV blocks, no stop-or-length reasons, preemptions or prefix cache; the
    canary on (``--canary auto``)."""
    shape = {
        "backend": "tgi",
        "ttft": None,
        "itl": None,
        "queue": Dist({TGI_LE[10]: 1.0}, 0.005),
        "step_seconds": {"prefill": TGI_PREFILL, "decode": TGI_DECODE},
        "request_seconds": Dist({TGI_LE[26]: 1.0}, 5.0),
        "finished_reason": "success",
        "canary_ttft": Dist({0.25: 1.0}, 0.15),
        "canary_probes": CANARY_OK,
        "kv_usage": None,
        "token_budget_use": (0.42, 0.55, 0.61, 0.48),
        "preemptions_per_s": None,
        "prefix_hit_share": None,
        "step_tokens": None,
        "frontend_cpu_cores": None,
    }
    return dataclasses.replace(Replica(instance), **(shape | changes))
