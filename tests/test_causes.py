"""The method's causal graph: what explains what, and the order findings are read in.

The relations are data (each alert's ``explains``, :data:`~inferwatch.method.alerts.RELATIONS`);
the verdict page, ``diagnose`` and the generated Alertmanager config all read them.
"""

from __future__ import annotations

import pytest

from inferwatch.method.alerts import ALERTS, RELATIONS, USERS_SEE
from inferwatch.method.findings import Finding, Report, strength
from inferwatch.method.rules import alertmanager_document
from inferwatch.method.spec import SEVERITY_ORDER, spec_from_config
from inferwatch.method.thresholds import MACHINE_DEPENDENT, THRESHOLDS
from inferwatch.tools.report import render, report_json

# Every threshold set (calibrated), at its default: the relations as a calibrated spec reads
# them (an uncalibrated one's are tested apart).
SPEC = spec_from_config({"thresholds": {n: THRESHOLDS[n].default for n in MACHINE_DEPENDENT}})
POD = {"instance": "a:8000", "backend": "vllm", "model": "tiny"}


def finding(name: str, factor: float = 1.5, labels: dict | None = None) -> Finding:
    """The alert holding with every condition ``factor`` past its bound."""
    alert = ALERTS[name]
    evidence = []
    for cond in alert.when + alert.any_of:
        bound = cond.bound(SPEC)
        value = bound * factor if cond.op in (">", ">=") else bound / factor
        evidence.append((cond, value if bound > 0 else 1.0))
    return Finding(alert, labels or POD, evidence, severity=SPEC.severity(alert))


def report(*findings: Finding) -> Report:
    return Report("x", "5m", SPEC, {"ttft_p95": None, "itl_p95": None}, list(findings))


def listing(r: Report) -> list[tuple[int, str, str | None]]:
    return [(f.depth, f.alert.name, f.explained_by) for f in r.findings]


def test_the_engine_stall_lists_its_cause_first_and_what_users_see_under_it() -> None:
    # The demo's engine stall: the canary's probes time out (critical), latency regressed,
    # requests queue; the stall explains all of it.
    r = report(
        finding("InferenceCanaryFailing", 50.0),
        finding("InferenceLatencyRegression", 10.0),
        finding("InferenceQueueingDelay", 5.0),
        finding("InferenceQueuedWhileIdle", 1.2),
    )
    # Each under its nearest cause: the queueing the stall causes, what users see under it.
    assert listing(r) == [
        (0, "InferenceQueuedWhileIdle", None),
        (1, "InferenceQueueingDelay", "InferenceQueuedWhileIdle"),
        (2, "InferenceLatencyRegression", "InferenceQueueingDelay"),
        (2, "InferenceCanaryFailing", "InferenceQueueingDelay"),
    ]
    # A ticket never silences a page: the canary's critical alert still notifies.
    inhibited = {f.alert.name: f.inhibited for f in r.findings}
    assert inhibited["InferenceCanaryFailing"] is False
    assert inhibited["InferenceLatencyRegression"] is True
    text = render(r)
    assert text.index("InferenceQueuedWhileIdle") < text.index("InferenceCanaryFailing")
    assert "  explained by InferenceQueuedWhileIdle (inhibited in Alertmanager)" in text
    assert "explained by InferenceQueueingDelay\n" in text  # the canary's, not inhibited
    doc = report_json(r)["findings"]
    assert [f["depth"] for f in doc] == [0, 1, 2, 2]


def test_a_finding_goes_under_its_nearest_cause() -> None:
    # The CPU starves the engine loop (queued while idle), which makes requests queue.
    r = report(
        finding("InferenceQueueingDelay", 3.0),
        finding("InferenceQueuedWhileIdle", 2.0),
        finding("InferenceFrontendCPUSaturated", 1.1),
    )
    assert listing(r) == [
        (0, "InferenceFrontendCPUSaturated", None),
        (1, "InferenceQueuedWhileIdle", "InferenceFrontendCPUSaturated"),
        (2, "InferenceQueueingDelay", "InferenceQueuedWhileIdle"),
    ]


def test_a_cause_of_another_model_explains_nothing() -> None:
    other = {**POD, "instance": "b:8000", "model": "other"}
    r = report(
        finding("InferenceQueueingDelay", 3.0, other),
        finding("InferenceQueuedWhileIdle", 2.0),
        finding("InferenceQueueingDelay", 3.0),
    )
    assert listing(r) == [
        (0, "InferenceQueueingDelay", None),  # the other model's: stronger evidence
        (0, "InferenceQueuedWhileIdle", None),
        (1, "InferenceQueueingDelay", "InferenceQueuedWhileIdle"),
    ]
    assert r.findings[0].labels["model"] == "other"


@pytest.mark.parametrize("stronger", [1.5, 4.0])
def test_unrelated_findings_go_by_evidence_strength_never_by_name(stronger: float) -> None:
    # Decode slow and the frontend saturated: no relation orders the two; the one further
    # past its threshold leads, whichever name sorts first.
    decode = finding("InferenceDecodeBottleneck", stronger)
    frontend = finding("InferenceFrontendCPUSaturated", 2.0)
    r = report(frontend, decode)
    first = "InferenceDecodeBottleneck" if stronger > 2.0 else "InferenceFrontendCPUSaturated"
    assert r.findings[0].alert.name == first
    assert strength(decode, SPEC) == pytest.approx(stronger)


def test_long_prompts_into_streams_lead_with_the_stall() -> None:
    # Both prefill findings hold; the stall says what to change (the chunk size), whatever
    # the bottleneck's evidence.
    r = report(
        finding("InferencePrefillBottleneck", 5.0), finding("InferencePrefillStallsDecode", 1.2)
    )
    assert listing(r) == [
        (0, "InferencePrefillStallsDecode", None),
        (1, "InferencePrefillBottleneck", "InferencePrefillStallsDecode"),
    ]


def test_a_cache_that_cannot_hold_the_batch_explains_the_capacity_ticket() -> None:
    # Long generations preempt and use the capacity measured at a shorter shape: the
    # memory is what to change, whichever finding is further past its threshold.
    r = report(
        finding("InferenceNearCapacity", 3.0),
        finding("InferenceQueueingDelay", 2.0),
        finding("InferenceKVCachePressure", 1.1),
    )
    assert listing(r) == [
        (0, "InferenceKVCachePressure", None),
        (1, "InferenceNearCapacity", "InferenceKVCachePressure"),
        (2, "InferenceQueueingDelay", "InferenceNearCapacity"),
    ]


def test_a_symptom_with_no_cause_is_listed_after_the_causes() -> None:
    r = report(finding("InferenceCanaryFailing", 9.0), finding("InferenceDecodeBottleneck", 1.1))
    assert listing(r)[0][1] == "InferenceDecodeBottleneck"
    assert listing(r)[1] == (1, "InferenceCanaryFailing", "InferenceDecodeBottleneck")
    alone = report(finding("InferenceCanaryFailing", 9.0), finding("InferenceExporterGPUMissing"))
    assert [name for _, name, _ in listing(alone)] == [
        "InferenceExporterGPUMissing",
        "InferenceCanaryFailing",
    ]


def test_what_prometheus_fires_is_read_before_what_only_holds_this_instant() -> None:
    """``diagnose --prometheus``: a replica's scrape that missed one poll holds its critical
    InferenceBackendDown condition at the instant diagnose reads it, pending for its
    ``for``, while another replica's imbalance has fired for minutes: the fired cause first.
    Among findings alike in that, severity still leads (the exporter's view has no firing)."""
    other = {**POD, "instance": "b:8000"}
    blip = finding("InferenceBackendDown", labels=other)
    imbalance = finding("InferenceReplicaImbalance")
    imbalance.firing = True
    assert [name for _, name, _ in listing(report(blip, imbalance))] == [
        "InferenceReplicaImbalance",
        "InferenceBackendDown",
    ]
    both = report(
        finding("InferenceBackendDown", labels=other), finding("InferenceReplicaImbalance")
    )
    assert [name for _, name, _ in listing(both)] == [
        "InferenceBackendDown",
        "InferenceReplicaImbalance",
    ]


def test_every_cause_of_slow_requests_explains_what_users_see() -> None:
    explains = {source: set() for source, _, _ in RELATIONS}
    for source, targets, _ in RELATIONS:
        explains[source].update(targets)
    for name in (
        "InferenceQueuedWhileIdle",
        "InferenceQueueingDelay",
        "InferencePrefillBottleneck",
        "InferenceDecodeBottleneck",
        "InferenceKVCachePressure",
        "InferencePrefillStallsDecode",
        "InferenceFrontendCPUSaturated",
        "InferenceGPUThrottling",
    ):
        assert set(USERS_SEE) <= explains[name], name


@pytest.mark.parametrize("paging", ["slo", "causes"])
def test_alertmanager_inhibits_only_what_is_no_more_severe_than_its_cause(paging: str) -> None:
    spec = spec_from_config({"alerting": {"paging": paging}})
    rules = alertmanager_document(spec)["inhibit_rules"]
    order = SEVERITY_ORDER.index
    pairs = set()
    for rule in rules:
        source = rule["source_matchers"][0].split('"')[1]
        targets = rule["target_matchers"][0].split('"')[1].split("|")
        if source not in ALERTS:
            continue
        for target in targets:
            pairs.add((source, target))
            assert order(spec.severity(ALERTS[source])) <= order(spec.severity(ALERTS[target]))
    # Every relation the severities allow is there.
    for source, targets, _ in RELATIONS:
        for target in targets if source in ALERTS else ():
            if spec.inhibits(ALERTS[source], ALERTS[target]):
                assert (source, target) in pairs
    assert ("InferenceQueuedWhileIdle", "InferenceQueueingDelay") in pairs
    assert ("InferenceQueuedWhileIdle", "InferenceCanaryFailing") not in pairs


def test_a_starved_cpu_explains_the_slowness_it_causes() -> None:
    # A noisy neighbour: prefill slow, requests queue; the CPU under the server is why.
    r = report(
        finding("InferencePrefillBottleneck", 3.0),
        finding("InferenceQueueingDelay", 2.0),
        # Waiting 80 % of its ready time, the server runs 1 / (1 - 0.8) = 5x as long: enough
        # for a TTFT 3x its threshold.
        finding("InferenceServerCPUStarved", 0.8 / THRESHOLDS["server_cpu_wait_share"].default),
    )
    assert listing(r)[0] == (0, "InferenceServerCPUStarved", None)
    assert sorted(listing(r)[1:]) == [
        (1, "InferencePrefillBottleneck", "InferenceServerCPUStarved"),
        (1, "InferenceQueueingDelay", "InferenceServerCPUStarved"),
    ]


def test_a_cpu_wait_explains_a_latency_only_as_far_as_it_stretches_it() -> None:
    # A batch cap holds requests waiting (TTFT 10x its threshold) while the server waits
    # half of its ready time for a CPU: that stretches its work 2x, not 10x. The queueing
    # is a cause of its own, listed first (stronger); a 1.5x prefill the wait does explain.
    starved = finding(
        "InferenceServerCPUStarved", 0.5 / THRESHOLDS["server_cpu_wait_share"].default
    )
    r = report(
        finding("InferenceQueueingDelay", 10.0),
        finding("InferencePrefillBottleneck", 1.5),
        starved,
    )
    assert listing(r) == [
        (0, "InferenceQueueingDelay", None),
        (0, "InferenceServerCPUStarved", None),
        (1, "InferencePrefillBottleneck", "InferenceServerCPUStarved"),
    ]
    # Alertmanager cannot weigh the stretch: the CPU inhibits no latency alert.
    inhibit = alertmanager_document(SPEC)["inhibit_rules"]
    starves = [
        r for r in inhibit if r["source_matchers"] == ['alertname="InferenceServerCPUStarved"']
    ]
    assert starves  # it still inhibits what it explains without weighing (GPU idle)
    silenced = {t for rule in starves for t in rule["target_matchers"][0].split('"')[1].split("|")}
    assert "InferenceQueueingDelay" not in silenced
    assert "InferencePrefillBottleneck" not in silenced


def test_a_default_threshold_never_outranks_calibrated_evidence() -> None:
    # Only the latency thresholds calibrated: the CPU wait is judged on its default. Its
    # finding is info and explains no calibrated cause, however strong.
    latency = ("ttft_p95_seconds", "itl_p95_seconds", "itl_p99_seconds")
    spec = spec_from_config({"thresholds": {n: THRESHOLDS[n].default for n in latency}})
    starved = ALERTS["InferenceServerCPUStarved"]
    assert spec.uncalibrated(starved) == ["server_cpu_wait_share"]
    assert spec.severity(starved) == "info"
    queueing = ALERTS["InferenceQueueingDelay"]
    assert spec.uncalibrated(queueing) == [] and spec.severity(queueing) == "warning"
    findings = [
        Finding(queueing, POD, [(c, c.bound(spec) * 1.2) for c in queueing.when]),
        Finding(starved, POD, [(c, 0.95) for c in starved.when], severity="info"),
    ]
    r = Report("x", "5m", spec, {}, findings)
    assert listing(r) == [
        (0, "InferenceQueueingDelay", None),
        (0, "InferenceServerCPUStarved", None),
    ]
