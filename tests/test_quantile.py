"""histogram_quantile as PromQL computes it (promtool is the oracle), window increase, samples."""

from __future__ import annotations

import math
import random
import subprocess
from pathlib import Path

import pytest
import yaml

from inferwatch.method.quantile import histogram_quantile, increase, sample_quantile
from inferwatch.method.slo.buckets import VLLM_TTFT_BOUNDS
from inferwatch.model import Histogram

# vLLM's TTFT bucket bounds, as its page writes them.
VLLM_TTFT = [*(repr(bound) for bound in VLLM_TTFT_BOUNDS), "+Inf"]

QS = (0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 1.0)


def cumulative(bounds: list[str], per_bucket: list[int]) -> list[tuple[str, float]]:
    total = 0.0
    out = []
    for le, n in zip(bounds, per_bucket, strict=True):
        total += n
        out.append((le, total))
    return out


def cases() -> list[list[tuple[str, float]]]:
    """Histograms PromQL must agree on: typical, sparse, edge-of-bucket, odd shapes."""
    rng = random.Random(8)
    out = [
        cumulative(VLLM_TTFT, [0, 0, 3, 5] + [0] * 19),
        cumulative(VLLM_TTFT, [0] * 22 + [4]),  # everything above the last finite bound
        cumulative(VLLM_TTFT, [1] + [0] * 22),  # everything in the first bucket
        [("0.1", 2.0), ("0.10", 3.0), ("1", 7.0), ("+Inf", 8.0)],  # one bound written twice
        [("0.1", 5.0), ("0.2", 4.0), ("0.4", 9.0), ("+Inf", 9.0)],  # not monotonic
        [("-1", 1.0), ("0", 2.0), ("1", 4.0), ("+Inf", 4.0)],  # bounds at or below zero
        [("0", 3.0), ("1", 4.0), ("+Inf", 4.0)],
    ]
    for _ in range(25):
        n = rng.randint(2, len(VLLM_TTFT))
        bounds = [*sorted(rng.sample(VLLM_TTFT[:-1], n - 1), key=float), "+Inf"]
        out.append(cumulative(bounds, [rng.choice((0, 0, 1, 2, 7, 40)) for _ in bounds]))
    return [c for c in out if c[-1][1] > 0]


def test_agrees_with_promtool(tmp_path: Path) -> None:
    """Every case and quantile, evaluated by Prometheus' own engine via `promtool test rules`
    (which compares the samples exactly)."""
    series = []
    tests = []
    for i, buckets in enumerate(cases()):
        for le, count in buckets:
            series.append({"series": f'h_bucket{{case="{i}",le="{le}"}}', "values": f"{count:g}"})
    for q in QS:
        ours = {f'{{case="{i}"}}': histogram_quantile(q, b) for i, b in enumerate(cases())}
        promql = f"histogram_quantile({q}, h_bucket)"
        # promtool compares values exactly, and NaN equals nothing: compare the numbers
        # (`==` drops NaN samples), then where NaN is (`!= bool` is 1 exactly there).
        numbers = [{"labels": k, "value": v} for k, v in ours.items() if not math.isnan(v)]
        nans = [{"labels": k, "value": float(math.isnan(v))} for k, v in ours.items()]
        tests.append({"expr": f"{promql} == {promql}", "eval_time": "0s", "exp_samples": numbers})
        tests.append({"expr": f"{promql} != bool {promql}", "eval_time": "0s", "exp_samples": nans})
    doc = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}],
    }
    path = tmp_path / "quantile_test.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = subprocess.run(
        ["promtool", "test", "rules", path.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(
    ("q", "buckets", "want"),
    [
        # 8 observations: 3 in (0.005, 0.01], 5 in (0.01, 0.02]. Rank 4 is the first of the
        # five in the second bucket: 0.01 + 0.01 x 1/5.
        (0.5, [("0.005", 0), ("0.01", 3), ("0.02", 8), ("+Inf", 8)], 0.012),
        # Rank 2.85 of 3 in the first bucket, interpolated from 0.
        (0.95, [("0.1", 3), ("+Inf", 3)], 0.095),
        # A rank in the +Inf bucket gives the highest finite bound.
        (0.99, [("0.1", 3), ("0.5", 3), ("+Inf", 4)], 0.5),
        # Bounds written as numbers, out of order.
        (0.5, [(math.inf, 4), (1.0, 4), (0.5, 2)], 0.5),
    ],
)
def test_hand_computed(q: float, buckets: list, want: float) -> None:
    assert histogram_quantile(q, buckets) == pytest.approx(want)


@pytest.mark.parametrize(
    ("q", "buckets"),
    [
        (0.5, [("0.1", 0), ("+Inf", 0)]),  # no observation
        (0.5, [("0.1", 1), ("1", 2)]),  # no +Inf bucket
        (0.5, [("+Inf", 5)]),  # a single bucket
        (0.5, []),
        (math.nan, [("0.1", 1), ("+Inf", 1)]),
    ],
)
def test_nan_where_promql_gives_nan(q: float, buckets: list) -> None:
    assert math.isnan(histogram_quantile(q, buckets))


def test_quantiles_out_of_range_are_infinite() -> None:
    buckets = [("0.1", 1), ("+Inf", 1)]
    assert histogram_quantile(-0.1, buckets) == -math.inf
    assert histogram_quantile(1.1, buckets) == math.inf


def hist(*counts: float, total: float = 1.0) -> Histogram:
    return Histogram(tuple(zip(("0.1", "1", "+Inf"), counts, strict=True)), total, counts[-1])


def test_increase_is_the_window() -> None:
    window = increase(hist(1, 2, 3, total=0.5), hist(4, 6, 9, total=2.0))
    assert window == Histogram((("0.1", 3), ("1", 4), ("+Inf", 6)), 1.5, 6)


def test_increase_after_a_restart_counts_from_zero() -> None:
    after = hist(1, 1, 2)
    assert increase(hist(4, 6, 9), after) is after  # went backwards
    other_bounds = Histogram((("0.5", 1), ("+Inf", 2)), 1.0, 2)
    assert increase(hist(1, 1, 1), other_bounds) is other_bounds


def test_sample_quantile_interpolates_between_closest_ranks() -> None:
    values = [0.4, 0.1, 0.3, 0.2]
    assert sample_quantile(0.0, values) == 0.1
    assert sample_quantile(1.0, values) == 0.4
    assert sample_quantile(0.5, values) == pytest.approx(0.25)
    assert sample_quantile(0.95, values) == pytest.approx(0.385)
    assert sample_quantile(0.5, [7.0]) == 7.0
    assert math.isnan(sample_quantile(0.5, []))
