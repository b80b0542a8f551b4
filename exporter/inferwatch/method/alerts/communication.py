"""The communication layer: NVLink and PCIe links that run near their peak, and the KV
transfer between the prefill and decode instances of a disaggregated pair."""

from __future__ import annotations

from inferwatch.method.alerts.alert import USERS_SEE, Alert, Cond
from inferwatch.method.alerts.annotations import PLAIN_NUMBER, value_of, window_mean
from inferwatch.method.scenario import (
    A,
    B,
    Dist,
    KVTransfer,
    Scenario,
    gpu_alert,
    healthy,
    instance_alert,
)
from inferwatch.method.signals import INSTANCE

_KV = "inferwatch_kv_transfer"
_FAILURES, _EXPIRED = f"{_KV}_failures_total", f"{_KV}_expired_requests_total"

NVLINK_NEAR_PEAK = Scenario(
    # A's GPU 0 receives 90 % of its NVLink peak (tensor-parallel all-reduce); B's GPU 0
    # sends 75 % of its PCIe peak: a near miss, silent.
    "interconnect: NVLink near its peak",
    (healthy(A, nvlink_share=0.9), healthy(B, pcie_share=0.75)),
    file="availability.yaml",
    place=4,
    fires={"InferenceInterconnectSaturated": [gpu_alert(A, value=0.9)]},
)
LINKS_NEAR_MISS = Scenario(
    "interconnect near miss: NVLink and PCIe at 75 %",
    (healthy(A, nvlink_share=0.75), healthy(B, nvlink_share=None, pcie_share=0.75)),
    file="availability.yaml",
    place=5,
    fires={},
    silent=("InferenceInterconnectSaturated",),
)
PCIE_NEAR_PEAK = Scenario(
    # No NVLink on A: tensor parallel over PCIe at 85 % of its peak.
    "interconnect: PCIe near its peak",
    (healthy(A, nvlink_share=None, pcie_share=0.85), healthy(B)),
    file="availability.yaml",
    place=6,
    fires={"InferenceInterconnectSaturated": [gpu_alert(A, value=0.85)]},
)

INTERCONNECT_SATURATED = Alert(
    name="InferenceInterconnectSaturated",
    order=16,
    severity="warning",
    level=INSTANCE,
    phase="any",
    layer="communication",
    explains=("InferencePrefillBottleneck", "InferenceDecodeBottleneck", *USERS_SEE),
    for_default="10m",
    summary="GPU {{ $labels.gpu }} on {{ $labels.instance }}: a link runs near its peak",
    description="GPU {{ $labels.gpu }} ({{ $labels.name }}) moved "
    "{{ $value | humanizePercentage }} of its NVLink (or, without NVLink traffic that high, "
    "PCIe) peak over the last %(window)s (threshold %(pct.link_share_high)s): the link, not "
    "compute or memory, sets the pace: tensor-parallel all-reduce between GPUs, or host "
    "transfers.",
    any_of=(
        Cond("nvlink_share", ">", "link_share_high"),
        Cond("pcie_share", ">", "link_share_high"),
    ),
    scenarios=(NVLINK_NEAR_PEAK, LINKS_NEAR_MISS, PCIE_NEAR_PEAK),
)

# ---------------------------------------------------------------------------------------
# InferenceKVTransferFailing

KV_FAILING = Scenario(
    # A's decode side: 1.94 transfers/s timed, 0.06 failed and 0.04 requests expired
    # unfetched: 0.1 of the 2 attempted per second, 5 %.
    "KV transfers failing between prefill and decode",
    (
        healthy(A, kv_transfer=KVTransfer(per_s=1.94, failures_per_s=0.06, expired_per_s=0.04)),
        healthy(B),
    ),
    file="availability.yaml",
    place=15,
    fires={"InferenceKVTransferFailing": [instance_alert(A, value=0.05, queries=(0.06, 0.04))]},
)
KV_FAILING_NEAR_MISS = Scenario(
    # Near miss: 0.01 of 2 transfers/s fail, 0.5 %; SGLang's side, no expired requests.
    "KV transfer near miss: 0.5 % fail",
    (healthy(A, kv_transfer=KVTransfer(per_s=1.99, failures_per_s=0.01, expired_per_s=None)),),
    file="availability.yaml",
    place=16,
    fires={},
    silent=("InferenceKVTransferFailing",),
)

KV_TRANSFER_FAILING = Alert(
    name="InferenceKVTransferFailing",
    order=26,
    severity="warning",
    level=INSTANCE,
    phase="any",
    layer="communication",
    explains=("InferenceRequestErrors", *USERS_SEE),
    for_default="10m",
    summary="{{ $labels.instance }}: {{ $value | humanizePercentage }} of KV transfers fail",
    description="{{ $value | humanizePercentage }} of the KV transfers {{ $labels.instance }} "
    "attempted over the last %(window)s failed or left their request's KV expired unfetched "
    "(threshold %(pct.kv_transfer_failure_share)s): "
    + value_of(f"sum(rate({_FAILURES}[%(window)s]))", INSTANCE, PLAIN_NUMBER)
    + " failures/s and "
    + value_of(f"sum(rate({_EXPIRED}[%(window)s]))", INSTANCE, PLAIN_NUMBER)
    + " expired requests/s. The decode side computes those prompts again or fails the "
    "requests: the KV connector, the network between the prefill and decode pools, or the "
    "prefill instance releasing the KV before the decode side read it.",
    when=(
        Cond("kv_transfer_failing_share", ">", "kv_transfer_failure_share"),
        Cond("kv_transfer_attempt_rate", ">", "min_request_rate"),
    ),
    scenarios=(KV_FAILING, KV_FAILING_NEAR_MISS),
)

# ---------------------------------------------------------------------------------------
# InferenceKVTransferSlow

# First tokens in (2.5, 5] s, 3 s on average (p95 4.875 s), 0.9 s of them queued: a third,
# neither a queue (InferenceQueueingDelay) nor the prompt's compute alone
# (InferencePrefillBottleneck) by the queue's share.
SLOW_FIRST_TOKENS = {"ttft": Dist({5.0: 1.0}, 3.0), "queue": Dist({1.0: 1.0}, 0.9)}

KV_SLOW = Scenario(
    # Transfers of 2 GB in (1, 5] s, 2 s on average: two thirds of the mean TTFT, 1 GB/s.
    "KV transfer takes most of the first token's wait",
    (
        healthy(
            A,
            **SLOW_FIRST_TOKENS,
            kv_transfer=KVTransfer(seconds=Dist({5.0: 1.0}, 2.0), bytes_each=2e9),
        ),
    ),
    file="availability.yaml",
    place=17,
    fires={"InferenceKVTransferSlow": [instance_alert(A, value=2 / 3, queries=(2.0, 1e9))]},
)
KV_SLOW_NEAR_MISS = Scenario(
    # Near miss: 1.2 s transfers, 40 % of the same slow first tokens.
    "KV transfer near miss: 40 % of TTFT",
    (
        healthy(
            A,
            **SLOW_FIRST_TOKENS,
            kv_transfer=KVTransfer(seconds=Dist({5.0: 1.0}, 1.2), bytes_each=2e9),
        ),
    ),
    file="availability.yaml",
    place=18,
    fires={},
    silent=("InferenceKVTransferSlow",),
)
KV_SLOW_TTFT_FINE = Scenario(
    # 0.3 s transfers are 75 % of a 0.4 s mean TTFT, but TTFT p95 (487.5 ms) is fine.
    "KV transfer most of a fast first token: silent",
    (healthy(A, kv_transfer=KVTransfer(seconds=Dist({0.5: 1.0}, 0.3))),),
    file="availability.yaml",
    place=19,
    fires={},
    silent=("InferenceKVTransferSlow",),
)

KV_TRANSFER_SLOW = Alert(
    name="InferenceKVTransferSlow",
    order=27,
    severity="warning",
    level=INSTANCE,
    phase="prefill",
    layer="communication",
    explains=("InferencePrefillBottleneck", *USERS_SEE),
    for_default="10m",
    summary="{{ $labels.instance }}: the first token waits for the KV transfer",
    description="The KV transfers timed on {{ $labels.instance }} took "
    + value_of(window_mean(f"{_KV}_seconds"), INSTANCE, "humanizeDuration")
    + " each on average over the last %(window)s, {{ $value | humanizePercentage }} of the "
    "mean time to the first token (threshold %(pct.kv_transfer_ttft_share)s), while TTFT p95 "
    "is above %(t.ttft_p95_seconds)ss: the first token waits for the KV to cross between the "
    "prefill and decode pools. The transfers moved "
    + value_of(window_mean(f"{_KV}_bytes_total", f"{_KV}_seconds_sum"), INSTANCE)
    + "B/s while transferring.",
    when=(
        Cond("kv_transfer_ttft_share", ">", "kv_transfer_ttft_share"),
        Cond("ttft_p95", ">", "ttft_p95_seconds"),
        Cond("kv_transfer_attempt_rate", ">", "min_request_rate"),
    ),
    scenarios=(KV_SLOW, KV_SLOW_NEAR_MISS, KV_SLOW_TTFT_FINE),
)

# ---------------------------------------------------------------------------------------
# InferenceKVTransferMissing

# A decode instance whose prompts' KV should come from the prefill pool; a quarter of its
# prompt tokens are in its own prefix cache (the scenarios' default).
DECODE = {"role": "decode"}

KV_MISSING = Scenario(
    # 5 % of A's prompt tokens arrived by transfer, 25 % were cached: it computed 70 % of
    # the 1,600 prompt tokens/s it took.
    "KV transfer missing: the decode side computes the prompts",
    (healthy(A, **DECODE, kv_transfer_prompt_share=0.05), healthy(B)),
    file="availability.yaml",
    place=20,
    fires={"InferenceKVTransferMissing": [instance_alert(A, value=0.3, queries=(1600.0,))]},
)
KV_MISSING_NEAR_MISS = Scenario(
    # Near miss: 35 % by transfer and 25 % cached, 60 % in all.
    "KV transfer near miss: 60 % of the prompt tokens arrived",
    (healthy(A, **DECODE, kv_transfer_prompt_share=0.35),),
    file="availability.yaml",
    place=21,
    fires={},
    silent=("InferenceKVTransferMissing",),
)
KV_MISSING_NOT_DECODE = Scenario(
    # Nothing arrives by transfer on a server that is not a decode instance (a plain server
    # counts its zero; a kv_both or prefill instance computes its prompts by design): silent.
    "no KV by transfer off the decode side: silent",
    (
        healthy(A, kv_transfer_prompt_share=0.0),
        healthy(B, role="prefill", kv_transfer_prompt_share=0.0),
    ),
    file="availability.yaml",
    place=22,
    fires={},
    silent=("InferenceKVTransferMissing",),
)

KV_TRANSFER_MISSING = Alert(
    name="InferenceKVTransferMissing",
    order=30,
    severity="warning",
    level=INSTANCE,
    phase="prefill",
    layer="communication",
    explains=("InferencePrefillBottleneck", "InferencePrefillStallsDecode", *USERS_SEE),
    for_default="10m",
    summary="{{ $labels.instance }}: the decode side computes the prompts the KV transfer "
    "should bring",
    description="Of the "
    + value_of("sum(rate(inferwatch_prompt_tokens_total[%(window)s]))", INSTANCE, PLAIN_NUMBER)
    + " prompt tokens/s the decode instance {{ $labels.instance }} took over the last "
    "%(window)s, only {{ $value | humanizePercentage }} arrived by KV transfer or were in its "
    "prefix cache (threshold %(pct.kv_transfer_prompt_share_low)s): it computed the rest "
    "itself, the prefill pool's work done again, and its decode steps wait behind those "
    "prefills. The KV does not arrive: the connector's configuration on either side (a "
    "storage path or KV address the two do not share), the prefill instance not sending, or "
    "a router that sends requests to the decode pool without their prefill.",
    when=(
        Cond("kv_transfer_prompt_share", "<", "kv_transfer_prompt_share_low"),
        Cond("request_rate", ">", "min_request_rate"),
    ),
    scenarios=(KV_MISSING, KV_MISSING_NEAR_MISS, KV_MISSING_NOT_DECODE),
)

ALERTS = (INTERCONNECT_SATURATED, KV_TRANSFER_FAILING, KV_TRANSFER_SLOW, KV_TRANSFER_MISSING)
