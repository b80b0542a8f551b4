"""Where a threshold lives: every number the method's alerts compare with, and why.

Each :class:`Threshold` carries its default and the reasoning behind it. A config file's
``thresholds:`` section overrides any of them (see :mod:`inferwatch.method.spec`); a
baseline file replaces the latency ones (``inferwatch calibrate``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Threshold:
    default: float
    unit: str
    why: str
    # What `inferwatch calibrate` measures for a threshold whose right value depends on the
    # machine and the traffic; empty for one that compares the server with itself. Until set
    # (measured, or by hand), the alerts that fire on it stay at info (Spec.severity).
    calibrated_by: str = ""


THRESHOLDS: dict[str, Threshold] = {
    "ttft_p95_seconds": Threshold(
        default=2.0,
        unit="s",
        why="Interactive chat feels broken past ~2 s to the first token; most serving SLOs put "
        "TTFT p95 between 0.5 and 2 s. Set it from your baseline (`inferwatch baseline`).",
        calibrated_by="the server's TTFT p95 at the highest concurrency swept, and in each rate window of normal traffic",
    ),
    "itl_p95_seconds": Threshold(
        default=0.1,
        unit="s",
        why="100 ms between tokens is 10 tokens/s per stream, about reading speed; a healthy GPU "
        "decodes a 7-70B model at 15-50 ms per token.",
        calibrated_by="the server's ITL p95 at the highest concurrency swept, and in each rate window of normal traffic",
    ),
    "itl_p99_seconds": Threshold(
        default=0.5,
        unit="s",
        why="A half-second stall inside a streamed answer is visible to users; used for the "
        "tail in prefill-stalls-decode.",
        calibrated_by="the server's ITL p99 at the highest concurrency swept, and in each rate window of normal traffic",
    ),
    "itl_tail_bound_seconds": Threshold(
        default=0.5,
        unit="s",
        why="A token gap longer than this is a stall inside a stream: one of the server's ITL "
        "bucket bounds, so that the share of gaps above it is counted, not interpolated "
        "(`inferwatch calibrate` sets the smallest bound at or above the factor x the "
        "baseline's ITL p99).",
        calibrated_by="the server's smallest ITL bucket bound above the swept ITL p99",
    ),
    "itl_tail_share": Threshold(
        default=0.02,
        unit="ratio",
        why="Past a bound above the baseline's p99, a healthy decode leaves under one gap in a "
        "hundred; two in a hundred are steps that carry far more work than the others (a "
        "prefill chunk).",
        calibrated_by="the share of token gaps above the tail bound in each rate window of normal traffic",
    ),
    "deferred_share_high": Threshold(
        default=0.5,
        unit="ratio",
        why="When most waiting requests wait on something other than capacity (a grammar "
        "compiling, a KV transfer, a LoRA adapter's turn), more replicas do not shorten the "
        "queue: InferenceQueueingDelay holds its capacity verdict back.",
    ),
    "queue_share_high": Threshold(
        default=0.5,
        unit="ratio",
        why="When more than half of the mean TTFT is time spent waiting to be scheduled, the "
        "server lacks capacity: prefill itself is not what is slow.",
    ),
    "queue_share_low": Threshold(
        default=0.2,
        unit="ratio",
        why="Below a fifth of TTFT spent queued, a high TTFT comes from the prefill computation.",
    ),
    "floor_factor_far": Threshold(
        default=3.0,
        unit="x",
        why="Decode at more than 3x the memory-bandwidth floor leaves room for kernel, KV-cache "
        "and batching improvements.",
    ),
    "floor_factor_near": Threshold(
        default=1.5,
        unit="x",
        why="Within 1.5x of the floor decode is at the hardware limit (KV reads and kernel "
        "overheads account for the rest).",
    ),
    "kv_usage_high": Threshold(
        default=0.9,
        unit="ratio",
        why="Above 90 % KV-cache use the scheduler starts to preempt or refuse to admit requests.",
    ),
    "preemptions_per_second": Threshold(
        default=0.02,
        unit="1/s",
        why="About one preemption a minute; each one throws away computed KV cache and recomputes "
        "it later, so a steady stream of them wastes GPU time.",
    ),
    "queued_while_idle_ratio": Threshold(
        default=0.1,
        unit="ratio",
        why="Requests waiting while the GPU idles for a tenth of the time is not a blip: the "
        "scheduler or the CPU is starving the accelerator.",
    ),
    "gpu_busy_low": Threshold(
        default=0.3,
        unit="ratio",
        why="A GPU busy less than 30 % of the time while requests run is mostly waiting.",
    ),
    "gpu_busy_high": Threshold(
        default=0.8,
        unit="ratio",
        why="Above 80 % busy the GPU is not the one waiting; a busy frontend is then not the "
        "bottleneck.",
    ),
    "frontend_cpu_cores": Threshold(
        default=0.9,
        unit="cores",
        why="The API server/tokenizer is one Python process: at ~1 core it cannot go faster.",
        calibrated_by="the frontend's CPU in each rate window of normal traffic",
    ),
    "error_ratio": Threshold(
        default=0.05,
        unit="ratio",
        why="More than 5 % of requests ending in a server error is user-visible (aborts are "
        "clients cancelling, shown apart).",
    ),
    "replica_imbalance_factor": Threshold(
        default=3.0,
        unit="x",
        why="A replica holding three times the requests of the least loaded one, with a queue, "
        "is not load the fleet lacks room for: the router's policy or an affinity sends it "
        "there while another replica could take it.",
    ),
    "router_worker_failure_share": Threshold(
        default=0.5,
        unit="ratio",
        why="A worker that fails most of what the router sends it is down or broken; a "
        "replica that fails a few requests is the server's own errors, which its sidecar "
        "judges.",
    ),
    "router_overhead_seconds": Threshold(
        default=0.5,
        unit="s",
        why="Half a second a request between the router and its replicas is more than a hop "
        "on a network: retries and their backoff, the router's own queue, a slow connection.",
    ),
    "router_overhead_share": Threshold(
        default=0.25,
        unit="ratio",
        why="Where a quarter of the time clients wait is spent outside the replicas, speeding "
        "up the replicas cannot fix what users see; below it, long generations dwarf the hop.",
    ),
    "min_request_rate": Threshold(
        default=0.05,
        unit="1/s",
        why="Below ~3 requests a minute quantiles rest on too few samples to page anyone.",
    ),
    "min_token_rate": Threshold(
        default=1.0,
        unit="tokens/s",
        why="Decode/prefill alerts need tokens flowing; an idle server has no latency problem.",
    ),
    "capacity_use_high": Threshold(
        default=0.9,
        unit="ratio",
        why="The capacity is the highest rate at which the baseline's goodput met its target; "
        "at 90 % of it a burst or a heavier request mix tips the service past that point, "
        "and past 100 % the queue grows without bound. A ticket at 90 % leaves the time to add "
        "a replica before users wait.",
    ),
    "pool_capacity_use_low": Threshold(
        default=0.5,
        unit="ratio",
        why="A disaggregated model's pool that uses under half its measured capacity has room "
        "to give: with the other pool past capacity_use_high, the split between prefill and "
        "decode replicas is what is wrong, not the fleet's size, and moving a replica across "
        "relieves the one pool without saturating the other.",
    ),
    "regression_factor": Threshold(
        default=1.5,
        unit="x",
        why="50 % worse than the benchmark at the same concurrency is beyond run-to-run noise.",
    ),
    "server_cpu_wait_share": Threshold(
        default=0.25,
        unit="ratio",
        why="A thread that is ready to run waits for a CPU now and then; waiting a quarter of its "
        "ready time means the server gets a share of the cores, not the cores: a noisy "
        "neighbour, a CPU limit, too few cores for the engine, the API server and the "
        "tokenizer.",
        calibrated_by="the server's CPU wait share in each rate window of normal traffic",
    ),
    "client_gap_seconds": Threshold(
        default=0.1,
        unit="s",
        why="What the path between users and the engine (network, ingress, the API server's HTTP "
        "and tokenizer, SSE framing) adds to the first token, as the canary sees it: a few ms "
        "in one data centre; 100 ms more than the engine's own TTFT is a problem of its own. "
        "`inferwatch calibrate` raises it to what the baseline's path measured, if more.",
        calibrated_by="the canary's gap in each rate window of normal traffic",
    ),
    "canary_failure_ratio": Threshold(
        default=0.25,
        unit="ratio",
        why="One canary probe in four failing (a timeout, an HTTP error, a broken stream) while "
        "the server reports itself up: users on the same path are failing too.",
    ),
    "link_share_high": Threshold(
        default=0.8,
        unit="ratio",
        why="A GPU's NVLink or PCIe traffic above 80 % of the link's peak over the window: the "
        "link sets the pace (tensor-parallel all-reduce, host transfers). The peak is the line "
        "rate, and payload rarely gets past ~90 % of it.",
    ),
    "kv_transfer_failure_share": Threshold(
        default=0.01,
        unit="ratio",
        why="A KV transfer between prefill and decode fails about never on a healthy link: "
        "more than one in a hundred failed, or expired before the decode side read it, is "
        "the connector, the network between the pools or KV released too early, and each "
        "one costs a prefill again or the request.",
    ),
    "kv_transfer_ttft_share": Threshold(
        default=0.5,
        unit="ratio",
        why="A transfer moves what the prefill computed; where it takes more than half of "
        "the mean time to the first token, the first token waits for the KV to cross "
        "between the pools more than for the prompt to be computed.",
    ),
    "kv_transfer_prompt_share_low": Threshold(
        default=0.5,
        unit="ratio",
        why="A decode instance should take its prompts' KV from the prefill pool: the tail "
        "of a prompt short of a whole KV block is computed there, a few per cent. Under half "
        "arrived (by transfer, or cached) means the decode pool does the prefill pool's work "
        "again: the KV is not arriving.",
    ),
    "throttled_share": Threshold(
        default=0.5,
        unit="ratio",
        why="Clocks held down for thermal or hardware reasons more than half of the window.",
    ),
}

# The thresholds whose right value depends on the machine and the traffic.
MACHINE_DEPENDENT = tuple(name for name, t in THRESHOLDS.items() if t.calibrated_by)

# Throttle reasons that indicate a hardware/cooling/power problem (power capping under full
# load, sw_power_cap, is normal and left out).
THROTTLE_REASONS = "hw_slowdown|hw_thermal_slowdown|sw_thermal_slowdown|hw_power_brake_slowdown"
