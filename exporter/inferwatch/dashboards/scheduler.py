"""The triage dashboard's "Scheduler: is continuous batching working?" row.

The batch (running and waiting requests, tokens per step, preemptions), the KV cache that
bounds it (use and capacity per engine), and the time requests waited on an idle GPU.
"""

from __future__ import annotations

from inferwatch.dashboards.queries import TARGET, TOKENS, PanelSpec, Query, limit, mean, series
from inferwatch.method.spec import Spec
from inferwatch.panels import Panel


def scheduler_panels(spec: Spec) -> list[PanelSpec]:
    """The batch, the KV cache, and queued-while-idle time per instance."""
    return [*_batch(spec), *_kv_cache(spec), _queued_while_idle_time(spec)]


def _batch(spec: Spec) -> list[PanelSpec]:
    """Running and waiting requests, tokens per scheduler step, preemptions."""
    rate, window = spec.rate_name, spec.timing.window
    return [
        PanelSpec(
            Panel.RUNNING_WAITING,
            "Requests in the running batch and waiting in the queue. Healthy: waiting near 0. "
            "Waiting grows while running sits at its maximum: capacity. Waiting while running is "
            "low: admission is blocked (KV cache, scheduler, CPU). Deferred: of the waiting, "
            "those held back by other than capacity (a LoRA adapter's turn, a KV transfer, a "
            "grammar compiling): more replicas do not shorten that part.",
            [
                Query(f"sum by (instance) ({series('requests_running')})", "running {{instance}}"),
                Query(f"sum by (instance) ({series('requests_waiting')})", "waiting {{instance}}"),
                Query(
                    f"sum by (instance) ({series('requests_deferred')})", "deferred {{instance}}"
                ),
            ],
        ),
        PanelSpec(
            Panel.STEP_TOKENS,
            "Mean tokens per scheduler step (the batch-size proxy: decode tokens plus prefill "
            "chunk) and steps per second. Small steps with a busy queue: the batch is not "
            "filling. Very large steps during inter-token latency spikes: prefill chunks too big.",
            [
                Query(mean("engine_step_tokens", window), "tokens per step"),
                Query(
                    f"sum(rate({series('engine_steps')}[{window}]))",
                    "steps/s",
                    unit="suffix: steps/s",
                ),
            ],
            unit=TOKENS,
        ),
        PanelSpec(
            Panel.PREEMPTIONS,
            "Requests preempted per second (evicted from the KV cache, recomputed later). "
            "Healthy: 0. A steady rate means the KV cache is too small for the batch and "
            "context lengths.",
            [
                Query(
                    f"sum by (instance) (instance:inferwatch_preemptions:{rate}{{{TARGET}}})",
                    "{{instance}}",
                )
            ],
            unit="reqps",
        ),
    ]


def _kv_cache(spec: Spec) -> list[PanelSpec]:
    """KV-cache use per engine, its capacity in tokens with how many are free, and a
    token-budget server's budget in use."""
    threshold = spec.threshold
    usage = series("kv_cache_usage_ratio")
    capacity = series("kv_cache_capacity_tokens")
    return [
        PanelSpec(
            Panel.KV_CACHE_BY_ENGINE,
            f"KV-cache use per engine. Healthy: below {threshold('kv_usage_high') * 100:g} %. "
            "Pinned at 100 % with preemptions: the memory layer limits the batch.",
            [Query(usage, "{{instance}} engine {{engine}}")],
            unit="percentunit",
            thresholds=limit(threshold("kv_usage_high")),
        ),
        PanelSpec(
            Panel.KV_CAPACITY,
            "How many tokens each engine's KV cache holds when full (blocks x block size, "
            "from the server's cache config), and how many are free now. The capacity bounds "
            "batch x context: when running requests' contexts need more than it, the "
            "scheduler queues or preempts. Plan replicas and --max-num-seqs with it.",
            [
                Query(capacity, "capacity {{instance}} engine {{engine}}"),
                Query(f"{capacity}\n  * (1 - {usage})", "free {{instance}} engine {{engine}}"),
            ],
            unit=TOKENS,
        ),
        PanelSpec(
            Panel.TOKEN_BUDGET,
            "Share of the batch's token budget its running requests have reserved (TGI: "
            "current max tokens over max total tokens), the admission limit a token-budget "
            "server has where vLLM has KV blocks. Healthy: below "
            f"{threshold('kv_usage_high') * 100:g} %. Pinned near 100 % with requests waiting: "
            "new requests wait for running ones to finish (the memory layer).",
            [
                Query(
                    f"max by (instance) ({series('batch_reserved_tokens')})\n"
                    f"  / max by (instance) ({series('batch_token_budget')})",
                    "{{instance}}",
                )
            ],
            unit="percentunit",
            thresholds=limit(threshold("kv_usage_high")),
        ),
        PanelSpec(
            Panel.LORA_ADAPTERS,
            "LoRA adapters with requests in the engine, against the most one batch holds "
            "(vLLM's --max-loras). At the maximum, requests for another adapter wait for a "
            "slot: they show as deferred in the running-and-waiting panel, a wait that more "
            "replicas do not shorten; more slots or fewer adapters per replica do.",
            [
                Query(
                    f"max by (instance) ({series('lora_adapters_active')})", "active {{instance}}"
                ),
                Query(f"max by (instance) ({series('lora_adapters_max')})", "max {{instance}}"),
            ],
            no_value="no LoRA adapters on this server",
        ),
    ]


def _queued_while_idle_time(spec: Spec) -> PanelSpec:
    """The share of time requests waited on an idle GPU, per instance."""
    threshold = spec.threshold
    return PanelSpec(
        Panel.QUEUED_WHILE_IDLE_TIME,
        "Share of time requests waited while the GPU/engine idled, per instance. Healthy: 0. "
        "Sustained above "
        f"{threshold('queued_while_idle_ratio') * 100:g} % fires InferenceQueuedWhileIdle: the "
        "scheduler or the CPU starves the accelerator.",
        [
            Query(
                f"instance:inferwatch_queued_while_idle_seconds:{spec.rate_name}{{{TARGET}}}",
                "{{instance}}",
            )
        ],
        unit="percentunit",
        thresholds=limit(threshold("queued_while_idle_ratio")),
    )
