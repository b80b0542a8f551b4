"""The demo's fault scenarios as tests, on the real local stack.

vLLM (CPU) + inferwatch + Prometheus (the generated rules, demo/inferwatch.yaml timings) +
Alertmanager (the generated example config) + a webhook receiver. For each fault, the
intended alert must reach the receiver within its ``for`` plus two evaluation intervals of
Prometheus first seeing the condition (pending), no alert outside the scenario's expected
set may arrive, and everything clears before the next scenario. While the alert fires,
``inferwatch diagnose --prometheus`` must name the same cause first. Thresholds and fault
sizes come from ``inferwatch calibrate`` and measurements of the same vLLM at the start
(``demo/calibration.py``). The measured times from fault onset are printed (the README's
table comes from them); when the alert never comes, so does each of its conditions over the
scenario, as Prometheus evaluated them.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import pytest

from demo.scenarios import SCENARIOS, LocalStack, Outcome, Scenario, run_scenario, settle
from demo.stack import VllmServer
from inferwatch.method.slo import ALERT_NAMES as SLO_ALERTS
from inferwatch.method.slo import FAST as SLO_PAGE

pytestmark = pytest.mark.e2e

# Alertmanager's group_wait (1 s in the demo config) and the webhook's own delivery time.
NOTIFY_SLACK = 2.0


@pytest.fixture(scope="module")
def stack(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory):
    local = LocalStack(tmp_path_factory.mktemp("e2e"), vllm=vllm_server)
    components = []
    try:
        local.start()
        components = [local.prometheus, local.inferwatch, local.alertmanager]
        print("\n" + "\n".join(local.calibration.summary()))
        yield local
    finally:
        for component in components:
            component.stop()
        local.receiver.stop()  # the session's vLLM stays for other tests
    # Every process the stack started is gone (stopped by pid, SIGKILL after a grace period).
    for component in components:
        assert component.process.popen.poll() is not None, f"{component.process.name} survived"


async def first_pending(stack: LocalStack, alert: str, stop: asyncio.Event) -> float | None:
    """When Prometheus first evaluated the alert's condition as true (pending or firing)."""
    while not stop.is_set():
        names = {a["labels"]["alertname"] for a in await asyncio.to_thread(stack.prometheus_alerts)}
        if alert in names:
            return time.monotonic()
        await asyncio.sleep(0.25)
    return None


async def diagnose(stack: LocalStack) -> tuple[int, dict]:
    """``inferwatch diagnose --json`` against the stack's Prometheus, as a user runs it."""
    assert stack.prometheus is not None
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "inferwatch", "diagnose", "--prometheus", stack.prometheus.url,
        "--config", str(stack.calibration.config), "--json",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    return process.returncode, json.loads(out)


def _page(alert: dict, scenario: Scenario) -> bool:
    labels = alert["labels"]
    return labels["alertname"] == SLO_PAGE and labels.get("slo") == scenario.pages


def _delivered_pages(stack: LocalStack, scenario: Scenario) -> list[dict]:
    """The objective's page alerts as the page receiver got them."""
    return [
        alert
        for _, body in stack.receiver.notifications
        if body["receiver"] == "page"
        for alert in body["alerts"]
        if alert["labels"]["alertname"] == SLO_PAGE and alert["labels"].get("slo") == scenario.pages
    ]


def check_page(stack: LocalStack, scenario: Scenario, outcome: Outcome) -> None:
    """The objective's burn reached the page receiver, its description naming the cause."""
    pages = _delivered_pages(stack, scenario)
    if SLO_PAGE not in outcome.received or not pages:
        why = stack.explain_slo(scenario.pages, outcome.began_at, time.time())
        pytest.fail(f"no {scenario.pages} SLO page reached the page receiver\n{why}")
    took = outcome.page_latency
    print(f"\n{scenario.name}: {SLO_PAGE} ({scenario.pages}) paged {took:.1f} s after onset")
    # Prometheus renders the description at each evaluation: the cause alert is listed
    # while it fires (or is pending) for the same model. What on-call reads is the page as
    # delivered (the fault may be undone by now, its cause resolved), else a later rendering.
    deadline = time.monotonic() + 30
    while True:
        described = [a["annotations"]["description"] for a in _delivered_pages(stack, scenario)]
        described += [
            a["annotations"]["description"] for a in stack.prometheus_alerts() if _page(a, scenario)
        ]
        if any(scenario.expect in d for d in described) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert any(scenario.expect in d for d in described), described


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_fault_raises_its_alert_and_nothing_else(stack: LocalStack, scenario: Scenario) -> None:
    async def run() -> tuple:
        await settle(stack, timeout=240)
        if scenario.pages:  # no page under the load the objectives were calibrated for
            burning = [a["labels"] for a in stack.prometheus_alerts() if _page(a, scenario)]
            if burning:
                now = time.time()
                why = stack.explain_slo(scenario.pages, now - 600, now)
                raise AssertionError(f"the objective pages before the fault: {burning}\n{why}")
        stop = asyncio.Event()
        watch = asyncio.create_task(first_pending(stack, scenario.expect, stop))
        outcome = await run_scenario(
            stack, scenario, hold=5, timeout=240, on_alert=lambda: diagnose(stack)
        )
        stop.set()
        return outcome, await watch

    outcome, pending_at = asyncio.run(run())
    received = outcome.received
    if scenario.expect not in received:
        why = stack.explain(scenario.expect, outcome.began_at, time.time())
        pytest.fail(f"{scenario.expect} never reached Alertmanager: {received}\n{why}")
    unrelated = set(received) - {scenario.expect} - scenario.also_allowed - set(SLO_ALERTS)
    assert not unrelated, f"unrelated alerts fired: {unrelated}"
    if scenario.pages:
        check_page(stack, scenario, outcome)
    assert pending_at is not None
    budget = stack.for_seconds(scenario.expect) + 2 * stack.evaluation_seconds() + NOTIFY_SLACK
    took = received[scenario.expect] - pending_at
    print(
        f"\n{scenario.name}: {scenario.expect} received {outcome.latency:.1f} s after the fault "
        f"began ({took:.1f} s after Prometheus first saw the condition; budget {budget:g} s)"
    )
    assert took <= budget

    code, report = outcome.on_alert
    named = [f["alert"] for f in report["findings"]]
    print(f"diagnose (exit {code}): {', '.join(named)}")
    assert named[0] == scenario.expect
    # What Alertmanager inhibits (a dead backend's last latency window, say) diagnose lists
    # as explained by its cause; anything else must be expected.
    unexplained = {f["alert"] for f in report["findings"] if f["explained_by"] is None}
    assert not unexplained - {scenario.expect} - scenario.also_allowed - set(SLO_ALERTS)
    severities = {f["severity"] for f in report["findings"]}
    severities |= {o["severity"] for burn in report["slos"] for o in burn["objectives"]}
    assert code == (4 if "critical" in severities else 3)
