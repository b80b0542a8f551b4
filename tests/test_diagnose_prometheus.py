"""``diagnose --prometheus`` lists what Prometheus holds as firing, against a real Prometheus.

An alert fires for its ``for`` and is resolved an evaluation later than its condition stops
holding; a page that arrives in that gap must not meet "nothing holds". The rule file here
fires ``InferenceBackendDown`` on a constant (its real condition, a backend reporting down,
is absent), so only the ``ALERTS`` series can make diagnose list it.

The SLO cases run slo.py's own burn-rate alerts over its record names, the records set to
constants: an objective burns when its burn rates say so, and diagnose puts it, with the
findings of its model, before everything else.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from test_security import Pki, bcrypt_hash

from demo.stack import Prometheus
from inferwatch.method import slo
from inferwatch.method.alerts import ALERTS
from inferwatch.method.findings import Report
from inferwatch.method.recording import recording_rules
from inferwatch.method.spec import Spec, spec_from_config
from inferwatch.method.thresholds import MACHINE_DEPENDENT, THRESHOLDS
from inferwatch.tools import diagnose
from inferwatch.tools.report import evidence_text, report_json
from inferwatch.tools.report import render as report_text

SPEC = spec_from_config({})


def rules(path: Path) -> Path:
    group = {
        "name": "firing-without-its-condition",
        "interval": "1s",
        "rules": [
            # diagnose checks that the source runs inferwatch's recording rules.
            {
                "record": f"instance:inferwatch_requests_finished:{SPEC.rate_name}",
                "expr": "vector(1)",
            },
            {
                "alert": "InferenceBackendDown",
                "expr": 'label_replace(vector(1), "instance", "pod-a:10177", "", "")',
                "labels": {"severity": "critical", "phase": "any", "layer": "availability"},
            },
        ],
    }
    path.write_text(yaml.safe_dump({"groups": [group]}))
    return path


FIRING = 'ALERTS{alertstate="firing"}'


def diagnose_once(tmp_path: Path, rules_file: Path, spec: Spec, ready: str, count: int) -> Report:
    """``diagnose --prometheus`` under ``spec`` on a Prometheus with ``rules_file``, once
    ``ready`` returns ``count`` series (within a minute)."""
    prometheus = Prometheus(tmp_path, [], rule_files=[rules_file]).start()
    try:
        deadline = time.monotonic() + 60
        while len(prometheus.query(ready)) < count:
            assert time.monotonic() < deadline, f"the test rules never gave {count} x {ready}"
            time.sleep(0.5)
        return asyncio.run(diagnose.from_prometheus(prometheus.url, spec))
    finally:
        prometheus.stop()


def test_a_firing_alert_is_listed_even_when_its_condition_no_longer_holds(tmp_path: Path) -> None:
    report = diagnose_once(tmp_path, rules(tmp_path / "rules.yaml"), SPEC, FIRING, 1)
    (finding,) = report.findings
    assert finding.alert.name == "InferenceBackendDown"
    assert finding.labels == {"instance": "pod-a:10177"}
    assert (finding.firing, finding.holds) == (True, False)
    assert report.exit_code() == 4
    text = report_text(report)
    assert "CRITICAL InferenceBackendDown" in text
    assert "firing in Prometheus; its condition no longer holds now" in text
    assert "layer: availability" in text


PASSWORD = "pw-7d2f9c41e8"


def diagnose_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferwatch", "diagnose", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_diagnose_reaches_a_prometheus_behind_tls_and_basic_auth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prometheus' own --web.config.file: ``--user``, ``--password-file`` and ``--ca-file``
    are what diagnose sends and verifies with."""
    pki = Pki(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca_file))  # for the readiness wait only
    web_config = tmp_path / "web.yml"
    tls = {"cert_file": str(pki.cert_file), "key_file": str(pki.key_file)}
    users = {"alice": bcrypt_hash(PASSWORD)}
    web_config.write_text(yaml.safe_dump({"tls_server_config": tls, "basic_auth_users": users}))
    password = tmp_path / "password"
    password.write_text(PASSWORD + "\n")
    rule_file = rules(tmp_path / "rules.yaml")
    prometheus = Prometheus(tmp_path, [], rule_files=[rule_file], web_config=web_config).start()
    monkeypatch.delenv("SSL_CERT_FILE")  # diagnose trusts what --ca-file names, no more
    access = ["--user", "alice", "--password-file", str(password), "--ca-file", str(pki.ca_file)]
    try:
        deadline = time.monotonic() + 60
        while (
            "CRITICAL InferenceBackendDown"
            not in (got := diagnose_cli("--prometheus", prometheus.url, *access)).stdout
        ):
            assert time.monotonic() < deadline, got.stdout + got.stderr
            time.sleep(0.5)
        assert got.returncode == 4, got.stderr
        without = diagnose_cli("--prometheus", prometheus.url, "--ca-file", str(pki.ca_file))
        wrong = tmp_path / "wrong"
        wrong.write_text("not-it\n")
        guessed = diagnose_cli(
            *access, "--prometheus", prometheus.url, "--password-file", str(wrong)
        )
        untrusted = diagnose_cli("--prometheus", prometheus.url, *access[:4])
    finally:
        prometheus.stop()
    for refused in (without, guessed):
        assert refused.returncode == diagnose.EXIT_UNREADABLE
        [line] = refused.stderr.splitlines()
        assert line.startswith("inferwatch: error: HTTP 401 from ") and line.endswith(
            "(give --user and --password-file)"
        ), line
    assert untrusted.returncode == diagnose.EXIT_UNREADABLE
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr or "certificate" in untrusted.stderr
    for got in (without, guessed, untrusted):
        assert PASSWORD not in got.stderr + got.stdout


# --- SLOs ---------------------------------------------------------------------------------

# Calibrated (every machine-dependent threshold set, at its default): the cause alerts at
# their own severities.
SLO_SPEC = spec_from_config(
    {
        "slos": {
            "objectives": {"ttft": {"target": 0.99, "seconds": 1}, "errors": {"target": 0.999}}
        },
        "thresholds": {n: THRESHOLDS[n].default for n in MACHINE_DEPENDENT},
    }
)
TINY = {"namespace": "prod", "backend": "vllm", "model": "tiny"}
OTHER = {"namespace": "prod", "backend": "vllm", "model": "other"}
# TTFT of tiny over 28 days: 15x over 1h and 20x over 5m is past the page's 13.4x; 2x over 1d
# and 0.8x over 3d are short of the ticket's 2.8x and 0.933x.
BURNING = {"5m": 20, "30m": 8, "1h": 15, "2h": 4, "6h": 6, "1d": 2, "3d": 0.8}
CALM = dict.fromkeys(slo.WINDOWS, 0.5)


def constant(value: float, labels: dict[str, str]) -> str:
    expr = f"vector({value})"
    for name, label in labels.items():
        expr = f'label_replace({expr}, "{name}", "{label}", "", "")'
    return expr


def slo_rules(path: Path, ttft_of_tiny: dict[str, float], causes: list[tuple]) -> Path:
    """slo.py's burn-rate alerts over its records (burn rates: ``ttft_of_tiny`` for tiny's
    TTFT, calm elsewhere), and ``causes`` (alert, labels) firing on a constant."""
    records = []
    for rule in slo.recording_rules(SLO_SPEC.slos, SLO_SPEC.fleet_labels):
        window = rule.record.rpartition(":burnrate")[2]
        if window in slo.WINDOWS:
            tiny = ttft_of_tiny[window] if rule.slo == "ttft" else CALM[window]
            expr = f"{constant(tiny, TINY)} or {constant(CALM[window], OTHER)}"
        elif rule.record.endswith(":error_budget_remaining"):
            expr = f"{constant(0.72, TINY)} or {constant(0.99, OTHER)}"
        else:
            continue
        records.append({"record": rule.record, "expr": expr, "labels": {"slo": rule.slo}})
    alerts = [
        rule
        for rule in slo.alert_rules(SLO_SPEC.slos, lambda _: {}, SLO_SPEC.paging)
        if rule["alert"] in (slo.FAST, slo.SLOW)
    ]
    for name, labels in causes:
        alert = ALERTS[name]
        alerts.append(
            {
                "alert": name,
                "expr": constant(1, labels),
                "labels": {"severity": alert.severity, "phase": alert.phase, "layer": alert.layer},
            }
        )
    group = {
        "name": "slo-burns",
        "interval": "1s",
        "rules": [
            {
                "record": f"instance:inferwatch_requests_finished:{SPEC.rate_name}",
                "expr": "vector(1)",
            },
            *records,
            *alerts,
        ],
    }
    path.write_text(yaml.safe_dump({"groups": [group]}))
    return path


POD_A = {"instance": "pod-a:10177", "job": "inferwatch", **TINY}
POD_B = {"instance": "pod-b:10177", "job": "inferwatch", **OTHER}
CAUSES = [
    ("InferencePrefillBottleneck", TINY),
    ("InferenceBackendDown", POD_A),
    ("InferenceKVCachePressure", POD_B),
    # No model label: nothing says it is tiny's, it stays with the rest.
    ("InferenceGPUThrottling", {"instance": "pod-c:10177", "gpu": "0"}),
]


def test_a_burning_slo_comes_first_with_the_causes_of_its_model_under_it(
    tmp_path: Path,
) -> None:
    rules_file = slo_rules(tmp_path / "rules.yaml", BURNING, CAUSES)
    report = diagnose_once(tmp_path, rules_file, SLO_SPEC, FIRING, 5)
    (burn,) = report.burns
    assert (burn.kind, burn.labels, burn.alerts) == ("ttft", TINY, [slo.FAST])
    assert burn.burn_rates == {"1h": 15, "6h": 6, "1d": 2, "3d": 0.8}
    assert burn.budget_remaining == 0.72
    text = report_text(report)
    assert text.startswith(
        f"inferwatch diagnose: {report.source} (window 5m)\n"
        "judged with the built-in defaults\n"
        "\n"
        "SLO burning: backend=vllm model=tiny namespace=prod\n"
        "CRITICAL InferenceSLOFastBurn  ttft (time to first token)\n"
        "         burn rate 15x over 1h, 6x over 6h, 2x over 1d, 0.8x over 3d; "
        "error budget remaining 72 %\n"
        "         runbook: alerts/runbooks/InferenceSLOFastBurn.md\n"
        "  causes, most likely first:\n"
        "  CRITICAL InferenceBackendDown  any / availability  backend=vllm instance=pod-a:10177 "
        "job=inferwatch model=tiny namespace=prod\n"
    ), text
    # Then the next cause of tiny, then what is not about tiny, after the phase: as ever.
    order = [
        "  CRITICAL InferenceBackendDown",
        "  WARNING  InferencePrefillBottleneck  prefill / compute  backend=vllm model=tiny",
        "\nphase: ",
        "\nWARNING  InferenceGPUThrottling  any / compute  gpu=0 instance=pod-c:10177",
        "\nWARNING  InferenceKVCachePressure  decode / memory  backend=vllm instance=pod-b:10177",
    ]
    assert [text.index(line) for line in order] == sorted(text.index(line) for line in order)
    assert all(text.count(f"{name}  ") == 1 for name, _ in CAUSES)  # each finding once
    assert report.exit_code() == 4
    (section,) = report_json(report)["slos"]
    assert section == {
        "labels": TINY,
        "objectives": [
            {
                "slo": "ttft",
                "severity": "critical",
                "alerts": [slo.FAST],
                "burn_rates": {"1h": 15, "6h": 6, "1d": 2, "3d": 0.8},
                "error_budget_remaining": 0.72,
                "runbook": "alerts/runbooks/InferenceSLOFastBurn.md",
            }
        ],
        "causes": [
            {"alert": "InferenceBackendDown", "labels": POD_A},
            {"alert": "InferencePrefillBottleneck", "labels": TINY},
        ],
    }


def test_without_a_burning_slo_the_output_is_as_before(tmp_path: Path) -> None:
    rules_file = slo_rules(tmp_path / "rules.yaml", CALM, CAUSES[:1])
    report = diagnose_once(tmp_path, rules_file, SLO_SPEC, FIRING, 1)
    assert report.burns == []
    evidence = "; ".join(
        evidence_text(f.alert, c, v, SLO_SPEC) for f in report.findings for c, v in f.evidence
    )
    assert report_text(report) == (
        f"inferwatch diagnose: {report.source} (window 5m)\n"
        "judged with the built-in defaults\n"
        "\n"
        "phase: neither (latency within thresholds)  (TTFT p95 n/a <= 2 s; ITL p95 n/a <= 100 ms)\n"
        "layer: compute\n"
        "\n"
        "WARNING  InferencePrefillBottleneck  prefill / compute  backend=vllm model=tiny "
        "namespace=prod\n"
        f"         {evidence}\n"
        "         firing in Prometheus; its condition no longer holds now\n"
        "         runbook: alerts/runbooks/InferencePrefillBottleneck.md"  # no instance
    )
    assert report.exit_code() == 3
    assert report_json(report)["slos"] == []


FLEET_SPEC = spec_from_config({"alerting": {"rate_window": "10s"}})


def fleet_rules(path: Path) -> Path:
    """Two replicas of tiny, A holding nine times B's requests with a queue, and a router
    whose requests to B fail nine in ten while its health check passes B, and whose health
    check fails C, whose server answers its sidecar (read on loopback, as in a pod); counters
    grow by ``time()`` (1/s) so that their rates are constant from the second evaluation."""
    replica = {"backend": "vllm", "model": "tiny", "namespace": "prod", "job": "inferwatch"}
    a, b = {"instance": "a:10177", **replica}, {"instance": "b:10177", **replica}
    router = {"instance": "r:10177", "backend": "vllm-router", "model": "unknown"}
    to_a, to_b = {**router, "worker": "http://a:8000"}, {**router, "worker": "http://b:8000"}
    to_c = {**router, "worker": "http://c:8000"}
    c = {"instance": "c:10177", "job": "inferwatch", "backend": "vllm"}
    c_info = {**c, "model": "tiny", "version": "0.32.0", "server": "http://127.0.0.1:8000"}
    version = {"version": "0.32.0"}

    def grows(per_second: float, labels: dict[str, str]) -> str:
        return constant(per_second, labels).replace(
            f"vector({per_second})", f"vector({per_second} * time())"
        )

    records = [
        ("inferwatch_requests_running", constant(12, a), constant(2, b)),
        ("inferwatch_requests_waiting", constant(6, a), constant(0, b)),
        ("inferwatch_router_worker_requests_total", grows(1, to_a), grows(1, to_b)),
        ("inferwatch_router_worker_successes_total", grows(1, to_a), grows(0.1, to_b)),
        ("inferwatch_router_worker_failures_total", grows(0, to_a), grows(0.9, to_b)),
        ("inferwatch_router_worker_healthy", constant(1, to_a), constant(1, to_b)),
        ("inferwatch_router_worker_circuit_state", constant(0, to_a), constant(0, to_b)),
    ]
    group = {
        "name": "fleet",
        "interval": "1s",
        "rules": [
            {
                "record": f"instance:inferwatch_requests_finished:{FLEET_SPEC.rate_name}",
                "expr": "vector(1)",
            },
            *({"record": name, "expr": f"{x} or {y}"} for name, x, y in records),
            *(
                {"record": name, "expr": expr}
                for name, expr in (
                    ("inferwatch_router_worker_healthy", constant(0, to_c)),
                    ("inferwatch_router_worker_circuit_state", constant(0, to_c)),
                    (
                        "inferwatch_backend_info",
                        " or ".join(constant(1, i) for i in (c_info, a | version, b | version)),
                    ),
                    ("inferwatch_backend_up", constant(1, c)),
                )
            ),
        ],
    }
    path.write_text(yaml.safe_dump({"groups": [group]}))
    return path


def test_the_fleet_view_names_the_hot_replica_and_the_worker_the_router_fails(
    tmp_path: Path,
) -> None:
    full = "rate(inferwatch_router_worker_requests_total[10s]) > 0.95"  # the window filled
    report = diagnose_once(tmp_path, fleet_rules(tmp_path / "rules.yaml"), FLEET_SPEC, full, 2)
    assert report.fleet
    (model,) = report.fleet.models
    hot, cold = model.replicas
    assert model.labels == {"namespace": "prod", "backend": "vllm", "model": "tiny"}
    assert model.causes == ()
    assert (hot.labels["instance"], hot.in_flight, hot.waiting) == ("a:10177", 18, 6)
    assert hot.share == pytest.approx(0.9)
    assert [a.name for a in hot.causes] == ["InferenceReplicaImbalance"]
    assert (cold.labels["instance"], cold.causes) == ("b:10177", ())
    (router,) = report.fleet.routers
    healthy, failing, excluded = router.workers
    assert (router.labels["instance"], router.causes) == ("r:10177", ())
    assert (healthy.worker, healthy.causes) == ("http://a:8000", ())
    assert failing.worker == "http://b:8000"
    assert failing.readings["router_worker_failure_share"] == pytest.approx(0.9)
    assert [a.name for a in failing.causes] == ["InferenceRouterFailingWorker"]
    assert excluded.worker == "http://c:8000"
    assert [a.name for a in excluded.causes] == ["InferenceRouterExcludesLiveWorker"]
    # The finding's evidence is its worker's, not the first worker's of the same router.
    (found,) = [f for f in report.findings if f.labels.get("worker") == failing.worker]
    assert found.evidence[0][1] == pytest.approx(0.9)
    text = report_text(report)
    print(text)
    assert "fleet: backend=vllm model=tiny namespace=prod  2 replicas, 20 in flight" in text
    assert (
        "  instance=a:10177  18 in flight (90 %), 6 waiting  InferenceReplicaImbalance (scheduling)"
    ) in text
    assert "  instance=b:10177  2 in flight (10 %), 0 waiting\n" in text
    assert (
        "  http://b:8000  1 requests/s, 90 % failed, health check passes, circuit closed  "
        "InferenceRouterFailingWorker (availability)"
    ) in text
    assert (
        "  http://c:8000  n/a requests/s, n/a failed, health check fails it, circuit closed  "
        "InferenceRouterExcludesLiveWorker (scheduling)"
    ) in text
    doc = report_json(report)["fleet"]
    assert doc["models"][0]["replicas"][0]["causes"] == ["InferenceReplicaImbalance"]
    assert doc["routers"][0]["workers"][1]["router_worker_failure_share"] == pytest.approx(0.9)


def pool_rules(path: Path) -> Path:
    """A disaggregated tiny: prefill A and B finish 1.9 requests/s each of the 2 their
    baselines carry, decode C finishes 3.8 of 10; the generated rules record the pools."""
    pod = {"backend": "vllm", "model": "tiny", "namespace": "prod", "job": "inferwatch"}
    replicas = (("a:10177", "prefill", 1.9, 2), ("b:10177", "prefill", 1.9, 2))
    replicas += (("c:10177", "decode", 3.8, 10),)

    def each(value: Callable[[tuple], float], role: bool = False) -> str:
        """One series per replica, its role a label where ``role``."""
        return " or ".join(
            constant(value(r), {"instance": r[0], **pod} | ({"role": r[1]} if role else {}))
            for r in replicas
        )

    rules = [
        {
            "record": f"instance:inferwatch_requests_finished:{FLEET_SPEC.rate_name}",
            "expr": each(lambda r: r[2]),
        },
        {
            "record": "inferwatch_baseline_capacity_requests_per_second",
            "expr": each(lambda r: r[3]),
        },
        {"record": "inferwatch_backend_info", "expr": each(lambda r: 1, role=True)},
        *(
            {"record": r.record, "expr": r.expr}
            for r in recording_rules(FLEET_SPEC)
            if r.record.startswith("role:")
        ),
    ]
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "pools", "interval": "1s", "rules": rules}]})
    )
    return path


def test_diagnose_names_the_full_pool_of_a_disaggregated_model(tmp_path: Path) -> None:
    pools = f"role:inferwatch_requests_finished:capacity_share_{FLEET_SPEC.rate_name}"
    report = diagnose_once(tmp_path, pool_rules(tmp_path / "rules.yaml"), FLEET_SPEC, pools, 2)
    (found,) = [f for f in report.findings if f.alert.name == "InferencePrefillDecodeImbalance"]
    assert found.labels["role"] == "prefill"
    assert [round(value, 3) for _, value in found.evidence] == [0.95, 0.38]
    text = report_text(report)
    print(text)
    assert "InferencePrefillDecodeImbalance" in text and "role=prefill" in text
