"""``inferwatch calibrate``'s config: thresholds from a stored real sweep, proven with promtool.

The sweep in ``fixtures/baseline-vllm-0.32.0-cpu-tiny.yaml`` was measured against the real
vLLM here. The config written from it is turned into rules by ``inferwatch generate
--config`` (the CLI, as a user runs it); promtool then evaluates those rules on a replica
whose TTFT (then ITL) p95, as ``histogram_quantile`` reads it from vLLM's own buckets, is
2x the measured one (the alert must fire) or 1.2x (it must stay silent).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from inferwatch.baseline import load
from inferwatch.calibration import (
    NormalReadings,
    objectives_from,
    thresholds_from,
    thresholds_from_readings,
)
from inferwatch.collect.backends import BACKENDS
from inferwatch.method.quantile import histogram_quantile
from inferwatch.method.spec import spec_from_config
from inferwatch.method.thresholds import THRESHOLDS
from inferwatch.settings import load_config_file
from inferwatch.tools.calibrate_file import Measurements, config_text

from conftest import alert_scenarios

FIXTURES = Path(__file__).parent / "fixtures"
SWEEP = FIXTURES / "baseline-vllm-0.32.0-cpu-tiny.yaml"


@pytest.fixture(scope="module")
def scenarios():
    return alert_scenarios()


def calibrated(path: Path, given: dict | None = None) -> Path:
    baseline = load(SWEEP)
    spec = spec_from_config(given or {})
    derived = thresholds_from(baseline, spec.threshold("regression_factor"), spec.window_seconds)
    measured = Measurements(derived, {"server_cpu_wait_share": "no process listens here"})
    path.write_text(config_text(baseline, SWEEP, measured, given or {}, "base.yaml"))
    return path


def test_a_fleet_calibrated_through_its_router_says_so_and_judges_one_replicas_share() -> None:
    """The real sweep's cell at concurrency 2, as if measured through a router in front of two
    replicas: the header names the router, and the traffic floor is one replica's (half of
    the light cell's rate, which is half the fleet's)."""
    sweep = load(SWEEP)
    whole = dataclasses.replace(sweep, cells=tuple(c for c in sweep.cells if c.concurrency == 2))
    share = whole.share(2)
    assert [c.concurrency for c in share.cells] == [1]
    factor, window = spec_from_config({}).threshold("regression_factor"), 1.0
    text = config_text(share, SWEEP, Measurements(thresholds_from(share, factor, window)), {}, "-")
    assert "at ? (a router in front of 2 replicas: the rates here are one's share)" in text
    alone = config_text(whole, SWEEP, Measurements(thresholds_from(whole, factor, window)), {}, "-")
    assert "at ? (gpu" in alone  # the stored sweep names no URL
    (light,) = (c.requests_per_second for c in whole.cells)
    floor = thresholds_from(share, factor, window)["min_request_rate"].value
    assert floor == pytest.approx(light / 4, rel=0.01)


def test_the_config_says_where_each_threshold_comes_from(tmp_path: Path) -> None:
    given = {
        "poll_interval": 0.25,
        "thresholds": {"error_ratio": 0.01},
        "alerting": {"rate_window": "1m"},
    }
    text = calibrated(tmp_path / "inferwatch.yaml", given).read_text()
    config = load_config_file(tmp_path / "inferwatch.yaml")
    # A machine-dependent threshold not measured is written commented out, with why: the
    # spec read from the file judges with its default and keeps its alerts at info.
    left = {
        "itl_tail_bound_seconds",
        "itl_tail_share",
        "client_gap_seconds",
        "server_cpu_wait_share",
        "frontend_cpu_cores",
    }
    assert set(config["thresholds"]) == set(THRESHOLDS) - left
    assert spec_from_config(config).uncalibrated() == sorted(left, key=list(THRESHOLDS).index)
    assert "  # server_cpu_wait_share: 0.25" in text.splitlines()
    assert "  # not measured (no process listens here); default: A thread" in text
    assert config["baseline"] == str(SWEEP)
    assert config["poll_interval"] == 0.25
    assert config["alerting"] == {"rate_window": "1m"}
    assert config["thresholds"]["error_ratio"] == 0.01
    # 1.5 x the server's TTFT p95 at the highest concurrency (2) of the stored sweep
    busiest = load(SWEEP).busiest()[0]
    assert config["thresholds"]["ttft_p95_seconds"] == pytest.approx(
        1.5 * busiest.server_ttft_seconds.p95, rel=1e-3
    )
    lines = text.splitlines()
    comment = lines[
        lines.index(f"  ttft_p95_seconds: {config['thresholds']['ttft_p95_seconds']:g}") - 1
    ]
    assert comment.startswith("  # measured: 1.5 x ")
    assert "the server's TTFT p95 at concurrency 2 (prompt 36, output 16)" in comment
    assert "  # set in base.yaml" in lines
    assert "  # measured: 15 requests per 60 s rate window" in lines
    assert any(line.startswith("  # default: ") for line in lines)


def p95_at(value: float, bounds: tuple[float, ...]):
    """Bucket shares whose p95, interpolated as histogram_quantile does, is ``value``."""
    upper = next(b for b in bounds if b >= value)
    lower = max((b for b in bounds if b < upper), default=0.0)
    f = (value - lower) / (upper - lower)
    shares = {lower: (0.95 - f) / (1 - f), upper: 1 - (0.95 - f) / (1 - f)}
    if f > 0.95:  # all below the bound, a little above it
        shares = {upper: 0.95 / f, bounds[bounds.index(upper) + 1]: 1 - 0.95 / f}
    shares = {b: s for b, s in shares.items() if b > 0 and s > 0}
    cumulative = [(b, sum(s for ub, s in shares.items() if ub <= b)) for b in bounds]
    assert histogram_quantile(0.95, [*cumulative, ("+Inf", 1.0)]) == pytest.approx(value)
    return shares


@pytest.mark.parametrize("factor", [2.0, 1.2])
def test_calibrated_rules_fire_on_a_2x_regression_and_not_at_1_2x(
    tmp_path: Path, scenarios, factor: float
) -> None:
    config = calibrated(tmp_path / "inferwatch.yaml")
    done = subprocess.run(
        [sys.executable, "-m", "inferwatch", "generate", "--out", str(tmp_path), "--config", str(config)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    busiest = load(SWEEP).busiest()[0]
    ttft, itl = busiest.server_ttft_seconds.p95, busiest.server_itl_seconds.p95
    healthy = {
        "requests_per_s": 4.0,
        "generation_tokens_per_request": 16,
        "decode_floor": None,
        "gpu_busy": None,
        "queue": scenarios.Dist({0.3: 1.0}, ttft / 20),
    }
    slow_prefill = scenarios.Replica(
        "10.0.0.1:10177",
        ttft=scenarios.Dist(p95_at(factor * ttft, scenarios.TTFT_LE), factor * ttft),
        itl=scenarios.Dist(p95_at(itl, scenarios.ITL_LE), itl),
        **healthy,
    )
    slow_decode = scenarios.Replica(
        "10.0.0.2:10177",
        ttft=scenarios.Dist(p95_at(ttft, scenarios.TTFT_LE), ttft),
        itl=scenarios.Dist(p95_at(factor * itl, scenarios.ITL_LE), factor * itl),
        **healthy,
    )
    expect = {
        "InferencePrefillBottleneck": ("10.0.0.1:10177",),
        "InferenceDecodeBottleneck": ("10.0.0.2:10177",),
    }
    tests = {
        "rule_files": [str(tmp_path / "alerts" / "inferwatch-rules.yaml")],
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": f"{scenarios.STEP}s",
                "input_series": scenarios.input_series(slow_prefill)
                + scenarios.input_series(slow_decode),
                "promql_expr_test": [
                    {
                        "expr": f'count by (instance) (ALERTS{{alertname="{alert}", alertstate="firing"}})',
                        "eval_time": scenarios.EVAL,
                        "exp_samples": [
                            {"labels": f'{{instance="{instance}"}}', "value": 1}
                            for instance in instances
                        ]
                        if factor >= 2
                        else [],
                    }
                    for alert, instances in expect.items()
                ],
            }
        ],
    }
    path = tmp_path / "regression.yaml"
    path.write_text(yaml.safe_dump(tests))
    out = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_calibrate_proposes_objectives_on_the_servers_bucket_bounds(tmp_path: Path) -> None:
    """A latency objective's bound is the server's first bucket bound at or above 1.5 x the
    measured p99 (here vLLM 0.32's own bounds, from a real capture); the rules count it."""
    page = (FIXTURES / "vllm-0.32.0-cpu-loaded-kv-full.prom").read_text()
    histograms = BACKENDS["vllm"].normalize(page).histograms
    bounds = {
        kind: [float(le) for le, _ in next(iter(histograms[name].values())).buckets[:-1]]
        for kind, name in (
            ("ttft", "time_to_first_token_seconds"),
            ("itl", "inter_token_latency_seconds"),
        )
    }
    stored = load(SWEEP)
    baseline = dataclasses.replace(
        stored, metadata={**stored.metadata, "server_bucket_bounds": bounds}
    )
    spec = spec_from_config({})
    objectives = objectives_from(baseline, spec.threshold("regression_factor"))
    busiest = baseline.busiest()[0]
    for kind, measured in (
        ("ttft", busiest.server_ttft_seconds),
        ("itl", busiest.server_itl_seconds),
    ):
        seconds = objectives[kind][0]["seconds"]
        below = [b for b in bounds[kind] if b < seconds]
        assert seconds in bounds[kind] and seconds >= 1.5 * measured.p99 > max(below)
    assert objectives["ttft"][0]["target"] == objectives["itl"][0]["target"] == 0.95
    assert objectives["errors"][0] == {"target": 0.999}
    derived = thresholds_from(baseline, spec.threshold("regression_factor"), spec.window_seconds)
    path = tmp_path / "inferwatch.yaml"
    text = config_text(baseline, SWEEP, Measurements(derived), {}, "base.yaml", objectives)
    path.write_text(text)
    config = load_config_file(path)
    assert config["backend"] == "vllm"
    slos = spec_from_config(config).slos  # the bounds pass generate's check for vLLM
    assert {o.kind: o.seconds for o in slos.groups[0].objectives} == {
        "ttft": objectives["ttft"][0]["seconds"],
        "itl": objectives["itl"][0]["seconds"],
        "errors": None,
    }
    # Without the server's bounds (a client-side sweep) only the errors objective is proposed.
    assert set(objectives_from(stored, 1.5)) == {"errors"}


def test_readings_under_normal_traffic_set_the_machine_dependent_thresholds() -> None:
    defaults = spec_from_config({})
    readings = NormalReadings(
        values={
            "ttft_p95": (0.02, 0.03),  # 2 x 0.03 = 0.06 s, under the default 2 s: kept
            "server_cpu_wait_share": (0.3, 0.5),  # odds 1, x4 -> 4 -> share 0.8
            "canary_ttft_gap": (0.08, 0.09),  # 2 x 0.09 = 0.18 s, above the default 0.1 s
            "itl_tail_share": (0.3,),  # 2 x 30 % >= half: no tail can be told apart
            "frontend_cpu": (0.8,),  # 1.25 x 0.8 = 1.0 core, above 0.9
        },
        seconds=30.0,
        absent={"itl_p95": "the sidecar's page had no series for it"},
    )
    sources = {n: f"the default {defaults.threshold(n):g}" for n in THRESHOLDS}
    found, why_not = thresholds_from_readings(readings, defaults.threshold, sources)
    assert found["server_cpu_wait_share"].value == pytest.approx(0.8)
    assert "waits 4 x as long per CPU second" in found["server_cpu_wait_share"].source
    assert found["client_gap_seconds"].value == pytest.approx(0.18)
    assert found["frontend_cpu_cores"].value == pytest.approx(1.0)
    assert found["ttft_p95_seconds"].value == 2.0  # measured: the healthy server is under it
    assert found["ttft_p95_seconds"].source.startswith("the default 2 kept, above 2 x 0.03 s")
    assert "regression_factor" not in found  # no latency threshold rose
    assert "no tail can be told from the normal" in why_not["itl_tail_share"]
    assert why_not["itl_p95_seconds"] == "the sidecar's page had no series for it"
    assert set(why_not) == {"itl_tail_share", "itl_p95_seconds", "itl_p99_seconds"}


def test_a_latency_read_above_the_sweeps_raises_the_regression_factor_with_it() -> None:
    spec = spec_from_config({"thresholds": {"ttft_p95_seconds": 0.01}})
    readings = NormalReadings({"ttft_p95": (0.01,)}, 10.0, {})
    found, _ = thresholds_from_readings(readings, spec.threshold, {})
    assert found["ttft_p95_seconds"].value == pytest.approx(0.02)
    assert found["regression_factor"].value == pytest.approx(3.0)  # 1.5 x 2
