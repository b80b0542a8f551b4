"""The global view of docs/deployment.md's "Towards a fleet": two clusters, one global Prometheus.

Each cluster has its own Prometheus (``external_labels: {cluster: a|b}``) scraping two
replicas and evaluating the generated rules; a third, global Prometheus federates from both
what the docs recommend (the ``instance:``/``model:`` recording rules, ``ALERTS`` and the
few raw series the fleet dashboard reads per instance), with ``honor_labels: true``.

The replicas serve inferwatch's own page (normalize + render of a real vLLM capture) with
the capture's counters growing linearly, so rates are constant and non-zero. Both clusters
serve the same model; cluster b's TTFT histogram is shifted 10x (its p95 is 10x cluster a's)
and its KV cache is full with preemptions (InferenceKVCachePressure), while a fifth of
cluster a's requests end in a server error (InferenceRequestErrors).

On the global Prometheus only: every fleet-dashboard query returns data; the model-level
ones return one series per cluster with the value that cluster's own Prometheus computes
at the same instant; ALERTS carry their cluster, and each fault's alert is its cluster's
alone. Runs in about 30 s (most of it filling the 15 s rate window).
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from demo.stack import Prometheus, free_port
from inferwatch.collect.window import LatencyWindow
from inferwatch.dashboards import dashboards
from inferwatch.dashboards.queries import GPU_ONLY_PANELS, POOL_PANELS, ROUTER_PANELS
from inferwatch.method.alerts import ALERTS
from inferwatch.method.spec import spec_from_config
from inferwatch.tools.generate import write

from conftest import exporter_page, fixture_text

DEPLOYMENT = Path(__file__).parents[1] / "docs" / "deployment.md"
CLUSTERS = ("a", "b")
SPEC = spec_from_config(
    {
        "alerting": {
            "fleet_labels": ["cluster"],  # added to the defaults (namespace, backend, model)
            "evaluation_interval": "1s",
            "rate_window": "15s",
            "for": {name: "1s" for name in ALERTS},
        }
    }
)
# What the global Prometheus federates: docs/deployment.md, "Towards a fleet".
FEDERATE = (
    '{__name__=~"model:.+|instance:.+"}',
    "ALERTS",
    '{__name__=~"inferwatch_backend_info|inferwatch_backend_up'
    '|inferwatch_requests_running|inferwatch_requests_waiting|inferwatch_kv_cache_usage_ratio"}',
)
CAPTURE = fixture_text("vllm-0.32.0-cpu-loaded-kv-full.prom")  # KV cache full, 13 preemptions
COUNTER = re.compile(r"^(vllm:[a-z_:]+_(?:total|bucket|count|sum))(\{[^}]*\})? (\S+)$")
# Global against cluster values at one instant: the same samples, so equal but for a sample
# the global view might miss (rates of these linear counters then differ by scrape jitter).
TOLERANCE = 0.01
GUARD = 60.0  # seconds: a generous bound on each wait; the conditions come in seconds


def vllm_page(cluster: str, growth: float) -> str:
    """The capture with its counters multiplied by ``growth``; cluster b's TTFT shifted 10x
    (bucket bounds and sum), cluster a's KV cache at 20 % and its preemptions flat."""
    lines = []
    for line in CAPTURE.splitlines():
        if cluster == "a" and line.startswith("vllm:kv_cache_usage_perc"):
            line = line.rsplit(" ", 1)[0] + " 0.2"
        if cluster == "a" and line.startswith("vllm:request_success_total") and "error" in line:
            line = line.rsplit(" ", 1)[0] + " 3.0"  # 3 server errors per 12 good requests
        match = COUNTER.match(line)
        if match:
            name, labels, value = match.group(1), match.group(2) or "", float(match.group(3))
            if not (cluster == "a" and name == "vllm:num_preemptions_total"):
                value *= growth
            if cluster == "b" and name.startswith("vllm:time_to_first_token_seconds"):
                if name.endswith("_sum"):
                    value *= 10
                labels = re.sub(
                    r'le="([0-9.e+-]+)"', lambda m: f'le="{float(m[1]) * 10:g}"', labels
                )
            line = f"{name}{labels} {value!r}"
        lines.append(line)
    return "\n".join(lines) + "\n"


class Replicas:
    """aiohttp sites in a thread, one per replica: (cluster, requests per capture per s)."""

    def __init__(self, replicas: list[tuple[str, float]]):
        self.replicas = replicas
        self.ports = [free_port() for _ in replicas]
        self.loop = asyncio.new_event_loop()
        self.started = time.monotonic()
        self.runners: list[web.AppRunner] = []
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def targets(self, cluster: str) -> list[str]:
        return [
            f"127.0.0.1:{p}"
            for p, (c, _) in zip(self.ports, self.replicas, strict=True)
            if c == cluster
        ]

    def handler(self, cluster: str, speed: float) -> Callable:
        window = LatencyWindow(SPEC.window_seconds)  # the replica's exporter's

        async def metrics(request: web.Request) -> web.Response:
            now = time.monotonic()
            growth = 1 + speed * (now - self.started)
            body = exporter_page(vllm_page(cluster, growth), window=(window, now)).encode()
            return web.Response(body=body, content_type="text/plain", charset="utf-8")

        return metrics

    async def _start(self) -> None:
        for port, (cluster, speed) in zip(self.ports, self.replicas, strict=True):
            app = web.Application()
            app.router.add_get("/metrics", self.handler(cluster, speed))
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self.runners.append(runner)

    async def _stop(self) -> None:
        for runner in self.runners:
            await runner.cleanup()

    def start(self) -> Replicas:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    def stop(self) -> None:
        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
        self.loop.close()


class ClusterPrometheus(Prometheus):
    """A cluster's Prometheus: its replicas, the generated rules, its ``cluster`` label."""

    def __init__(self, workdir: Path, cluster: str, **kwargs: Any):
        super().__init__(workdir, **kwargs)
        self.cluster = cluster

    def config(self) -> dict:
        config = super().config()
        config["global"]["external_labels"] = {"cluster": self.cluster}
        return config


class GlobalPrometheus(Prometheus):
    """The global Prometheus: federates from the clusters' Prometheus, evaluates nothing."""

    def config(self) -> dict:
        config = super().config()
        config["scrape_configs"] = [
            {
                "job_name": "federate",
                "honor_labels": True,
                "metrics_path": "/federate",
                "params": {"match[]": list(FEDERATE)},
                "static_configs": [{"targets": self.targets}],
            }
        ]
        return config


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[dict[str, Prometheus], Prometheus]]:
    write(tmp_path, SPEC)
    rules = tmp_path / "alerts" / "inferwatch-rules.yaml"
    replicas = Replicas([("a", 1.0), ("a", 2.0), ("b", 1.0), ("b", 2.0)])
    started: list[Any] = [replicas]
    try:
        replicas.start()
        clusters = {}
        for name in CLUSTERS:
            prom = ClusterPrometheus(
                tmp_path / name, name, targets=replicas.targets(name), rule_files=[rules]
            )
            started.append(prom)
            clusters[name] = prom.start()
        top = GlobalPrometheus(
            tmp_path / "global",
            [f"127.0.0.1:{p.port}" for p in clusters.values()],
            interval="500ms",  # twice per evaluation: no recorded sample is missed
        )
        started.append(top)
        yield clusters, top.start()
    finally:
        for component in reversed(started):
            component.stop()


def wait_for(prometheus: Prometheus, expr: str, count: int = 1) -> list[dict]:
    deadline = time.monotonic() + GUARD
    while len(result := prometheus.query(expr)) < count:
        assert time.monotonic() < deadline, f"{expr}: {len(result)} series, {count} expected"
        time.sleep(0.5)
    return result


def substitute(expr: str) -> str:
    for name, value in {
        "$namespace": ".*",
        "$cluster": ".*",
        "$backend": "vllm",
        "$model": "tiny",
        "$instance": ".*",
    }.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, expr
    return expr


def by_cluster(result: list[dict]) -> dict[str, float]:
    values = {r["metric"].get("cluster"): float(r["value"][1]) for r in result}
    assert len(values) == len(result), f"more than one series per cluster: {result}"
    return values


def test_global_prometheus_serves_the_fleet_dashboard_and_both_clusters_alerts(fleet) -> None:
    clusters, top = fleet
    board = dashboards(SPEC)["inferwatch-fleet.json"]
    w = SPEC.rate_name
    # Both clusters' model-level rules have values, and the global view federated them.
    wait_for(
        top, f'model:inferwatch_time_to_first_token_seconds:quantile_{w}{{quantile="0.95"}}', 2
    )
    wait_for(top, 'ALERTS{alertname="InferenceKVCachePressure", alertstate="firing"}')
    wait_for(top, 'ALERTS{alertname="InferenceRequestErrors", alertstate="firing"}')

    # The model-level panels: the first row, before the "Instances" header.
    model_panels, failures, checked = [], [], 0
    for panel in board["panels"]:
        if panel["type"] == "row":
            break
        model_panels.append(panel)
    assert len(model_panels) >= 4
    # An instant both levels hold the same samples for: federation lags, so wait until the
    # global view has every model-level series' samples from after it (and an evaluation).
    # rate() over a partly filled window under-reads: wait for a full one in each cluster.
    for prom in clusters.values():
        wait_for(
            prom, f'min(count_over_time(up{{job="inferwatch"}}[1m])) > {SPEC.window_seconds + 2}'
        )
    at = time.time()
    named = 'label_replace({__name__=~"model:.+"}, "name", "$1", "__name__", "(.+)")'
    wait_for(top, f"min(timestamp({named})) > {at + 1.5}")
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        for target in panel.get("targets", []):
            expr = substitute(target["expr"])
            result = top.query(expr, at)
            checked += 1
            if panel["title"] in GPU_ONLY_PANELS | ROUTER_PANELS | POOL_PANELS:
                if result:
                    failures.append(
                        f"{panel['title']}: data, none expected (no GPU, no router, no pools)"
                    )
                continue
            if not result:
                failures.append(f"{panel['title']}: no data at the global level for {expr}")
                continue
            if panel not in model_panels:
                continue
            got = by_cluster(result)
            if set(got) != set(CLUSTERS):
                failures.append(f"{panel['title']}: clusters {sorted(got)} for {expr}")
                continue
            for name, prom in clusters.items():
                (own,) = by_cluster(prom.query(expr, at)).values()
                if got[name] != pytest.approx(own, rel=TOLERANCE, abs=1e-9):
                    failures.append(
                        f"{panel['title']}: cluster {name} {got[name]} at the global level, "
                        f"{own} in its own Prometheus, for {expr}"
                    )
    assert not failures, "\n".join(failures)
    assert checked > 10

    # What tells the clusters apart, by construction: b's TTFT p95 is 10x a's; a's model
    # rate sums its replicas' (12 good and 3 failed requests per capture, pages growing by
    # one and two captures per second), a fifth of them server errors.
    ttft = by_cluster(
        top.query(
            f'model:inferwatch_time_to_first_token_seconds:quantile_{w}{{quantile="0.95"}}', at
        )
    )
    assert ttft["b"] == pytest.approx(10 * ttft["a"])
    rate = by_cluster(top.query(f"model:inferwatch_requests_finished:{w}", at))
    assert rate == pytest.approx({"a": 45.0, "b": 36.0}, rel=0.05)
    errors = by_cluster(top.query(f"model:inferwatch_requests_finished:error_ratio_{w}", at))
    assert errors == pytest.approx({"a": 0.2, "b": 0.0}, rel=0.05)

    # ALERTS: each cluster's own, labelled with its cluster; each fault's alert in its
    # cluster only, for the instances (KV cache) or the model (errors) at fault.
    firing = {}
    for name, prom in clusters.items():
        here = top.query(f'ALERTS{{alertstate="firing", cluster="{name}"}}')
        firing[name] = {r["metric"]["alertname"] for r in here}
        own = {r["metric"]["alertname"] for r in prom.query('ALERTS{alertstate="firing"}')}
        assert firing[name] == own, f"cluster {name}: {firing[name]} globally, {own} in its own"
    assert "InferenceKVCachePressure" in firing["b"] - firing["a"], firing
    assert "InferenceRequestErrors" in firing["a"] - firing["b"], firing
    kv = top.query('ALERTS{alertname="InferenceKVCachePressure", alertstate="firing"}')
    assert {(r["metric"]["cluster"], r["metric"]["instance"]) for r in kv} == {
        ("b", target) for target in clusters["b"].targets
    }
    (errors,) = top.query('ALERTS{alertname="InferenceRequestErrors", alertstate="firing"}')
    assert errors["metric"]["cluster"] == "a"
    assert errors["metric"]["model"] == "tiny"
    print(firing, errors)


def test_the_deployment_page_recommends_what_the_global_view_federates() -> None:
    text = DEPLOYMENT.read_text()
    section = text[text.index("## Towards a fleet\n") :].partition("\n## ")[0]
    for name in ("honor_labels", "ALERTS", "external_labels", "fleet_labels"):
        assert name in section
    for name in re.findall(r"inferwatch_\w+", FEDERATE[2]):
        assert f"`{name}`" in section, name
