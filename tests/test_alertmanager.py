"""The Alertmanager example against a real Alertmanager: routing and the method's inhibitions."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from demo.scenarios import alertmanager_config
from demo.stack import Alertmanager, WebhookReceiver

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "alerts" / "alertmanager.example.yml"
# Where each severity goes: a page, a ticket, a channel.
RECEIVER = {"critical": "page", "warning": "ticket", "info": "info"}


def test_amtool_accepts_the_example() -> None:
    out = subprocess.run(["amtool", "check-config", str(EXAMPLE)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _generated_alerts() -> list[dict]:
    """Every alert rule the committed rules and the SLO example's rules hold."""
    rules = []
    for path in (REPO / "alerts" / "inferwatch-rules.yaml", *REPO.glob("alerts/tests/rules/*")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules += [r for r in group["rules"] if "alert" in r]
    return rules


@pytest.mark.parametrize(
    "rule", _generated_alerts(), ids=lambda r: f"{r['alert']}-{r['labels'].get('slo', '')}"
)
def test_every_alert_reaches_the_receiver_of_its_severity(rule: dict) -> None:
    """`amtool config routes test` for each alert: a routing change cannot orphan one."""
    labels = {**rule["labels"], "alertname": rule["alert"]}
    labels |= {"instance": "10.0.0.1:9477", "namespace": "prod", "backend": "vllm", "model": "m"}
    out = subprocess.run(
        [
            "amtool",
            "config",
            "routes",
            "test",
            f"--config.file={EXAMPLE}",
            "--tree",
            f"--verify.receivers={RECEIVER[labels['severity']]}",
            *(f"{k}={v}" for k, v in labels.items()),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    if rule["alert"] == "InferenceBackendDown":  # its own route: one notification per pod
        assert '{alertname="InferenceBackendDown",severity="critical"}' in out.stdout


@pytest.fixture
def alertmanager(tmp_path: Path):
    """The example config with its webhooks pointed at a local receiver and 1 s waits."""
    receiver = WebhookReceiver().start()
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(alertmanager_config(EXAMPLE, receiver.url)))
    am = Alertmanager(tmp_path, path).start()
    yield am, receiver
    am.stop()
    receiver.stop()


def post(am: Alertmanager, *alerts: dict[str, str]) -> None:
    body = json.dumps([{"labels": labels} for labels in alerts]).encode()
    request = urllib.request.Request(
        f"{am.url}/api/v2/alerts", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        assert resp.status == 200


def received(receiver: WebhookReceiver, expected: set[str], timeout: float = 20.0) -> set[str]:
    """Alert names delivered once ``expected`` arrived (plus 3 s for anything extra)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        names = {a["labels"]["alertname"] for _, a in receiver.firing()}
        if expected <= names:
            time.sleep(3)
            return {a["labels"]["alertname"] for _, a in receiver.firing()}
        time.sleep(0.2)
    return {a["labels"]["alertname"] for _, a in receiver.firing()}


def test_queued_while_idle_inhibits_queueing_delay_of_the_same_model(alertmanager) -> None:
    am, receiver = alertmanager
    post(
        am,
        {
            "alertname": "InferenceQueuedWhileIdle",
            "severity": "warning",
            "model": "m",
            "instance": "a",
        },
        {
            "alertname": "InferenceQueueingDelay",
            "severity": "warning",
            "model": "m",
            "backend": "vllm",
        },
        {
            "alertname": "InferenceQueueingDelay",
            "severity": "warning",
            "model": "other",
            "backend": "vllm",
        },
    )
    got = received(receiver, {"InferenceQueuedWhileIdle", "InferenceQueueingDelay"})
    delivered = [(a["labels"]["alertname"], a["labels"]["model"]) for _, a in receiver.firing()]
    assert got == {"InferenceQueuedWhileIdle", "InferenceQueueingDelay"}
    assert ("InferenceQueueingDelay", "m") not in delivered  # inhibited
    assert ("InferenceQueueingDelay", "other") in delivered  # another model: not inhibited


def test_backend_down_inhibits_the_latency_alerts_of_its_pod(alertmanager) -> None:
    am, receiver = alertmanager
    post(
        am,
        {
            "alertname": "InferenceBackendDown",
            "severity": "critical",
            "instance": "a",
            "backend": "vllm",
        },
        {
            "alertname": "InferencePrefillBottleneck",
            "severity": "warning",
            "instance": "a",
            "model": "m",
        },
        {
            "alertname": "InferencePrefillBottleneck",
            "severity": "warning",
            "instance": "b",
            "model": "m",
        },
    )
    received(receiver, {"InferenceBackendDown", "InferencePrefillBottleneck"})
    delivered = {(a["labels"]["alertname"], a["labels"]["instance"]) for _, a in receiver.firing()}
    assert delivered == {("InferenceBackendDown", "a"), ("InferencePrefillBottleneck", "b")}


def test_routing_by_severity(alertmanager) -> None:
    am, receiver = alertmanager
    post(
        am,
        {"alertname": "InferenceSLOFastBurn", "severity": "critical", "slo": "ttft", "model": "m"},
        # The page for the same objective inhibits its ticket; another objective's stays.
        {"alertname": "InferenceSLOSlowBurn", "severity": "warning", "slo": "ttft", "model": "m"},
        {"alertname": "InferenceSLOSlowBurn", "severity": "warning", "slo": "itl", "model": "m"},
        {
            "alertname": "InferenceDecodeAtHardwareFloor",
            "severity": "info",
            "instance": "a",
            "model": "m",
        },
        {
            "alertname": "InferenceKVCachePressure",
            "severity": "warning",
            "instance": "a",
            "model": "m",
        },
    )
    received(
        receiver,
        {
            "InferenceSLOFastBurn",
            "InferenceSLOSlowBurn",
            "InferenceDecodeAtHardwareFloor",
            "InferenceKVCachePressure",
        },
    )
    slow = {
        a["labels"]["slo"]
        for _, a in receiver.firing()
        if a["labels"]["alertname"].endswith("SlowBurn")
    }
    assert slow == {"itl"}
    routes: dict[str, set[str]] = {}
    for _, body in receiver.notifications:  # one notification per group
        routes.setdefault(body["receiver"], set()).update(
            a["labels"]["alertname"] for a in body["alerts"]
        )
    assert routes == {
        "page": {"InferenceSLOFastBurn"},
        "info": {"InferenceDecodeAtHardwareFloor"},
        "ticket": {"InferenceKVCachePressure", "InferenceSLOSlowBurn"},
    }
