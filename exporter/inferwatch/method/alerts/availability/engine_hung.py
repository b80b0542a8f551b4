"""InferenceEngineHung: an engine hung behind an API server that still answers."""

from __future__ import annotations

from inferwatch.method.alerts.alert import Alert, Cond
from inferwatch.method.alerts.scheduling.queued_while_idle import queued_while_idle_on_a
from inferwatch.method.scenario import (
    A,
    B,
    C,
    Scenario,
    healthy,
    instance_alert,
)
from inferwatch.method.signals import INSTANCE

ENGINE_HUNG = Scenario(
    # B: six requests "running" for the whole window, and not a token generated nor a
    # prompt read. C serves embeddings: requests run, prompts are read, no token is generated
    # (near miss). A's engine is paused with requests waiting: InferenceQueuedWhileIdle's
    # case, not this one.
    "a hung engine behind an API server that still answers",
    (
        healthy(A, requests_per_s=0.0, steps_per_s=0.0, waiting=(9,), queued_while_idle_share=0.9),
        healthy(B, requests_per_s=0.0, steps_per_s=0.0, running=(6,), waiting=(0,)),
        healthy(C, generation_tokens_per_request=0),
    ),
    file="availability.yaml",
    place=11,
    fires={
        "InferenceEngineHung": [instance_alert(B, value=6)],  # requests running
        "InferenceQueuedWhileIdle": [queued_while_idle_on_a(idle=0.9, waiting=9)],
    },
)

ENGINE_HUNG_ALERT = Alert(
    name="InferenceEngineHung",
    order=21,
    severity="critical",
    level=INSTANCE,
    phase="any",
    layer="availability",
    # Its gauges froze at the engine's last report: a full KV cache among them is stale.
    explains=(
        "InferenceKVCachePressure",
        "InferenceGPUUnderutilized",
        "InferenceCanaryFailing",
        "InferenceClientGap",
    ),
    # Requests that never finish are counted by no SLI until a client gives up.
    outside_the_slis=True,
    for_default="2m",
    summary="The engine of {{ $labels.instance }} is hung while its API server answers",
    description="{{ $labels.model }} on {{ $labels.instance }} had "
    '{{ $value | printf "%%.3g" }} requests running over the last %(window)s and generated no '
    "token nor read a prompt: its engine has died or hung while its API server still answers. "
    "Its running and waiting gauges are the engine's last report, not the present.",
    when=(
        Cond("running", ">=", 1),
        Cond("generation_rate", "<=", 0),
        Cond("prompt_rate", "<=", 0),
    ),
    # With requests waiting too, the stall is InferenceQueuedWhileIdle's, which says more.
    unless=(Cond("queued_while_idle_ratio", ">", "queued_while_idle_ratio"),),
    scenarios=(ENGINE_HUNG,),
)

ALERTS = (ENGINE_HUNG_ALERT,)
