"""The KV transfer's series: disaggregated prefill and decode, where a prefill instance
computes a prompt's KV cache and sends it to the decode instance that generates from it. Each
instance tells its own side: a server that sends (SGLang's prefill, vLLM's Mooncake prefill)
times the transfer where it sends, one that pulls (vLLM's NIXL decode) where it receives.
Absent where the server runs no KV connector, never zero."""

from __future__ import annotations

from inferwatch.metrics.definition import C, G, H, MetricDef, defs

# The stages a request waits in for its KV, as the contract names them (``stage``).
KV_TRANSFER_STAGES = ("pending", "transferring", "received")

KV_TRANSFER: dict[str, MetricDef] = defs(
    MetricDef(
        "kv_transfer_seconds",
        H,
        "Duration of one KV-cache transfer between a prefill and a decode instance, on the "
        "side that times it.",
    ),
    MetricDef(
        "kv_transfer_bytes",
        C,
        "Bytes of KV cache the transfers timed by kv_transfer_seconds moved: over its sum, "
        "the transfers' bandwidth.",
    ),
    MetricDef(
        "kv_transfer_bootstrap_seconds",
        H,
        "Time a request waited for the prefill and decode instances to pair for its "
        "transfer (the handshake), before the transfer itself.",
    ),
    MetricDef(
        "kv_transfer_failures",
        C,
        "KV transfers that failed (or requests whose transfer failed), handshake "
        "failures included.",
    ),
    MetricDef(
        "kv_transfer_expired_requests",
        C,
        "Requests whose KV the prefill instance held for a decode instance that never "
        "fetched it in time, then freed.",
    ),
    MetricDef(
        "kv_transfer_requests_waiting",
        G,
        "Requests waiting for their KV transfer, by stage: pending (not started: pairing, "
        "allocating), transferring, received (the KV in, not running yet).",
        ("stage",),
    ),
    MetricDef(
        "kv_transfer_prompt_tokens",
        C,
        "Prompt tokens whose KV arrived through the KV connector instead of being computed.",
    ),
)
