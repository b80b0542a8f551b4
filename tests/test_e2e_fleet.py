"""A real fleet (``demo/fleet.py``): two vLLM replicas behind the real ``vllm-router``, a sidecar
next to each and one next to the router, one Prometheus and Alertmanager with the generated
rules and config. Each fault must reach Alertmanager naming the replica it is about, and
``inferwatch diagnose --prometheus`` must name that replica first in its fleet view.

- Pinned clients: twice the batch in clients that hold replica a's address instead of the
  router's: a queue on a while b idles: InferenceReplicaImbalance names a, nothing above
  info names b, and the fleet view puts a first.
- Replica b's health check failing (503 from its proxy on ``/health`` alone) while its server
  serves: InferenceRouterExcludesLiveWorker names b's URL once the router's health check
  has taken it out, nothing above info names either replica, and the fleet view lists the
  cause under the router's worker b.
- The whole fleet overloaded: ``inferwatch calibrate`` through the router (one replica's
  share of what the fleet carried, for both sidecars), then four times every replica's
  batch in clients through the router: InferenceNearCapacity, about the model and no
  replica, comes first, and the fleet view lists it on the model's line. The imbalance may
  hold beside it only where another replica has room (round robin gathers the waiting
  clients on a slower replica); nothing else is judged about a replica.
- A replica killed under traffic: InferenceRouterFailingWorker names its URL while the
  router's own health check still passes it (it checks every 60 s and fails a worker on the
  third miss), and the dead replica's sidecar says InferenceBackendDown; the other replica
  has nothing above info; the sidecar next to the router names the worker on its page.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from demo.calibration import measured_capacity
from demo.fleet import (
    JUDGED,
    Fleet,
    fleet_overloaded,
    health_check_failed,
    pinned_clients,
    replica_killed,
)
from demo.stack import VllmServer, chromium
from inferwatch.method.alerts import ALERTS
from inferwatch.method.rules import placeholders
from inferwatch.method.signals import SIGNALS
from inferwatch.method.spec import seconds

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def fleet(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    local = Fleet(tmp_path_factory.mktemp("fleet"), vllm_server)
    try:
        yield local.start()
    finally:
        local.stop()


async def until_received(
    fleet: Fleet, fault, names: set[str], timeout: float, router_shows: str | None = None
) -> dict:
    """Run ``fault`` until every alert of ``names`` reached the webhook and, with
    ``router_shows``, the router sidecar's verdict listed that alert (or ``timeout``);
    returns each firing alert's labels by name, the first time it arrived, and the seconds
    from the fault's start, with what ``diagnose --prometheus`` said at that moment; and,
    with ``router_shows``, the router sidecar's verdict the first time it listed that alert
    (read every half second from the fault's start)."""
    already = len(fleet.receiver.notifications)
    stop = asyncio.Event()
    began = time.monotonic()
    task = asyncio.create_task(fault(fleet, stop))
    watch = asyncio.create_task(router_verdict(fleet, router_shows, stop)) if router_shows else None
    received: dict[str, tuple[dict, float]] = {}
    report = None
    try:
        while time.monotonic() - began < timeout and not task.done():
            for arrived, alert in fleet.receiver.firing(since=already):
                received.setdefault(alert["labels"]["alertname"], (alert["labels"], arrived))
            if names <= set(received) and report is None:
                report = await diagnose(fleet)
            # The sidecar's verdict and Prometheus judge the same window apart: either may
            # name the worker first, so the fault holds until both have.
            if report is not None and (watch is None or watch.done()):
                break
            await asyncio.sleep(0.5)
    finally:
        stop.set()
        await task
        verdict = await watch if watch else None
    return {"received": received, "began": began, "report": report, "verdict": verdict}


async def router_verdict(
    fleet: Fleet, alert: str, stop: asyncio.Event
) -> tuple[dict, Path, float] | None:
    """The router sidecar's ``/verdict.json`` the first time it lists ``alert`` as held for
    its ``for`` before ``stop``, its page as served then (saved in the fleet's workdir) and
    when (monotonic). The verdict is read from the start rather than after the alert: the
    sidecar's window and Prometheus' are apart, and either may name the worker first."""
    url = f"{fleet.sidecars['router'].url}/"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        while not stop.is_set():
            async with session.get(url + "verdict.json") as response:
                doc = await response.json()
            async with session.get(url) as response:
                html = await response.text()
            if alert in held(doc) and alert in html:
                page = fleet.workdir / "verdict-router.html"
                page.write_text(html)
                return doc, page, time.monotonic()
            await asyncio.sleep(0.5)
    return None


def held(doc: dict) -> list[str]:
    """The verdict's findings that held for their alert's ``for``, as the rules fire them
    (the dead worker's is pending for its first seconds)."""
    return [f["alert"] for f in doc["findings"] if not f.get("pending")]


def paged(report: dict) -> list[dict]:
    """``diagnose``'s findings above info that Prometheus fires, in its order. A condition
    that holds only at the instant diagnose reads it is pending for its alert's ``for``: one
    poll of a starved replica's page that timed out holds InferenceBackendDown's for a second,
    and pages nobody."""
    return [f for f in report["findings"] if f["severity"] in JUDGED and f["firing"]]


async def diagnose(fleet: Fleet) -> dict:
    """``inferwatch diagnose --prometheus --json``, as on-call runs it."""
    assert fleet.prometheus is not None
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "inferwatch", "diagnose", "--prometheus", fleet.prometheus.url,
        "--config", str(fleet.config), "--json",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    return json.loads(out)


def test_clients_pinned_to_one_replica_name_it(fleet: Fleet) -> None:
    result = asyncio.run(until_received(fleet, pinned_clients, {"InferenceReplicaImbalance"}, 240))
    received = result["received"]
    assert "InferenceReplicaImbalance" in received, sorted(received)
    labels, arrived = received["InferenceReplicaImbalance"]
    print(
        f"\npinned clients: InferenceReplicaImbalance {arrived - result['began']:.1f} s after onset"
    )
    hot, cold = "a", "b"
    assert labels["instance"] == fleet.instance(hot)
    report = result["report"]
    findings = paged(report)
    print("diagnose:", ", ".join(f"{f['alert']} {f['labels'].get('instance')}" for f in findings))
    assert findings[0]["alert"] == "InferenceReplicaImbalance"
    assert findings[0]["labels"]["instance"] == fleet.instance(hot)
    assert not [f for f in findings if f["labels"].get("instance") == fleet.instance(cold)]
    (model,) = report["fleet"]["models"]
    first, second = model["replicas"]
    print(f"fleet view: {first['labels']['instance']} {first['share']:.0%} of the requests")
    assert first["labels"]["instance"] == fleet.instance(hot)
    assert "InferenceReplicaImbalance" in first["causes"]
    assert second["labels"]["instance"] == fleet.instance(cold)
    # What the imbalance explains (the hot replica's queue) may arrive before it: nothing else.
    allowed = {"InferenceReplicaImbalance", *ALERTS["InferenceReplicaImbalance"].explains}
    unrelated = {n for n, (a, _) in received.items() if a.get("severity") in JUDGED} - allowed
    assert not unrelated, unrelated


def test_the_rules_find_each_routers_worker_by_its_sidecar(fleet: Fleet) -> None:
    """The real router's ``worker`` URLs and the real sidecars' ``server`` labels meet in
    PromQL: each worker's server answers, and the router has neither out (what
    InferenceRouterExcludesLiveWorker fires on when the router has one out)."""
    assert fleet.prometheus is not None
    values = placeholders(fleet.spec)
    workers = sorted(fleet.workers.values())
    for signal, value in (("router_worker_server_answers", 1), ("router_worker_out", 0)):
        deadline = time.monotonic() + 30  # the sidecars' first scrapes, when run alone
        while True:
            found = fleet.prometheus.query(SIGNALS[signal].promql % values)
            got = sorted((s["metric"]["worker"], float(s["value"][1])) for s in found)
            if got == [(w, value) for w in workers] or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert got == [(w, value) for w in workers], (signal, got)


def test_a_replica_the_router_took_out_while_it_serves_is_named(fleet: Fleet) -> None:
    fleet.settle()
    out, expect = fleet.workers["b"], "InferenceRouterExcludesLiveWorker"
    # The router checks every 60 s and takes a worker out on the third failure in a row.
    result = asyncio.run(until_received(fleet, health_check_failed, {expect}, 300))
    received = result["received"]
    assert expect in received, sorted(received)
    labels, arrived = received[expect]
    print(f"\nhealth check failing: {expect} {arrived - result['began']:.1f} s after onset")
    assert labels["worker"] == out and labels["instance"] == fleet.instance("router")
    assert fleet.router.health(out) == 0  # the router's own health check took it out
    # b's server answered its sidecar all along, and a carried two clients with room.
    unrelated = {n for n, (a, _) in received.items() if a.get("severity") in JUDGED} - {expect}
    assert not unrelated, unrelated
    report = result["report"]
    findings = paged(report)
    print("diagnose:", ", ".join(f"{f['alert']} {f['labels'].get('worker')}" for f in findings))
    assert [(f["alert"], f["labels"].get("worker")) for f in findings] == [(expect, out)]
    (router,) = report["fleet"]["routers"]
    workers = {w["worker"]: w for w in router["workers"]}
    assert workers[out]["causes"] == [expect]
    assert workers[fleet.workers["a"]]["causes"] == []


def test_the_whole_fleet_overloaded_is_capacity_first(fleet: Fleet) -> None:
    fleet.settle()
    baseline = fleet.calibrate()
    print(
        f"\ncalibrated through the router: {measured_capacity(baseline):.2f} requests/s a replica"
    )
    expect, imbalance = "InferenceNearCapacity", "InferenceReplicaImbalance"
    with fleet.judged_against(baseline):
        fleet.settle()
        result = asyncio.run(until_received(fleet, fleet_overloaded, {expect}, 240))
    received = result["received"]
    assert expect in received, sorted(received)
    labels, arrived = received[expect]
    print(f"fleet overloaded: {expect} {arrived - result['began']:.1f} s after onset")
    assert "instance" not in labels and "worker" not in labels  # the model's, no replica's
    # What the ticket explains may hold; so may the imbalance, where round robin gathers the
    # waiting clients on a slower replica while the other has room (checked below): no other.
    judged = {n for n, (a, _) in received.items() if a.get("severity") in JUDGED}
    assert not judged - {expect, imbalance, *ALERTS[expect].explains}, judged
    report = result["report"]
    findings = paged(report)
    print("diagnose:", ", ".join(f"{f['alert']} {f['labels'].get('instance')}" for f in findings))
    assert findings[0]["alert"] == expect
    (model,) = report["fleet"]["models"]
    replicas = [(r["share"], r["waiting"], r["causes"]) for r in model["replicas"]]
    print(f"fleet view: {model['causes']}; each replica's share, waiting and causes: {replicas}")
    assert model["causes"][0] == expect
    named = {f["alert"] for f in findings}
    for _, _, causes in replicas:
        # Nothing paged or ticketed about one replica but an imbalance beside a replica with
        # room (uncalibrated, a replica's own speed is judged at info only).
        assert not set(causes) & named - {imbalance}, causes
        if imbalance in causes:
            assert min(w for _, w, _ in replicas) < 1, replicas


def test_a_killed_replica_is_named_before_the_routers_health_check_fails_it(fleet: Fleet) -> None:
    fleet.settle()
    dead = fleet.workers["b"]
    expect = {"InferenceRouterFailingWorker", "InferenceBackendDown"}
    result = asyncio.run(
        until_received(fleet, replica_killed, expect, 150, "InferenceRouterFailingWorker")
    )
    received = result["received"]
    assert expect <= set(received), sorted(received)
    failing, arrived = received["InferenceRouterFailingWorker"]
    print(
        f"\nreplica killed: InferenceRouterFailingWorker {arrived - result['began']:.1f} s, "
        f"InferenceBackendDown {received['InferenceBackendDown'][1] - result['began']:.1f} s "
        "after onset"
    )
    # Within one rate window of the kill, its ``for`` and the notification's way.
    assert fleet.killed_at is not None
    since_kill = arrived - fleet.killed_at
    for_seconds = seconds(fleet.spec.timing.for_alert(ALERTS["InferenceRouterFailingWorker"]))
    budget = fleet.spec.window_seconds + for_seconds + 5
    print(f"  {since_kill:.1f} s after the kill (budget {budget:g} s)")
    assert since_kill <= budget
    assert failing["worker"] == dead
    assert failing["instance"] == fleet.instance("router")
    assert received["InferenceBackendDown"][0]["instance"] == fleet.instance("b")
    # The router's own health check had not failed the replica yet.
    assert fleet.router.health(dead) == 1
    report = result["report"]
    judged = paged(report)
    assert not [f for f in judged if f["labels"].get("instance") == fleet.instance("a")]
    (router,) = report["fleet"]["routers"]
    workers = {w["worker"]: w for w in router["workers"]}
    assert workers[dead]["causes"] == ["InferenceRouterFailingWorker"]
    assert workers[dead]["router_worker_failure_share"] > 0.5
    assert workers[fleet.workers["a"]]["causes"] == []
    # The sidecar next to the router says the same on its own page, naming the worker.
    assert result["verdict"] is not None, "the router sidecar's verdict never named it"
    doc, page, shown = result["verdict"]
    # Every finding, pending ones too: the live replica's requests in flight fail nothing.
    named = [(f["alert"], f["labels"].get("worker")) for f in doc["findings"]]
    print(f"  router sidecar's verdict {shown - fleet.killed_at:.1f} s after the kill: {named}")
    assert named == [("InferenceRouterFailingWorker", dead)]  # the live replica is not named
    shot = page.with_suffix(".png")
    dom = chromium("--dump-dom", page.as_uri(), profile=fleet.workdir / "chromium")
    assert dom.returncode == 0 and f"worker={dead}" in dom.stdout, dom.stderr
    size = "--window-size=1200,900"
    taken = chromium(
        f"--screenshot={shot}", size, page.as_uri(), profile=fleet.workdir / "chromium"
    )
    assert taken.returncode == 0, taken.stderr
    print(f"  router verdict page: {shot}")
