"""Bucket bounds of the servers' latency histograms as they ship, per backend and objective.

A latency objective's bound must be one of them, else the SLI has no bucket to count good
events in (real captures in tests/fixtures). One tuple per known layout; servers let users
change buckets, and for those the generated InferenceSLOUnmeasured alert says so at run time.
``VLLM_*_BOUNDS`` are the one definition of vLLM's default bounds (0.32), for whatever
else needs vLLM's histograms (tests, scenarios).
"""

from __future__ import annotations

VLLM_TTFT_BOUNDS = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0),
    *(7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)
VLLM_ITL_BOUNDS = (
    *(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5),
    *(10.0, 20.0, 40.0, 80.0),
)
VLLM_E2E_BOUNDS = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0),
    *(120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)
# SGLang's 2026 layout starts the same for TTFT and end-to-end latency.
_SGLANG_2026 = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0)
_SGLANG_ITL = (
    *(0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2),
    *(0.3, 0.4, 0.5, 0.75, 1.0, 2.5),
)

# backend -> objective kind -> the layouts its releases ship.
BUCKET_BOUNDS: dict[str, dict[str, tuple[tuple[float, ...], ...]]] = {
    "vllm": {"ttft": (VLLM_TTFT_BOUNDS,), "itl": (VLLM_ITL_BOUNDS,), "e2e": (VLLM_E2E_BOUNDS,)},
    "sglang": {
        "ttft": (
            (*VLLM_TTFT_BOUNDS[:16], 15.0, 20.0, 25.0, 30.0),  # 0.3 docs
            (*_SGLANG_2026, 100.0, 200.0, 400.0),  # 2026
        ),
        "itl": (_SGLANG_ITL,),
        "e2e": (
            VLLM_E2E_BOUNDS[:15],  # 0.3 docs
            (5.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 150.0, 200.0, 250.0, 300.0),  # 0.4.4
            (*_SGLANG_2026, 100.0, 200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0),  # 2026
        ),
    },
}
