"""The generated rules: promtool checks and unit tests, contract, config, regenerate-and-diff,
the generated files marked in .gitattributes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from inferwatch.method.alerts import ALERTS
from inferwatch.method.recording import recording_rules
from inferwatch.method.rules import slo_rules
from inferwatch.method.runbooks import templates
from inferwatch.method.signals import INSTANCE
from inferwatch.method.slo import ALERT_NAMES as SLO_ALERTS
from inferwatch.method.spec import seconds, spec_from_config
from inferwatch.method.thresholds import THRESHOLDS
from inferwatch.settings import ConfigError
from inferwatch.tools.generate import artifacts

from conftest import alert_scenarios

REPO = Path(__file__).resolve().parents[1]
ALERTS_DIR = REPO / "alerts"
RULES = ALERTS_DIR / "inferwatch-rules.yaml"

# The alert contract: the committed snapshot `make generate` writes (alerts/contract.txt),
# so that adding, renaming or removing an alert shows in its diff. The cause alerts:
CONTRACT = {
    line
    for line in (ALERTS_DIR / "contract.txt").read_text().splitlines()
    if line and not line.startswith("#")
} - set(SLO_ALERTS)
# The SLO alerts (an `errors` objective by default: no latency objective to be unmeasured).
DEFAULT_SLO_ALERTS = {"InferenceSLOFastBurn", "InferenceSLOSlowBurn"}


def test_promtool_check_rules() -> None:
    out = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    spec = spec_from_config({})
    count = len(recording_rules(spec)) + len(ALERTS) + len(slo_rules(spec))
    assert f"SUCCESS: {count} rules found" in out.stdout


PROMTOOL_TESTS = sorted(p.name for p in (ALERTS_DIR / "tests").glob("*.yaml"))


def test_promtool_unit_test_files_are_the_scenarios_files() -> None:
    """Every test file on disk is one the scenarios write (none left over from a removed
    layer), and every layer's alerts are tested in one."""
    written = sorted(n for n in alert_scenarios().render() if "/" not in n)
    assert written == PROMTOOL_TESTS
    tested = {a for s in alert_scenarios().files().values() for x in s for a in x.fires}
    assert set(ALERTS) <= tested, sorted(set(ALERTS) - tested)


# The SLO scenarios replay hours of series at 1 min steps for the burn-rate windows (~1 min
# of promtool on 2 cores): marked slow, so `make test` runs them and `make check` does not.
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.slow) if n.startswith("slos-") else n
        for n in PROMTOOL_TESTS
    ],
)
def test_promtool_unit_tests(name: str) -> None:
    out = subprocess.run(
        ["promtool", "test", "rules", name],
        cwd=ALERTS_DIR / "tests",
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS") == 1


def generated() -> dict[str, str]:
    """Relative path -> content of every file `make generate` writes whole (the docs' regions
    are parts of hand-written pages)."""
    tests = {f"alerts/tests/{name}": text for name, text in alert_scenarios().render().items()}
    return {**artifacts(spec_from_config({})), **tests}


def test_committed_artifacts_are_what_generate_writes() -> None:
    for relative, content in generated().items():
        assert (REPO / relative).read_text() == content, f"{relative} is stale: run `make generate`"
    runbooks = {p.name for p in (ALERTS_DIR / "runbooks").glob("*.md")}
    assert runbooks == {f"{a}.md" for a in CONTRACT | set(SLO_ALERTS)}, (
        "a runbook without an alert (or the reverse)"
    )


def test_every_generated_file_is_marked_generated_in_gitattributes() -> None:
    """linguist-generated (GitHub folds the diff), never -diff: reviewers still read it."""
    out = subprocess.run(
        ["git", "check-attr", "linguist-generated", "diff", "--", *generated()],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    attributes = {tuple(line.rsplit(": ", 2)) for line in out.stdout.splitlines()}
    unmarked = sorted(
        p for p, name, value in attributes if name == "linguist-generated" and value != "true"
    )
    assert not unmarked, f"mark them linguist-generated in .gitattributes: {unmarked}"
    hidden = sorted(p for p, name, value in attributes if name == "diff" and value != "unspecified")
    assert not hidden, f"-diff hides them from reviewers: {hidden}"


def test_the_contract_is_the_alert_table() -> None:
    assert set(ALERTS) == CONTRACT, "run `make generate`: alerts/contract.txt is stale"
    # Every runbook template belongs to an alert (the package ships them: package-data).
    assert set(templates()) == CONTRACT | set(SLO_ALERTS)


def test_every_contract_alert_is_complete() -> None:
    doc = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}
    assert set(alerts) == CONTRACT | DEFAULT_SLO_ALERTS
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], name
        # The sidecar's own page for an alert of one instance; no host to link for the others.
        if name in ALERTS and ALERTS[name].level == INSTANCE:
            url = annotations["runbook_url"]
            assert url == f"http://{{{{ $labels.instance }}}}/runbooks/{name}", name
        else:
            assert "runbook_url" not in annotations, name
        # The description quotes what was measured.
        assert "$value" in annotations["description"] or "query" in annotations["description"], name
        assert (ALERTS_DIR / "runbooks" / f"{name}.md").exists()


def test_recording_rules_follow_level_metric_operations() -> None:
    config = yaml.safe_load((ALERTS_DIR / "slos.example.yaml").read_text())
    spec = spec_from_config(config)
    records = [r.record for r in recording_rules(spec)]
    records += [r["record"] for r in slo_rules(spec) if "record" in r]
    assert any(r == "model:inferwatch_slo_ttft:burnrate1h" for r in records)
    for record in records:
        assert re.fullmatch(r"(instance|model|role):inferwatch_[a-z0-9_]+:[a-z0-9_]+", record), (
            record
        )


def test_every_alert_has_a_firing_scenario_and_a_near_miss() -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for path in (ALERTS_DIR / "tests").glob("*.yaml"):
        for group in yaml.safe_load(path.read_text())["tests"]:
            for check in group.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else silent).add(check["alertname"])
            for check in group.get("promql_expr_test", []):
                # ALERTS{alertname="X",alertstate="firing"}: what fires at that time, or nothing
                found = re.fullmatch(
                    r'ALERTS\{alertname="(\w+)",alertstate="firing"\}', check["expr"]
                )
                if found:
                    (fires if check["exp_samples"] else silent).add(found.group(1))
            # Realistic shapes: several replicas' histograms, not constants.
            assert any("_bucket{" in s["series"] for s in group["input_series"]), group["name"]
    assert fires == CONTRACT | set(SLO_ALERTS), CONTRACT - fires
    assert silent == CONTRACT | set(SLO_ALERTS), CONTRACT - silent


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


inf, nan = float("inf"), float("nan")


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
        ({"alerting": {"paging": "never"}}, "is not one of slo, causes"),
        ({"slos": {"objectives": {"tft": {"target": 0.99}}}}, "unknown objective 'tft'"),
        ({"slos": {"objectives": {"errors": {"target": 99}}}}, "not a share between 0 and 1"),
        ({"slos": {"objectives": {"errors": {"target": 0.9}}}}, "use at least 0.9256"),
        ({"slos": {"objectives": {"ttft": {"target": 0.99}}}}, "ttft.seconds: None is not"),
        ({"slos": {"objectives": {"errors": {"target": 0.99, "seconds": 1}}}}, "'seconds'"),
        ({"slos": {"window": "1d"}}, "of 3d or more"),
        # A server whose buckets inferwatch does not know still gets no NaN or infinite bound.
        (
            {"backend": "tgi", "slos": {"objectives": {"e2e": {"target": 0.99, "seconds": inf}}}},
            "e2e.seconds: inf is not a positive number",
        ),
        (
            {"backend": "tgi", "slos": {"objectives": {"e2e": {"target": 0.99, "seconds": nan}}}},
            "e2e.seconds: nan is not a positive number",
        ),
        ({"slos": {"objectives": {"errors": {"target": nan}}}}, "not a share between 0 and 1"),
        ({"slos": {"scope": "pod"}}, "not one of model, instance"),
        ({"slos": {"models": ["a"]}}, "slos.models: expected a mapping"),
        (
            {"backend": "vllm", "slos": {"objectives": {"ttft": {"target": 0.99, "seconds": 0.3}}}},
            r"slos.objectives.ttft.seconds: 0.3 is not a bucket bound of the server's time to "
            r"first token histogram; bounds vllm: 0.001 0.005 0.01 0.02 0.04 0.06 0.08 0.1 0.25 "
            r"0.5 ",
        ),
        (
            {"slos": {"objectives": {"e2e": {"target": 0.99, "seconds": 2.5}}}},
            r"\(set `backend:` to check one server's\); bounds sglang: .* \| 5 10 20 40 ",
        ),
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


def test_slo_objectives_per_model_and_scope() -> None:
    """Each model group gets its own matcher, so two objectives never judge one series."""
    spec = spec_from_config(yaml.safe_load((ALERTS_DIR / "slos.example.yaml").read_text()))
    ttft = [r for r in slo_rules(spec) if r.get("record") == "model:inferwatch_slo_ttft:burnrate1h"]
    assert len(ttft) == 2
    assert "model!~`llama\\-3\\-70b`" in ttft[0]["expr"] and "le=~`0\\.5`" in ttft[0]["expr"]
    assert "model=`llama-3-70b`" in ttft[1]["expr"] and "le=~`2\\.5`" in ttft[1]["expr"]
    assert "by (namespace, backend, model)" in ttft[0]["expr"]
    pods = spec_from_config({"slos": {"scope": "instance"}})
    errors = [r for r in slo_rules(pods) if r.get("record", "").endswith(":burnrate1h")]
    assert [r["record"] for r in errors] == ["instance:inferwatch_slo_errors:burnrate1h"]
    assert "reason=`error`" in errors[0]["expr"]
    # Over a raw window the errors objective reads the finished requests once, by reason.
    hour = [r for r in slo_rules(pods) if r.get("record", "").endswith("_finished:rate1h")]
    assert [r["record"] for r in hour] == ["instance:inferwatch_slo_errors_finished:rate1h"]
    assert hour[0]["expr"].startswith("sum without (engine) (rate(inferwatch_requests_finished")
    # Windows past an hour add up the recorded 5m rates instead of reading raw samples.
    day = [r for r in slo_rules(pods) if r.get("record", "").endswith(":burnrate1d")]
    assert day[0]["expr"].startswith("sum_over_time(instance:inferwatch_slo_errors_bad_events")
    assert not slo_rules(spec_from_config({"slos": {"objectives": {}}}))


def test_cause_alerts_page_only_without_slos() -> None:
    severities = {
        paging: {
            r["alert"]: r["labels"]["severity"]
            for g in rules_doc(spec_from_config({"alerting": {"paging": paging}}))
            for r in g["rules"]
            if "alert" in r
        }
        for paging in ("slo", "causes")
    }
    assert severities["slo"]["InferenceRequestErrors"] == "warning"
    assert severities["slo"]["InferenceSLOFastBurn"] == "critical"
    assert severities["slo"]["InferenceBackendDown"] == "critical"
    assert severities["slo"]["InferenceCanaryFailing"] == "critical"  # users' requests fail
    assert severities["causes"]["InferenceRequestErrors"] == "critical"
    assert severities["causes"]["InferenceSLOFastBurn"] == "warning"


def rules_doc(spec) -> list[dict]:
    return yaml.safe_load(artifacts(spec)["alerts/inferwatch-rules.yaml"])["groups"]


def test_every_threshold_is_documented_and_used() -> None:
    used = {name for a in ALERTS.values() for name in a.thresholds()}
    for name, threshold in THRESHOLDS.items():
        assert threshold.why, name
        assert name in used, f"{name} is used by no alert"
