"""sglang-router 0.3.2's metrics page (the Rust model gateway, ``smg_*``), captured here in
front of one vLLM 0.32 CPU replica, mapped onto the router's series."""

from __future__ import annotations

from inferwatch.collect.backends import BACKENDS, detect

from conftest import fixture_text

PAGE = fixture_text("sglang-router-0.3.2.prom")
WORKER = (("model", "unknown"), ("worker", "http://127.0.0.1:18101"))


def test_the_gateway_s_workers_responses_and_duration() -> None:
    assert detect(PAGE) is BACKENDS["sglang-router"]
    sample = BACKENDS["sglang-router"].normalize(PAGE)
    assert sample.values["router_worker_requests"] == {WORKER: 10.0}
    assert sample.values["router_worker_successes"] == {WORKER: 10.0}
    assert sample.values["router_worker_healthy"] == {WORKER: 1.0}
    assert sample.values["router_worker_circuit_state"] == {WORKER: 0.0}
    assert sample.values["router_workers_active"] == {(("model", "unknown"),): 1.0}
    assert sample.values["router_responses"] == {(("model", "unknown"), ("status", "2xx")): 10.0}
    (duration,) = sample.histograms["router_request_duration_seconds"].values()
    assert (duration.count, duration.sum) == (10.0, 0.401539341)
    for absent in ("router_worker_failures", "router_retries", "router_policy_decisions"):
        assert absent not in sample.values
