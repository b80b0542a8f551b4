"""The generated rules: promtool checks and unit tests, contract, config, regenerate-and-diff."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from inferwatch.generate import artifacts
from inferwatch.heuristics import ALERTS, THRESHOLDS, recording_rules, seconds, spec_from_config
from inferwatch.settings import ConfigError

from conftest import alert_scenarios

REPO = Path(__file__).resolve().parents[1]
ALERTS_DIR = REPO / "alerts"
RULES = ALERTS_DIR / "inferwatch-rules.yaml"

# The alert contract of DESIGN.md.
CONTRACT = {
    "InferenceBackendDown",
    "InferenceQueuedWhileIdle",
    "InferenceQueueingDelay",
    "InferencePrefillBottleneck",
    "InferenceDecodeBottleneck",
    "InferenceDecodeAtHardwareFloor",
    "InferenceKVCachePressure",
    "InferencePrefillStallsDecode",
    "InferenceGPUUnderutilized",
    "InferenceFrontendCPUSaturated",
    "InferenceRequestErrors",
    "InferenceLatencyRegression",
    "InferenceGPUThrottling",
    "InferenceExporterGPUMissing",
}


def test_promtool_check_rules() -> None:
    out = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (
        f"SUCCESS: {len(recording_rules(spec_from_config({}))) + len(ALERTS)} rules found"
        in out.stdout
    )


def test_promtool_unit_tests() -> None:
    files = sorted(str(p.name) for p in (ALERTS_DIR / "tests").glob("*.yaml"))
    assert len(files) >= 6
    out = subprocess.run(
        ["promtool", "test", "rules", *files],
        cwd=ALERTS_DIR / "tests",
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS") == len(files)


def test_committed_artifacts_are_what_generate_writes() -> None:
    for relative, content in artifacts(spec_from_config({})).items():
        assert (REPO / relative).read_text() == content, f"{relative} is stale: run `make generate`"
    for name, content in alert_scenarios().render().items():
        assert (ALERTS_DIR / "tests" / name).read_text() == content, f"alerts/tests/{name} is stale"
    runbooks = {p.name for p in (ALERTS_DIR / "runbooks").glob("*.md")}
    assert runbooks == {f"{a}.md" for a in CONTRACT}, "a runbook without an alert (or the reverse)"


def test_every_contract_alert_is_complete() -> None:
    doc = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}
    assert set(alerts) == CONTRACT
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], name
        assert annotations["runbook_url"].endswith(f"alerts/runbooks/{name}.md"), name
        # The description quotes what was measured.
        assert "$value" in annotations["description"] or "query" in annotations["description"], name
        assert (ALERTS_DIR / "runbooks" / f"{name}.md").exists()


def test_recording_rules_follow_level_metric_operations() -> None:
    for rule in recording_rules(spec_from_config({})):
        assert re.fullmatch(r"(instance|model):inferwatch_[a-z_]+:[a-z0-9_]+", rule.record), (
            rule.record
        )


def test_every_alert_has_a_firing_scenario_and_a_near_miss() -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for path in (ALERTS_DIR / "tests").glob("*.yaml"):
        for group in yaml.safe_load(path.read_text())["tests"]:
            for check in group.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else silent).add(check["alertname"])
            # Realistic shapes: several replicas' histograms, not constants.
            assert any("_bucket{" in s["series"] for s in group["input_series"]), group["name"]
    assert fires == CONTRACT, CONTRACT - fires
    assert silent == CONTRACT, CONTRACT - silent


def test_rate_window_covers_four_scrapes_of_the_tests() -> None:
    spec = spec_from_config({})
    assert seconds(spec.timing.window) >= 4 * alert_scenarios().STEP
    assert seconds(spec.timing.window) >= 4 * 15  # Prometheus' default 15 s scrape


def test_thresholds_and_timing_come_from_the_config() -> None:
    spec = spec_from_config(
        {
            "thresholds": {"ttft_p95_seconds": 0.75},
            "alerting": {"rate_window": "2m", "for": {"InferencePrefillBottleneck": "30s"}},
        }
    )
    rules = yaml.safe_load(artifacts(spec)["alerts/inferwatch-rules.yaml"])
    prefill = next(
        r
        for g in rules["groups"]
        for r in g["rules"]
        if r.get("alert") == "InferencePrefillBottleneck"
    )
    assert "quantile_rate2m" in prefill["expr"] and "> 0.75" in prefill["expr"]
    assert prefill["for"] == "30s"
    assert (
        "| `ttft_p95_seconds` | 0.75 s |"
        in artifacts(spec)["alerts/runbooks/InferencePrefillBottleneck.md"]
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"thresholds": {"ttft_p95": 1}}, "unknown key 'ttft_p95'"),
        ({"thresholds": {"ttft_p95_seconds": "fast"}}, "is not a non-negative number"),
        ({"thresholds": {"ttft_p95_seconds": float("nan")}}, "is not a non-negative number"),
        ({"thresholds": {"error_ratio": float("inf")}}, "is not a non-negative number"),
        ({"alerting": {"rate_window": "5 minutes"}}, "is not a duration"),
        ({"alerting": {"for": {"InferenceFoo": "1m"}}}, "unknown key 'InferenceFoo'"),
        ({"alerting": {"windw": "1m"}}, "unknown key 'windw'"),
    ],
)
def test_bad_spec_config_names_the_problem(config: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        spec_from_config(config)


def generate(out: Path, config: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "inferwatch",
            "generate",
            "--out",
            str(out),
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
    )


def test_generate_cli(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("thresholds:\n  itl_p95_seconds: 0.05\n")
    out = generate(tmp_path, config)
    assert out.returncode == 0, out.stderr
    rules = (tmp_path / "alerts" / "inferwatch-rules.yaml").read_text()
    assert "<= 0.05" in rules
    config.write_text("thresholds:\n  itl_p95_secs: 0.05\n")
    bad = generate(tmp_path, config)
    assert bad.returncode == 2 and "unknown key 'itl_p95_secs'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_every_threshold_is_documented_and_used() -> None:
    used = {name for a in ALERTS.values() for name in a.thresholds()}
    for name, threshold in THRESHOLDS.items():
        assert threshold.why, name
        assert name in used, f"{name} is used by no alert"
