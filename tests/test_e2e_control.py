"""The healthy control: a calibrated stack of its own under normal traffic pages nobody.

Its own module, and so its own stack (``inferwatch calibrate`` again, on the session's vLLM):
the faults' SLO burns stay in their windows for half an hour and more, and ten minutes of
healthy traffic before the load ramp would fill the windows its page is judged over.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from demo.scenarios import LocalStack, normal_traffic, settle

from test_e2e import diagnose, diagnose_exporter, stack  # noqa: F401 (stack: the fixture)

pytestmark = pytest.mark.e2e

# The healthy control: normal traffic for this long pages nobody.
CONTROL_SECONDS = 600
# How often the control reads Prometheus' alerts and the verdict page.
CONTROL_EVERY = 10.0


def above_info(severity: str) -> bool:
    return severity not in ("info", "none")


def test_a_healthy_server_raises_nothing_above_info_for_ten_minutes(stack: LocalStack) -> None:  # noqa: F811
    """The calibrated normal traffic for :data:`CONTROL_SECONDS`: no alert above info fires
    in Prometheus or reaches Alertmanager's receivers, the verdict page lists none held for
    its alert's ``for`` at any read (one may be pending, as in Prometheus, and says so), and
    neither ``diagnose`` (with the calibrated config, and the exporter alone) names one at
    the end."""

    pending: list[str] = []

    async def run() -> tuple[list[str], list[str], tuple[int, dict], dict]:
        await settle(stack, timeout=240)
        already = len(stack.receiver.notifications)
        stop = asyncio.Event()
        traffic = asyncio.create_task(normal_traffic(stack, stop))
        seen: list[str] = []
        began = time.monotonic()
        try:
            async with aiohttp.ClientSession() as session:
                while (at := time.monotonic() - began) < CONTROL_SECONDS:
                    for alert in await asyncio.to_thread(stack.prometheus_alerts):
                        labels = alert["labels"]
                        if alert["state"] == "firing" and above_info(labels.get("severity", "")):
                            seen.append(f"{at:.0f} s: Prometheus fires {labels['alertname']}")
                    async with session.get(f"{stack.inferwatch.url}/verdict.json") as response:
                        doc = await response.json()
                    # Held for its alert's ``for``, as the rules would fire it; a finding
                    # still pending (a p95 over its threshold for a few seconds) is shown
                    # as pending, and counted apart.
                    for f in doc["findings"]:
                        if above_info(f["severity"]):
                            what = (
                                f"{at:.0f} s: the verdict page lists {f['alert']} ({f['severity']}"
                            )
                            if f["pending"]:
                                pending.append(f"{what}, pending {f['holding_seconds']} s)")
                            else:
                                seen.append(f"{what}, held {f['holding_seconds']} s)")
                    await asyncio.sleep(CONTROL_EVERY)
            judged, alone = await diagnose(stack), await diagnose_exporter(stack)
            fired = stack.receiver.firing(since=already)
            delivered = [
                a["labels"]["alertname"] for _, a in fired if above_info(a["labels"]["severity"])
            ]
            return seen, delivered, judged, alone
        finally:
            stop.set()
            await traffic

    seen, delivered, (code, judged), alone = asyncio.run(run())
    for what, doc in (("diagnose --prometheus --config", judged), ("diagnose --exporter", alone)):
        named = [f"{f['alert']} ({f['severity']})" for f in doc["findings"]]
        print(f"\nhealthy control, {what}: {', '.join(named) or 'nothing'}")
        seen += [f"{what} names {f['alert']}" for f in doc["findings"] if above_info(f["severity"])]
        seen += [
            f"{what}: objective {o['slo']} {o['severity']}"
            for burn in doc.get("slos", [])
            for o in burn["objectives"]
            if above_info(o["severity"])
        ]
    print(f"healthy control: {CONTROL_SECONDS} s, {len(delivered)} alerts above info delivered")
    print("pending on the verdict page, never held for their `for`:", pending or "none")
    assert not delivered, delivered
    assert not seen, seen
    assert code in (0, 1), judged  # nothing, or info findings only
