"""The Alertmanager example against a real Alertmanager: routing and the method's inhibitions."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Callable
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
    labels |= {"instance": "10.0.0.1:10177", "namespace": "prod", "backend": "vllm", "model": "m"}
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


# Seconds after which a wait gives up: a guard against a hang, not a bound on how fast
# Alertmanager must be (it takes about one 1 s group wait).
GIVE_UP = 120.0
# An alert of its own group, posted to show that Alertmanager has flushed the earlier groups.
MARKER = "InferwatchTestMarker"


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GIVE_UP
    while not condition():
        assert time.monotonic() < deadline, f"{what} never arrived"
        time.sleep(0.05)


def names(receiver: WebhookReceiver) -> set[str]:
    return {a["labels"]["alertname"] for _, a in receiver.firing()}


def delivered(am: Alertmanager, receiver: WebhookReceiver, expected: set[str]) -> list[dict]:
    """The firing alerts delivered, once ``expected`` arrived and nothing else can come.

    Every group of the test's alerts was made by one POST with the same 1 s group wait, so
    they flush together, inhibited ones included. The marker, posted once ``expected`` has
    arrived, makes a group after all of them and flushes a group wait later: when its
    notification arrives, Alertmanager has long run the flush of every earlier group, so an
    alert of theirs missing then was not sent (inhibited), rather than not sent yet.
    """
    wait_for(lambda: expected <= names(receiver), f"the notifications of {sorted(expected)}")
    post(am, {"alertname": MARKER, "severity": "info"})
    wait_for(lambda: MARKER in names(receiver), "the marker's notification")
    return [a for _, a in receiver.firing() if a["labels"]["alertname"] != MARKER]


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
    alerts = delivered(am, receiver, {"InferenceQueuedWhileIdle", "InferenceQueueingDelay"})
    sent = [(a["labels"]["alertname"], a["labels"]["model"]) for a in alerts]
    assert {name for name, _ in sent} == {"InferenceQueuedWhileIdle", "InferenceQueueingDelay"}
    assert ("InferenceQueueingDelay", "m") not in sent  # inhibited
    assert ("InferenceQueueingDelay", "other") in sent  # another model: not inhibited


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
    alerts = delivered(am, receiver, {"InferenceBackendDown", "InferencePrefillBottleneck"})
    sent = {(a["labels"]["alertname"], a["labels"]["instance"]) for a in alerts}
    assert sent == {("InferenceBackendDown", "a"), ("InferencePrefillBottleneck", "b")}


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
    alerts = delivered(
        am,
        receiver,
        {
            "InferenceSLOFastBurn",
            "InferenceSLOSlowBurn",
            "InferenceDecodeAtHardwareFloor",
            "InferenceKVCachePressure",
        },
    )
    slow = {a["labels"]["slo"] for a in alerts if a["labels"]["alertname"].endswith("SlowBurn")}
    assert slow == {"itl"}
    routes: dict[str, set[str]] = {}
    for _, body in receiver.notifications:  # one notification per group
        sent = {a["labels"]["alertname"] for a in body["alerts"]} - {MARKER}
        if sent:
            routes.setdefault(body["receiver"], set()).update(sent)
    assert routes == {
        "page": {"InferenceSLOFastBurn"},
        "info": {"InferenceDecodeAtHardwareFloor"},
        "ticket": {"InferenceKVCachePressure", "InferenceSLOSlowBurn"},
    }
