"""The KV transfer's signals: disaggregated prefill and decode, judged on the instance whose
series tell its side of the transfer (``metrics/kv_transfer.py``): how many transfers fail,
how much of the first token's wait the transfer takes, and how much of a decode instance's
prompts arrived by transfer rather than being computed there.

A server without a KV connector has none of these series, so none of these signals: no
value, never zero.
"""

from __future__ import annotations

from inferwatch.method.recipes import Gauge, Mean, Rate, Ratio, Sum
from inferwatch.method.signal import INSTANCE, TTFT, Signal

_KV = "inferwatch_kv_transfer"


def _rate(counter: str) -> str:
    return f"sum without (engine) (rate({counter}[%(window)s]))"


_TRANSFERS = _rate(f"{_KV}_seconds_count")  # one observation per transfer timed
_FAILURES = _rate(f"{_KV}_failures_total")
# SGLang counts no expired requests: where the series is absent, none expired.
_EXPIRED = f"({_rate(f'{_KV}_expired_requests_total')} or 0 * {_FAILURES})"
# Transfers attempted: those timed and those that failed.
_ATTEMPTS = f"(\n  {_TRANSFERS}\n  + {_FAILURES}\n)"
_ATTEMPTS_LOCAL = Sum((Rate(f"{_KV}_seconds_count"), Rate(f"{_KV}_failures_total")))


# The prompt tokens of a decode instance (its sidecar's role) that it did not compute: those
# whose KV arrived by transfer, and those its own prefix cache held.
_BROUGHT = f"{_KV}_prompt_tokens_total"
_CACHED = "inferwatch_prefix_cache_hits_total"
_ON_DECODE = (
    "  * on (instance, job) group_left ()\n"
    '  max by (instance, job) (inferwatch_backend_info{role="decode"})'
)


def _mean(histogram: str) -> str:
    return f"(\n  {_rate(f'{histogram}_sum')}\n  / ({_rate(f'{histogram}_count')} > 0)\n)"


KV_TRANSFER_SIGNALS = (
    Signal(
        name="kv_transfer_attempt_rate",
        label="KV transfers attempted/s",
        unit="per_second",
        level=INSTANCE,
        promql=_ATTEMPTS,
        local=_ATTEMPTS_LOCAL,
    ),
    # Failed transfers and requests whose KV expired unfetched, of the transfers attempted;
    # at most 1, as every share (an instance can count more expired requests than it timed
    # transfers: vLLM's Mooncake prefill).
    Signal(
        name="kv_transfer_failing_share",
        label="KV transfers failed or expired (share of those attempted)",
        unit="ratio",
        level=INSTANCE,
        promql=f"clamp_max(\n  ({_FAILURES} + {_EXPIRED})\n  / ({_ATTEMPTS} > 0),\n  1\n)",
        local=Ratio(
            Sum(
                (Rate(f"{_KV}_failures_total"),), optional=(Rate(f"{_KV}_expired_requests_total"),)
            ),
            _ATTEMPTS_LOCAL,
        ),
    ),
    # Of the prompt tokens a decode instance took, those it did not compute: arrived by
    # transfer, or in its own prefix cache (a server that counts no cache hits: by transfer).
    # The rest it computed itself: the prefill pool's work, done again. None on an instance
    # of another role, or without the counter (SGLang counts no tokens by transfer).
    Signal(
        name="kv_transfer_prompt_share",
        label="decode's prompt tokens arrived by transfer or cached (share)",
        unit="ratio",
        level=INSTANCE,
        promql=f"clamp_max(\n  (\n    {_rate(_BROUGHT)}\n    + ({_rate(_CACHED)} or 0 * "
        f"{_rate(_BROUGHT)})\n  )\n  / ({_rate('inferwatch_prompt_tokens_total')} > 0),\n  1\n)"
        f"\n{_ON_DECODE}",
        local=Ratio(
            Ratio(
                Sum((Rate(_BROUGHT),), optional=(Rate(_CACHED),)),
                Rate("inferwatch_prompt_tokens_total"),
            ),
            Gauge("inferwatch_backend_info", where={"role": "decode"}),
        ),
    ),
    # The mean transfer over the mean TTFT of the same instance: at most 1, as the queue's
    # share (a sender that times its writes after its own first token can outlast it).
    Signal(
        name="kv_transfer_ttft_share",
        label="mean KV transfer / mean TTFT",
        unit="ratio",
        level=INSTANCE,
        promql=f"clamp_max(\n  {_mean(f'{_KV}_seconds')}\n  / {_mean(f'inferwatch_{TTFT}')},\n  1\n)",
        local=Ratio(Mean("kv_transfer_seconds"), Mean(TTFT)),
    ),
)
