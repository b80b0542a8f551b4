"""Titles of the dashboard panels, shared by the dashboards and the runbooks that cite them.

A runbook tells the on-call engineer which panel confirms an alert; the tests check that
every panel a runbook names exists on a dashboard (the router's on the fleet one).
"""

from __future__ import annotations

from enum import Enum


class Panel(str, Enum):
    # Inference triage, top row: prefill or decode, and which layer?
    TTFT_VS_THRESHOLD = "TTFT p95 vs threshold"
    ITL_VS_FLOOR = "ITL p95 vs decode floor"
    QUEUE_DEPTH = "Queue depth"
    QUEUED_WHILE_IDLE = "Queued while idle"
    GPU_BUSY = "GPU busy"
    KV_CACHE = "KV cache usage"
    FIRING_ALERTS = "Firing alerts"
    # Latency by phase
    TTFT = "Time to first token"
    ITL = "Inter-token latency"
    E2E = "End-to-end latency"
    TTFT_SPLIT = "TTFT split: queue vs prefill"
    STEP_LATENCY = "Engine step latency by kind (server side)"
    TPOT = "Time per output token (per request)"
    TTFT_HEATMAP = "TTFT distribution"
    ITL_HEATMAP = "Inter-token latency distribution"
    E2E_HEATMAP = "End-to-end latency distribution"
    SPEC_DECODE = "Speculative decoding acceptance"
    # Scheduler
    RUNNING_WAITING = "Running and waiting requests"
    STEP_TOKENS = "Tokens per engine step"
    PREEMPTIONS = "Preemptions"
    KV_CACHE_BY_ENGINE = "KV cache usage by engine"
    QUEUED_WHILE_IDLE_TIME = "Queued-while-idle time"
    KV_CAPACITY = "KV cache capacity and free tokens"
    TOKEN_BUDGET = "Batch token budget in use"
    LORA_ADAPTERS = "LoRA adapters in use"
    # GPU
    GPU_BUSY_BY_GPU = "GPU busy by GPU"
    GPU_ACTIVITY = "SM / tensor / DRAM activity"
    GPU_MEMORY = "GPU memory"
    GPU_CLOCKS = "SM clock and throttling"
    GPU_POWER = "GPU power and temperature"
    MEMORY_BANDWIDTH = "Memory bandwidth used (vLLM estimate)"
    # Communication
    LINK_SHARE = "Interconnect use: share of the link's peak"
    PCIE_THROUGHPUT = "PCIe throughput"
    NVLINK_THROUGHPUT = "NVLink throughput"
    # Router (the fleet dashboard)
    ROUTER_REQUESTS = "Requests by worker, as the router sends them"
    ROUTER_WORKERS = "Worker health and circuit breaker"
    ROUTER_RETRIES = "Router retries"
    ROUTER_DURATION = "Router duration"
    # System
    FRONTEND_CPU = "Frontend CPU"
    SERVER_CPU = "Server CPU: run-queue wait, pressure, throttling"
    CLIENT_GAP = "Client gap: canary TTFT minus server TTFT"
    CANARY_PROBES = "Canary probes by result"
    REQUEST_LENGTHS = "Request lengths"
    HTTP_STATUS = "HTTP responses by status class"
    TOKEN_THROUGHPUT = "Token throughput"
    FINISHED_BY_REASON = "Finished requests by reason"
    PREFIX_CACHE = "Prefix cache hit ratio"
    # Service level objectives
    SLO_BUDGET = "Error budget remaining"
    SLO_BURN = "Burn rate by window"
    SLO_SLI = "SLI vs objective"
    # Baseline
    TTFT_VS_BASELINE = "TTFT p95: live vs baseline"
    ITL_VS_BASELINE = "ITL p95: live vs baseline"
    # Capacity (the baseline's load search)
    LOAD_VS_CAPACITY = "Load vs measured capacity"
    CAPACITY_IN_USE = "Capacity in use"
    REPLICAS_NEEDED = "Replicas needed at this traffic"
    POOL_CAPACITY_USE = "Capacity in use by pool"
    LOAD_CURVE = "Baseline: latency and goodput vs load"
