"""Runbook text of the SLO alerts: what a burn means and how to find its cause.

Kept apart from the cause alerts' runbooks (:mod:`inferwatch.method.runbooks`);
:mod:`inferwatch.method.rules` renders both.
"""

from __future__ import annotations

from inferwatch.method.panels import Panel
from inferwatch.method.runbooks import Runbook

SLO_RUNBOOKS: dict[str, Runbook] = {
    "InferenceSLOFastBurn": Runbook(
        meaning=(
            "Users feel it: the model's requests miss an objective (time to first token, "
            "inter-token latency, end-to-end latency or server errors) so often that at this "
            "rate a large part of the compliance window's error budget is gone within hours. "
            "Both a long and a short window burn (the short one, a twelfth of the long, lets "
            "the page clear minutes after the burn stops). The page says *that* users "
            "suffer; the cause alerts of the same model, listed in the description, say "
            "*why*: read them with the method (phase first, then layer)."
        ),
        confirm=(
            (Panel.SLO_BURN, "the 1h and 5m (or 6h and 30m) lines above their threshold"),
            (Panel.SLO_BUDGET, "how much of the window's budget is left"),
            (Panel.SLO_SLI, "when the SLI fell below the objective"),
            (Panel.FIRING_ALERTS, "the cause alerts of the same model"),
        ),
        causes=(
            "Capacity: more traffic than the replicas serve (InferenceQueueingDelay, "
            "InferenceKVCachePressure).",
            "A slow phase: long prompts or a prefill bottleneck (InferencePrefillBottleneck), "
            "decode far from the hardware floor (InferenceDecodeBottleneck), prefill chunks "
            "stalling decode (InferencePrefillStallsDecode).",
            "A stalled or starved engine (InferenceQueuedWhileIdle, "
            "InferenceFrontendCPUSaturated).",
            "Server errors after a deploy, a bad model or adapter, out-of-memory "
            "(InferenceRequestErrors).",
            "A regression against the measured baseline (InferenceLatencyRegression).",
        ),
        actions=(
            "Open the cause alerts the description lists and follow their runbooks; if none "
            "fires yet, the triage dashboard's top row says which phase and layer.",
            "Buy time where the cause allows: scale out for capacity, roll back a deploy for "
            "errors or a regression, shed or rate-limit the heaviest tenant.",
            "Thresholds: the burn factors are shares of the budget (2 % in 1 h, 5 % in 6 h "
            "page; 10 % in a day or in three days file a ticket), the SRE workbook's "
            "14.4x/6x/3x/1x for a 30-day window; the objectives are in the config's "
            "`slos:` section (`inferwatch calibrate` proposes them from a measured baseline).",
        ),
        escalate=(
            "Page the serving owner if the budget left drops under 50 % or no cause alert "
            "explains the burn within 15 minutes (look outside: load balancer, clients, "
            "network)."
        ),
    ),
    "InferenceSLOSlowBurn": Runbook(
        meaning=(
            "A slow, steady miss of an objective: at this rate 10 % of the compliance "
            "window's budget goes within a day or three. No one needs to wake up, but left "
            "alone it spends the month's budget; fix it in working hours."
        ),
        confirm=(
            (Panel.SLO_BURN, "the 1d and 2h (or 3d and 6h) lines above their threshold"),
            (Panel.SLO_BUDGET, "the budget left trending down"),
            (Panel.SLO_SLI, "the SLI hovering just under the objective"),
        ),
        causes=(
            "Traffic grew past the capacity the objective was set for (compare with the "
            "baseline: InferenceLatencyRegression).",
            "Longer prompts or outputs than before (the Request lengths panel).",
            "A recurring daily peak that queues (InferenceQueueingDelay at the same hour).",
            "The objective is tighter than the service was built for: recalibrate "
            "(`inferwatch calibrate`) and agree on a new objective.",
        ),
        actions=(
            "Find the hours the SLI dips and the cause alerts at those hours.",
            "Plan capacity or tuning for them; recalibrate after any change of model, "
            "hardware or server version.",
        ),
        escalate="Raise it with the service owner if the budget left falls under 25 %.",
    ),
    "InferenceSLOUnmeasured": Runbook(
        meaning=(
            "Events arrive but the objective's SLI cannot be computed: the server's latency "
            "histogram has no bucket at the objective's bound, so good events cannot be "
            "counted and the objective's burn-rate alerts can never fire."
        ),
        confirm=(
            (Panel.SLO_SLI, "no line for this objective while requests flow"),
            (Panel.TTFT, "the server's latency histogram exists"),
        ),
        causes=(
            "The objective's `seconds` is not one of the server's bucket bounds (the "
            "description lists the bounds the server has).",
            "The server was upgraded or started with other buckets (newer vLLM lets users "
            "set them).",
        ),
        actions=(
            "Set the objective's `seconds` to one of the listed bounds in the config's "
            "`slos:` section and run `inferwatch generate --config` again.",
        ),
        escalate="No escalation: this is a monitoring configuration fault.",
    ),
}
