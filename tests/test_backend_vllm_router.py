"""vllm-router 0.1.17's metrics page, captured here in front of two vLLM 0.32 CPU replicas,
mapped onto the router's series: exact values read off each capture."""

from __future__ import annotations

from inferwatch.collect.backends import BACKENDS
from inferwatch.model import BackendSample

from conftest import fixture_text

ROUTER = BACKENDS["vllm-router"]
UP, DOWN = "http://127.0.0.1:18101", "http://127.0.0.1:18102"


def read(capture: str) -> BackendSample:
    return ROUTER.normalize(fixture_text(f"vllm-router-0.1.17{capture}.prom"))


def by_worker(sample: BackendSample, key: str) -> dict[str, float]:
    return {dict(labels)["worker"]: v for labels, v in sample.values[key].items()}


def test_healthy_round_robin_splits_the_requests_evenly_and_nothing_fails() -> None:
    sample = read("")
    assert by_worker(sample, "router_worker_requests") == {UP: 25.0, DOWN: 25.0}
    assert by_worker(sample, "router_worker_healthy") == {UP: 1.0, DOWN: 1.0}
    assert by_worker(sample, "router_worker_circuit_state") == {UP: 0.0, DOWN: 0.0}
    policy = {dict(k)["policy"] for k in sample.values["router_policy_decisions"]}
    assert policy == {"round_robin"}
    assert sample.values["router_workers_active"] == {(("model", "unknown"),): 2.0}
    # No failure, no retry yet: their families are absent, not zero.
    for absent in ("router_worker_failures", "router_retries", "router_retries_exhausted"):
        assert absent not in sample.values
    (duration,) = sample.histograms["router_request_duration_seconds"].values()
    assert (duration.count, duration.sum) == (50.0, 4.857734162000001)


def test_a_dead_replica_fails_and_is_retried_while_its_health_still_reads_1() -> None:
    sample = read("-one-down")
    assert by_worker(sample, "router_worker_failures") == {DOWN: 9.0}
    # The tries less the successes are the failures: 38 - 29 (the failure outcomes' own
    # series is born at the first failure; the signals read these two).
    assert by_worker(sample, "router_worker_requests") == {UP: 39.0, DOWN: 38.0}
    assert by_worker(sample, "router_worker_successes") == {UP: 39.0, DOWN: 29.0}
    assert sample.values["router_retries"] == {(("model", "unknown"),): 9.0}
    assert by_worker(sample, "router_worker_healthy") == {UP: 1.0, DOWN: 1.0}
    assert by_worker(sample, "router_worker_circuit_state") == {UP: 0.0, DOWN: 0.0}


def test_the_circuit_opens_then_the_health_check_fails_the_replica() -> None:
    opened = read("-one-down-cb-open")
    assert by_worker(opened, "router_worker_circuit_state") == {UP: 0.0, DOWN: 1.0}
    assert by_worker(opened, "router_worker_healthy") == {UP: 1.0, DOWN: 1.0}
    unhealthy = read("-one-down-unhealthy")
    assert by_worker(unhealthy, "router_worker_healthy") == {UP: 1.0, DOWN: 0.0}
    assert unhealthy.values["router_workers_active"] == {(("model", "unknown"),): 2.0}


def test_without_retries_the_failures_are_only_in_outcomes_and_exhausted_retries() -> None:
    sample = read("-no-retries-one-down")
    assert by_worker(sample, "router_worker_requests") == {UP: 7.0, DOWN: 7.0}
    assert by_worker(sample, "router_worker_failures") == {DOWN: 5.0}
    assert sample.values["router_retries_exhausted"] == {(("model", "unknown"),): 5.0}
    # The duration histogram counts the 9 answered of 14: the 5 failures are not in it.
    (duration,) = sample.histograms["router_request_duration_seconds"].values()
    assert duration.count == 9.0


def test_a_worker_url_with_credentials_is_shown_without_them() -> None:
    page = fixture_text("vllm-router-0.1.17.prom").replace(
        "http://127.0.0.1:18101", "http://user:pa/ss@127.0.0.1:18101"
    )
    workers = by_worker(ROUTER.normalize(page), "router_worker_requests")
    assert set(workers) == {UP, DOWN}
