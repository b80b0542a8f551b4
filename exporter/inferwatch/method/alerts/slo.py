"""The SLO alerts' promtool scenarios: the example config's objectives, burning fast, slowly,
for a blip; minutes to days.

The alerts themselves are built per objective by :mod:`inferwatch.method.slo`; their
runbooks are the templates ``runbooks/InferenceSLO*.md`` beside this module. The scenarios
judge the rules the example config (alerts/slos.example.yaml) generates.
"""

from __future__ import annotations

from inferwatch.method.scenario import B
from inferwatch.method.scenario.slo import (
    SIX_HOURS,
    SLO_LARGE,
    SLO_MODEL,
    Phase,
    after_onset,
    firing,
    slo_checks,
    slo_series,
)

# The expected text is typed here, not rendered from the rules: it ranges over queried series
# (the model's cause alerts, the server's bucket bounds), which the renderer does not evaluate.
SLO_FAST = [
    {
        "name": "fast burn: every request of llama-3-8b fails (99.9 % objective): page in 1 min",
        "interval": "1m",
        "input_series": slo_series(60, (SIX_HOURS, Phase(20, error_share=1.0))),
        "promql_expr_test": [
            *slo_checks(after_onset(0), slow=None),
            *slo_checks(
                after_onset(1), fast=(firing("InferenceSLOFastBurn", "errors"),), slow=None
            ),
        ],
        # Seven minutes in: 1 h burn 7/60 / 0.1 % = 117x; the 5 min error rates recorded so far
        # (0.4, 0.8, ... 2, 2, 2 req/s) against 2 req/s over 6 h hold 13.7x the 28 d budget; the
        # cause alert has fired since minute 6 (a step later than its `for`: the two rule
        # groups are evaluated concurrently, so at minute 6 the page may see it pending).
        "alert_rule_test": [
            {
                "eval_time": after_onset(7),
                "alertname": "InferenceSLOFastBurn",
                "exp_alerts": [
                    {
                        "exp_labels": {
                            "severity": "critical",
                            "slo": "errors",
                            "layer": "slo",
                            "namespace": "prod",
                            "backend": "vllm",
                            "model": SLO_MODEL,
                        },
                        "exp_annotations": {
                            "summary": f"{SLO_MODEL}: the server errors objective burns its "
                            "error budget fast",
                            "description": "Objective: 99.9 % of finished requests end without "
                            "a server error over 28d. The budget burns at 117x the sustainable "
                            "rate (threshold 13.4x over 1h and 5m or 5.6x over 6h and 30m); "
                            "-1270% of the 28d budget is left. Cause alerts of this model: "
                            "InferenceRequestErrors (firing).",
                        },
                    }
                ],
            }
        ],
    },
    {
        "name": "fast burn: every first token of llama-3-8b misses 0.5 s (99 %): page in 9 min",
        # 1h share of bad events 8/60 = 13.3 % < 2 % x 28 d / 1 h x 1 % = 13.44 %; 9/60 above.
        "interval": "1m",
        "input_series": slo_series(60, (SIX_HOURS, Phase(20, slow_share=1.0))),
        "promql_expr_test": [
            *slo_checks(after_onset(8), slow=None),
            *slo_checks(after_onset(9), fast=(firing("InferenceSLOFastBurn", "ttft"),), slow=None),
        ],
    },
    {
        # 1 h share 2/60 = 3.3 % (< 13.44 %), 30 min 6.7 % but 6 h 0.56 % (< 5.6 %), 2 h
        # 1.7 % (< 2.8 %), 6 h below 0.93 %: no window pair burns.
        "name": "blip: two minutes of slow first tokens after six healthy hours: silent",
        "interval": "1m",
        "input_series": slo_series(60, (SIX_HOURS, Phase(2, slow_share=1.0), Phase(30))),
        "promql_expr_test": [
            *slo_checks(after_onset(2)),
            *slo_checks(after_onset(5)),
            *slo_checks(after_onset(30)),
        ],
    },
    {
        "name": "aborts are the clients': half the requests aborted burn no error budget",
        "interval": "1m",
        "input_series": slo_series(60, (SIX_HOURS, Phase(20, abort_share=0.5))),
        "promql_expr_test": [
            *slo_checks(after_onset(10), slow=None),
            *slo_checks(after_onset(20), slow=None),
        ],
        "alert_rule_test": [
            {"eval_time": after_onset(20), "alertname": "InferenceRequestErrors", "exp_alerts": []}
        ],
    },
    {
        "name": "namespaces: llama-3-8b fails in staging only; prod is not paged",
        "interval": "1m",
        "input_series": slo_series(60, (SIX_HOURS, Phase(20)))
        + slo_series(60, (SIX_HOURS, Phase(20, error_share=1.0)), namespace="staging", instance=B),
        "promql_expr_test": [
            *slo_checks(
                after_onset(5),
                fast=(firing("InferenceSLOFastBurn", "errors", namespace="staging"),),
                slow=None,
            ),
        ],
    },
    {
        "name": "per-model objectives: first tokens in 0.5-2.5 s miss llama-3-8b's, not llama-3-70b's",
        "interval": "1m",
        "input_series": slo_series(60, (SIX_HOURS, Phase(20, medium_share=1.0)))
        + slo_series(60, (SIX_HOURS, Phase(20, medium_share=1.0)), model=SLO_LARGE, instance=B),
        "promql_expr_test": [
            *slo_checks(after_onset(20), fast=(firing("InferenceSLOFastBurn", "ttft"),), slow=None)
        ],
    },
    {
        "name": "unmeasured: a server without a 0.5 s bucket",
        "interval": "1m",
        "input_series": slo_series(
            60, (Phase(20),), bounds=(0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0)
        ),
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "InferenceSLOUnmeasured", "exp_alerts": []},
            {
                "eval_time": "20m",
                "alertname": "InferenceSLOUnmeasured",
                "exp_alerts": [
                    {
                        "exp_labels": {
                            "severity": "warning",
                            "slo": "ttft",
                            "layer": "slo",
                            "namespace": "prod",
                            "backend": "vllm",
                            "model": SLO_MODEL,
                        },
                        "exp_annotations": {
                            "summary": f"{SLO_MODEL}: the time to first token objective cannot "
                            "be measured",
                            "description": "Objective: 99 % of requests within 0.5 s (time to "
                            "first token). Requests arrive but "
                            "inferwatch_time_to_first_token_seconds has no bucket at 0.5 s; the "
                            "server's bounds are 0.1 0.2 0.4 0.6 0.8 1.0 2.0 4.0 6.0 . Set the "
                            "objective's seconds to one of them (or give the server that bucket) "
                            "and regenerate the rules.",
                        },
                    }
                ],
            },
        ],
    },
]
SLO_SLOW = [
    {
        "name": "slow burn: 1.5 % of first tokens late for days (1.5x): ticket after ~45 h, no page",
        # 3 d share 1.5 % x t / 72 h > 0.9333 x 1 % once t > 44.8 h; 1.5x never reaches 2.8x.
        # Samples every 2 min: the long windows add up the recorded 5 min rates, and a 5 min
        # rate needs two samples (rules evaluated every 10 min).
        "interval": "2m",
        "input_series": slo_series(120, (Phase(3 * 24 * 60), Phase(3 * 24 * 60, slow_share=0.015))),
        "promql_expr_test": [
            *slo_checks(f"{72 + 44}h"),
            *slo_checks(f"{72 + 46}h", slow=(firing("InferenceSLOSlowBurn", "ttft"),)),
            *slo_checks("144h", slow=(firing("InferenceSLOSlowBurn", "ttft"),)),
        ],
    },
]
