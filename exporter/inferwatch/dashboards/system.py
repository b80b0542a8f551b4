"""The triage dashboard's "System: frontend CPU, the client's path, workload" row.

The server's API process and what the canary sees on the users' path; the workload (request
lengths, token throughput); how requests end (HTTP status, finish reason); prefix caching.
"""

from __future__ import annotations

from inferwatch.dashboards.queries import (
    NODE,
    RATE_INTERVAL,
    TARGET,
    TOKENS,
    TOKENS_PER_SECOND,
    PanelSpec,
    Query,
    limit,
    quantiles,
    series,
)
from inferwatch.method.spec import Spec
from inferwatch.panels import Panel


def system_panels(spec: Spec) -> list[PanelSpec]:
    """The client's path, the workload, how requests end, the prefix cache."""
    return [
        *_client_path(spec),
        _server_cpu(spec),
        *_workload(spec),
        *_request_outcomes(),
        _prefix_cache(spec.timing.window),
    ]


def _client_path(spec: Spec) -> list[PanelSpec]:
    """Frontend CPU, and the canary's view: its TTFT gap to the server's, its probes."""
    threshold = spec.threshold
    return [
        PanelSpec(
            Panel.FRONTEND_CPU,
            "CPU cores used by the server's API/tokenizer process. Healthy: well under 1 core. "
            "At ~1 core while the GPU waits, the frontend (tokenization, detokenization, HTTP) is "
            "the bottleneck: more API-server processes, a fast tokenizer.",
            [
                Query(
                    f"instance:inferwatch_frontend_cpu_seconds:{spec.rate_name}{{{TARGET}}}",
                    "{{instance}}",
                )
            ],
            unit="suffix: cores",
            thresholds=limit(threshold("frontend_cpu_cores")),
        ),
        PanelSpec(
            Panel.CLIENT_GAP,
            "Canary-only (serve --canary on). How much later the canary's first token arrives "
            "than the server's own TTFT says, over the rate window: what the network, ingress, "
            "HTTP handling, tokenization and SSE framing add. Healthy: a few ms in one data "
            "centre. The engine is not what is slow when only this one grows.",
            [Query(series("canary_ttft_gap_seconds"), "{{instance}}")],
            unit="s",
            thresholds=limit(threshold("client_gap_seconds")),
        ),
        PanelSpec(
            Panel.CANARY_PROBES,
            "Canary-only. The canary's probes per second by result: ok, or why they failed "
            "(timeout, http_error, connect_error, bad_stream). Failures while the server reports "
            "up mean users on the same path fail too.",
            [_rate_by("result", "canary_probes")],
            unit="reqps",
            stacked=True,
        ),
    ]


def _server_cpu(spec: Spec) -> PanelSpec:
    """The server's threads waiting for a CPU, the node's pressure, the cgroup's limit."""
    return PanelSpec(
        Panel.SERVER_CPU,
        "serve --server-cpu on, the server's processes visible to the sidecar. Of the time "
        "the server's threads were ready to run, the share they waited for a CPU; the "
        "node's CPU pressure (PSI some: time any task waited); the seconds per second the "
        "server's cgroup was throttled by its CPU limit. Healthy: a few % of wait, no "
        "throttling. Wait with high node pressure is a noisy neighbour; wait with "
        "throttling is the pod's CPU limit.",
        [
            Query(
                f"instance:inferwatch_server_cpu_wait_seconds:share_{spec.rate_name}{{{NODE}}}",
                "{{instance}} wait share",
            ),
            Query(
                f"rate({series('node_cpu_pressure_seconds', NODE)}[{RATE_INTERVAL}])",
                "{{instance}} node pressure",
            ),
            Query(
                f"rate({series('server_cpu_throttled_seconds', NODE)}[{RATE_INTERVAL}])",
                "{{instance}} throttled",
            ),
        ],
        unit="percentunit",
        thresholds=limit(spec.threshold("server_cpu_wait_share")),
    )


def _workload(spec: Spec) -> list[PanelSpec]:
    """Prompt and output lengths, and tokens per second."""
    rate = spec.rate_name
    return [
        PanelSpec(
            Panel.REQUEST_LENGTHS,
            "Prompt and output length of finished requests, p50/p95/p99 in tokens. Prefill "
            "cost grows about quadratically with prompt length and a long tail of prompts "
            "makes a TTFT tail; compare with the baseline's lengths before blaming the server.",
            [
                *quantiles("request_prompt_tokens", RATE_INTERVAL, "prompt"),
                *quantiles("request_generation_tokens", RATE_INTERVAL, "output"),
            ],
            unit=TOKENS,
        ),
        PanelSpec(
            Panel.TOKEN_THROUGHPUT,
            "Prompt (prefill) and generated (decode) tokens per second across the selected "
            "instances.",
            [
                Query(
                    f"sum(instance:inferwatch_prompt_tokens:{rate}{{{TARGET}}})",
                    "prompt tokens/s",
                ),
                Query(
                    f"sum(instance:inferwatch_generation_tokens:{rate}{{{TARGET}}})",
                    "generated tokens/s",
                ),
            ],
            unit=TOKENS_PER_SECOND,
        ),
    ]


def _request_outcomes() -> list[PanelSpec]:
    """Responses by HTTP status class, finished requests by reason."""
    return [
        PanelSpec(
            Panel.HTTP_STATUS,
            "Responses of the server's inference API per second by HTTP status class (its "
            "own /metrics and health endpoints left out). 5xx: the server failed the request; "
            "4xx: clients sent what it refused (too long a prompt, a wrong model name), often "
            "a deployment or client change rather than a server problem.",
            [_rate_by("status", "http_requests")],
            unit="reqps",
            stacked=True,
        ),
        PanelSpec(
            Panel.FINISHED_BY_REASON,
            "Finished requests per second by reason. stop/length are normal endings; error and "
            "abort (clients disconnecting, often after timeouts) should stay a small share.",
            [_rate_by("reason", "requests_finished")],
            unit="reqps",
            stacked=True,
        ),
    ]


def _prefix_cache(window: str) -> PanelSpec:
    """The prefix cache's hit share over the rules' ``window``."""
    hits = f"rate({series('prefix_cache_hits')}[{window}])"
    queries = f"rate({series('prefix_cache_queries')}[{window}])"
    return PanelSpec(
        Panel.PREFIX_CACHE,
        "Share of prompt tokens found in the prefix cache. Low with long shared system "
        "prompts means caching is off or defeated (a variable part at the start of the "
        "prompt); each hit is prefill compute saved.",
        [
            Query(
                f"sum without (engine) ({hits})\n  / (sum without (engine) ({queries}) > 0)",
                "{{instance}}",
            )
        ],
        unit="percentunit",
    )


def _rate_by(label: str, counter: str) -> Query:
    """The contract's ``counter`` per second by ``label``, legend the label's value."""
    return Query(f"sum by ({label}) (rate({series(counter)}[{RATE_INTERVAL}]))", f"{{{{{label}}}}}")
