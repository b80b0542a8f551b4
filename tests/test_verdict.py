"""The verdict page (``/``) and its JSON twin, from the exporter's own polls of captures."""

from __future__ import annotations

import asyncio
import base64
import re
import time
from pathlib import Path
from unittest.mock import ANY

import bcrypt
import pytest
from aiohttp import web
from test_otlp import PROTOBUF, export_request, request_span

from demo.stack import chromium
from inferwatch.collect.backends import BACKENDS, VLLM
from inferwatch.collect.poller import Poller, PollSettings
from inferwatch.collect.upstream import Upstream
from inferwatch.method.findings import Report, fmt
from inferwatch.method.spec import spec_from_config
from inferwatch.serve import verdict as verdict_module
from inferwatch.serve.basic_auth import BasicAuthUsers
from inferwatch.serve.otlp import OtlpSettings
from inferwatch.serve.sidecar import make_app
from inferwatch.serve.web import VERDICT
from inferwatch.serve.webconfig import WebConfig
from inferwatch.tools import diagnose
from inferwatch.tools.credentials import Credentials
from inferwatch.tools.report import render as report_text
from inferwatch.tools.report import report_json

from conftest import fixture_text

KV_FULL = fixture_text("vllm-0.32.0-cpu-loaded-kv-full.prom")
AFTER = fixture_text("vllm-0.32.0-cpu-after-preemptions.prom")
HOSTILE_MODEL = "<img src=x onerror=alert(1)>"


class Backend:
    """A loopback vLLM whose page the test sets; ``None`` answers 500."""

    def __init__(self) -> None:
        self.page: str | None = KV_FULL

    async def metrics(self, request: web.Request) -> web.Response:
        if self.page is None:
            return web.Response(status=500, text="Internal Server Error")
        return web.Response(text=self.page, content_type="text/plain")

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0"})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def exporter(aiohttp_server, aiohttp_client):
    """(backend, clock, poller, make_client, apps): an exporter whose poller runs on a fake
    clock and polls only when the test says so (:func:`poll`), each poll recorded by the
    verdict as the running app's task does."""
    async for parts in _exporter(aiohttp_server, aiohttp_client, VLLM):
        yield parts


@pytest.fixture
async def router_exporter(aiohttp_server, aiohttp_client):
    """The same, next to vllm-router."""
    async for parts in _exporter(aiohttp_server, aiohttp_client, BACKENDS["vllm-router"]):
        yield parts


async def _exporter(aiohttp_server, aiohttp_client, table):
    backend = Backend()
    app = web.Application()
    app.router.add_get("/metrics", backend.metrics)
    app.router.add_get("/version", backend.version)
    server = await aiohttp_server(app)
    clock = Clock()
    upstream = Upstream(str(server.make_url("")).rstrip("/"), timeout=2.0, max_bytes=1 << 24)
    poller = Poller(upstream, table, None, PollSettings(interval=0.2), clock=clock)

    apps: list[web.Application] = []

    async def client(**kwargs):
        apps.append(make_app(poller, run_poller=False, **kwargs))
        return await aiohttp_client(apps[-1])

    yield backend, clock, poller, client, apps
    await upstream.close()


async def poll(exporter, *pages: str | None) -> None:
    """One poll per page, 10 s apart on the poller's clock."""
    backend, clock, poller, _, apps = exporter
    for page in pages:
        backend.page = page
        await poller.poll_once()
        for app in apps:
            await app[VERDICT].refresh()
        clock.now += 10.0


async def get(client, path: str = "/", **kwargs) -> tuple[str, dict]:
    page = await client.get(path, **kwargs)
    assert page.status == 200
    doc = await client.get("/verdict.json", **kwargs)
    assert doc.status == 200
    return await page.text(), await doc.json()


def finding_html(page: str, alert: str) -> str:
    match = re.search(rf'<div class="finding [a-z]+" data-alert="{alert}"[^>]*>(.*?)</div>', page)
    assert match, f"no finding {alert} on the page"
    return match.group(1)


def spark_html(page: str, name: str) -> str:
    match = re.search(rf'<div class="spark" data-series="{name}">(.*?)</div>(?=<div|</div>)', page)
    assert match, f"no sparkline {name}"
    return match.group(1)


async def test_kv_pressure_is_named_with_its_evidence_on_page_and_json(exporter) -> None:
    client = await exporter[3]()
    await poll(exporter, KV_FULL, AFTER, AFTER)
    page, doc = await get(client)
    spec = spec_from_config({})
    assert doc["state"] == "findings"
    assert doc["window_seconds"] == 20.0  # three polls 10 s apart, inside the 5m window
    assert doc["labels"] == {"backend": "vllm", "model": "tiny"}
    assert [f["alert"] for f in doc["findings"]] == ["InferenceKVCachePressure"]
    kv = doc["findings"][0]
    assert (kv["severity"], kv["phase"], kv["layer"]) == ("warning", "decode", "memory")
    assert kv["runbook"] == "runbooks/InferenceKVCachePressure"  # the sidecar serves it
    evidence = {e["signal"]: e for e in kv["evidence"]}
    assert evidence["preemption_rate"]["value"] == pytest.approx(33 / 20)  # 33 preemptions
    assert evidence["preemption_rate"]["threshold"] == spec.threshold("preemptions_per_second")
    assert evidence["preemption_rate"]["holds"] is True
    assert evidence["kv_usage"]["holds"] is False  # full, then empty: 67 % on average
    assert doc["phase"] == "prefill"  # TTFT p95 above 2 s, ITL p95 below 100 ms
    assert doc["phase_signals"]["ttft_p95"] > spec.threshold("ttft_p95_seconds")

    # The page says the same, from the same document.
    assert '<meta http-equiv="refresh"' in page
    assert "<script" not in page and "http://" not in page.split("<code>")[0]
    assert 'id="status">warning: InferenceKVCachePressure</div>' in page
    assert "<b>phase: prefill</b>" in page
    for finding in doc["findings"]:
        block = finding_html(page, finding["alert"])
        assert f'<a href="{finding["runbook"]}">runbook</a>' in block
        for e in finding["evidence"]:
            assert e["label"] in block
            assert fmt(e["value"], e["unit"]) in block
            assert fmt(e["threshold"], e["unit"]) in block
    # Sparklines: a polyline where two windows have data, "no data" where none has.
    assert [len(points) for points in doc["series"].values()] == [2] * len(doc["series"])
    running = doc["series"]["running"]
    assert all(value is not None for _, value in running)
    assert running[1][0] - running[0][0] == pytest.approx(10.0)  # the polls' spacing
    assert re.search(
        r'<polyline [^>]*points="[\d.]+,[\d.]+ [\d.]+,[\d.]+"', spark_html(page, "running")
    )
    assert doc["series"]["gpu_busy"] == [[t, None] for t, _ in doc["series"]["gpu_busy"]]
    assert "no data" in spark_html(page, "gpu_busy")  # no NVML here: not a flat zero
    assert "<svg" not in spark_html(page, "gpu_busy")


async def test_next_to_a_router_each_worker_is_judged_and_named(
    router_exporter, tmp_path: Path
) -> None:
    """Real vllm-router pages: a replica killed, then failed by the router's health check."""
    router = [fixture_text(f"vllm-router-0.1.17{c}.prom") for c in ("", "-one-down")]
    client = await router_exporter[3]()
    await poll(router_exporter, *router)
    page, doc = await get(client)
    dead = "http://127.0.0.1:18102"
    assert [(f["alert"], f["labels"]) for f in doc["findings"]] == [
        (
            "InferenceRouterFailingWorker",
            {"backend": "vllm-router", "model": "unknown", "worker": dead},
        )
    ]
    evidence = {e["signal"]: e["value"] for e in doc["findings"][0]["evidence"]}
    # 38 tries less 29 successes, of the 13 tries since the healthy page; its check passes.
    assert evidence == {"router_worker_failure_share": 9 / 13, "router_worker_healthy": 1.0}
    block = finding_html(page, "InferenceRouterFailingWorker")
    assert f"worker={dead}" in block and "backend=" not in block  # the page's labels name those
    dom = await asyncio.to_thread(
        chromium, "--dump-dom", str(client.make_url("/")), profile=tmp_path / "profile"
    )
    assert dom.returncode == 0 and f"worker={dead}" in dom.stdout, dom.stderr
    # Once the router's own check fails the replica, it has taken it out: nothing to page.
    await poll(router_exporter, fixture_text("vllm-router-0.1.17-one-down-unhealthy.prom"))
    page, doc = await get(client)
    assert doc["state"] == "healthy", doc["findings"]
    # Its sparklines are the router's, every worker added: 50, 77 then 83 tries, 10 s apart.
    assert list(doc["series"]) == list(verdict_module.ROUTER_SERIES)
    assert [v for _, v in doc["series"]["router_request_rate"]] == pytest.approx([2.7, 0.6])
    assert "no data" not in spark_html(page, "router_request_rate")
    assert 'data-series="ttft_p95"' not in page  # no engine behind a router's port
    assert doc["router"] and "phase: none" not in page and "<b>a router</b>" in page


async def test_a_quiet_sequence_has_no_finding(exporter) -> None:
    client = await exporter[3]()
    await poll(exporter, AFTER, AFTER)
    page, doc = await get(client)
    assert (doc["state"], doc["findings"], doc["phase"]) == ("healthy", [], "none")
    assert "healthy: no alert condition" in page and 'class="finding' not in page


async def test_collecting_until_two_polls(exporter) -> None:
    client = await exporter[3]()
    page, doc = await get(client)
    assert doc["state"] == "collecting" and doc["latest_poll_backend_up"] is None
    assert "collecting" in page
    await poll(exporter, AFTER)
    _, doc = await get(client)
    assert doc["state"] == "collecting" and doc["latest_poll_backend_up"] is True


async def test_a_down_backend_is_said_and_named(exporter) -> None:
    client = await exporter[3]()
    await poll(exporter, None)
    page, doc = await get(client)
    assert doc["latest_poll_backend_up"] is False
    assert "backend down" in page
    await poll(exporter, AFTER, None)
    page, doc = await get(client)
    assert "backend down" in page
    assert doc["findings"][0]["alert"] == "InferenceBackendDown"
    assert doc["findings"][0]["evidence"][0] == {
        "signal": "backend_up",
        "label": "backend up",
        "value": 0.0,
        "op": "==",
        "threshold": 0.0,
        "threshold_name": None,
        "unit": "count",
        "role": "any_of",
        "holds": True,
        "text": "backend up 0 == 0",
    }
    assert 'data-alert="InferenceBackendDown"' in page


async def test_hostile_label_values_are_escaped(exporter) -> None:
    hostile = AFTER.replace('model_name="tiny"', f'model_name="{HOSTILE_MODEL}"')
    client = await exporter[3]()
    await poll(exporter, hostile, hostile)
    page, doc = await get(client)
    assert doc["labels"]["model"] == HOSTILE_MODEL
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page


async def test_a_failing_verdict_never_reaches_the_request(exporter, monkeypatch) -> None:
    client = await exporter[3]()
    await poll(exporter, AFTER, AFTER)
    _, before = await get(client)

    def broken(self, text):
        raise RuntimeError("bug")

    monkeypatch.setattr(verdict_module.PageReader, "read", broken)
    await poll(exporter, KV_FULL)
    _page, doc = await get(client)
    assert doc["state"] == before["state"] == "healthy"  # the last good verdict stays
    assert (await client.get("/metrics")).status == 200


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def test_basic_auth_covers_the_verdict(exporter) -> None:
    users = BasicAuthUsers({"alice": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4))})
    client = await exporter[3](web_config=WebConfig(users=users))
    await poll(exporter, KV_FULL, AFTER)
    for path in ("/", "/verdict.json", "/metrics"):
        assert (await client.get(path)).status == 401
        assert (await client.get(path, headers=basic("alice", "wrong"))).status == 401
    assert (await client.get("/healthz")).status != 401  # as before: probes need no login
    _page, doc = await get(client, headers=basic("alice", "s3cret"))
    assert doc["findings"][0]["alert"] == "InferenceKVCachePressure"


async def test_the_spec_given_is_the_verdicts(exporter) -> None:
    spec = spec_from_config(
        {
            "thresholds": {"queue_share_high": 0.3},
            "alerting": {"runbook_url_base": "https://runbooks.example/"},
        }
    )
    client = await exporter[3](spec=spec)
    await poll(exporter, KV_FULL, AFTER)
    _, doc = await get(client)
    names = {f["alert"]: f["runbook"] for f in doc["findings"]}
    assert names == {
        "InferenceKVCachePressure": "https://runbooks.example/InferenceKVCachePressure.md",
        "InferenceQueueingDelay": "https://runbooks.example/InferenceQueueingDelay.md",
    }


async def test_a_finding_is_pending_until_it_has_held_for_its_for(exporter) -> None:
    """As Prometheus holds an alert pending for its ``for``, the verdict says how long each
    finding has held and whether that is still short of it: a p95 over its threshold for a
    few seconds on a healthy server is pending, not a warning to act on."""
    spec = spec_from_config({"alerting": {"for": {"InferenceKVCachePressure": "15s"}}})
    client = await exporter[3](spec=spec)
    await poll(exporter, KV_FULL, AFTER)  # the first verdict: it holds from now
    page, doc = await get(client)
    (kv,) = doc["findings"]
    assert (kv["for"], kv["holding_seconds"], kv["pending"]) == ("15s", 0.0, True)
    assert "pending: held 0 s of its 15s" in finding_html(page, "InferenceKVCachePressure")
    await poll(exporter, AFTER, AFTER)  # two more verdicts, 10 s apart: held 20 s
    page, doc = await get(client)
    (kv,) = doc["findings"]
    assert (kv["holding_seconds"], kv["pending"]) == (20.0, False)
    assert "pending" not in finding_html(page, "InferenceKVCachePressure")


def queued_span(seconds: float):
    """The real span, as if it had waited ``seconds`` in the queue before its prefill."""
    span = request_span()
    for attribute in span.attributes:
        if attribute.key in ("gen_ai.latency.time_in_queue", "gen_ai.latency.time_to_first_token"):
            attribute.value.double_value += seconds
    return span


async def test_a_finding_the_slowest_requests_contradict_says_so(exporter) -> None:
    """The pages say the first tokens queue (InferenceQueueingDelay at a calibrated 30 %); the
    real vLLM span says its first token waited in prefill (30 us queued, 4.5 ms of prefill):
    the finding says the spans disagree, until slower requests that queued agree with it."""
    spec = spec_from_config({"thresholds": {"queue_share_high": 0.3}})
    client = await exporter[3](spec=spec, otlp=OtlpSettings(most=5))
    await poll(exporter, KV_FULL, AFTER)

    async def send(*spans) -> None:
        body = export_request(*spans, startup=False).SerializeToString()
        assert (await client.post("/v1/traces", data=body, headers=PROTOBUF)).status == 200

    await send(request_span())
    page, doc = await get(client)
    said = {f["alert"]: f["requests"] for f in doc["findings"]}
    assert said == {
        # It names no place: a preempted request's recompute is inside its prefill time.
        "InferenceKVCachePressure": None,
        "InferenceQueueingDelay": {
            "agree": False,
            "text": "the spans disagree: 1 of the 1 slowest first tokens waited longest in "
            "prefill, not in the queue",
        },
    }
    assert said["InferenceQueueingDelay"]["text"] in finding_html(page, "InferenceQueueingDelay")
    await send(*(queued_span(1.0 + i) for i in range(3)))
    _, doc = await get(client)
    said = {f["alert"]: f["requests"] for f in doc["findings"]}
    assert said["InferenceQueueingDelay"] == {
        "agree": True,
        "text": "the spans agree: 3 of the 4 slowest first tokens waited longest in the queue",
    }


async def judged_by_diagnose(exporter, client, **kwargs) -> Report:
    """``diagnose --exporter`` against the app, with the second poll between its scrapes."""
    url = str(client.make_url("")).rstrip("/")
    await poll(exporter, KV_FULL)

    async def second_poll() -> None:
        await asyncio.sleep(0.5)
        await poll(exporter, AFTER)

    report, _ = await asyncio.gather(
        diagnose.from_exporter(url, interval=1.0, **kwargs), second_poll()
    )
    return report


async def test_diagnose_without_a_config_judges_with_the_exporters_spec(exporter) -> None:
    # A calibrated config (queue share 30 %): the built-in defaults (50 %) would not see the
    # queueing; diagnose, given no --config, judges as the verdict page does.
    spec = spec_from_config(
        {"backend": "vllm", "thresholds": {"queue_share_high": 0.3, "ttft_p95_seconds": 0.5}}
    )
    client = await exporter[3](spec=spec)
    report = await judged_by_diagnose(exporter, client)
    _, doc = await get(client)
    served = [(f["alert"], f["explained_by"]) for f in doc["findings"]]
    assert [(f.alert.name, f.explained_by) for f in report.findings] == served
    assert served == [
        ("InferenceKVCachePressure", None),
        ("InferenceQueueingDelay", "InferenceKVCachePressure"),
    ]
    assert report.spec == spec
    assert report.judged_with.startswith("the exporter's own spec (http://127.0.0.1:")
    assert report_json(report)["phase"] == {"phase": doc["phase"], "detail": ANY}
    assert report_text(report).split("\n")[1].startswith("judged with the exporter's own")


async def test_the_spec_served_reads_back_as_the_spec(exporter) -> None:
    spec = spec_from_config(
        {
            "backend": "vllm",
            "thresholds": {"queue_share_high": 0.3},
            "alerting": {"for": {"InferenceKVCachePressure": "2m"}, "fleet_labels": ["cluster"]},
            "slos": {"objectives": {"ttft": {"target": 0.99, "seconds": 0.5}}},
        }
    )
    client = await exporter[3](spec=spec)
    answer = await client.get("/spec.json")
    assert answer.status == 200
    assert spec_from_config(await answer.json()) == spec


async def test_diagnose_reads_a_protected_exporter_with_the_captures_credentials(
    exporter,
) -> None:
    users = BasicAuthUsers({"alice": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4))})
    client = await exporter[3](web_config=WebConfig(users=users))
    assert (await client.get("/spec.json")).status == 401
    url = str(client.make_url("")).rstrip("/")
    with pytest.raises(diagnose.SourceError, match="HTTP 401"):
        await diagnose.from_exporter(url, interval=1.0)
    alice = Credentials(basic("alice", "s3cret")["Authorization"])
    report = await judged_by_diagnose(exporter, client, credentials=alice)
    assert [f.alert.name for f in report.findings] == ["InferenceKVCachePressure"]


async def test_the_running_app_records_polls_without_requests(aiohttp_server, aiohttp_client):
    backend = Backend()
    backend.page = AFTER
    app = web.Application()
    app.router.add_get("/metrics", backend.metrics)
    app.router.add_get("/version", backend.version)
    server = await aiohttp_server(app)
    upstream = Upstream(str(server.make_url("")).rstrip("/"), timeout=2.0, max_bytes=1 << 24)
    poller = Poller(upstream, VLLM, None, PollSettings(interval=0.05))
    exporter_app = make_app(poller)
    history = exporter_app[VERDICT]
    history.step = 0.0
    await aiohttp_client(exporter_app)
    deadline = time.monotonic() + 120  # a guard against hanging, not a performance bound
    while len(history.series()["running"]) < 3:
        assert time.monotonic() < deadline, "the verdict recorded no polls"
        await asyncio.sleep(0.05)
    assert history.verdict.state == "healthy"


async def test_a_real_browser_renders_the_verdict(exporter, tmp_path: Path) -> None:
    client = await exporter[3]()
    await poll(exporter, KV_FULL, AFTER, AFTER)
    url = str(client.make_url("/"))
    dom = await asyncio.to_thread(chromium, "--dump-dom", url, profile=tmp_path / "profile")
    assert dom.returncode == 0, dom.stderr
    text = dom.stdout
    assert 'id="status">warning: InferenceKVCachePressure</div>' in text
    assert re.search(r'data-alert="InferenceKVCachePressure"', text)
    assert re.search(r'<polyline [^>]*points="[\d.]+,[\d.]+ [\d.]+,[\d.]+"', text)
    shot = tmp_path / "verdict.png"
    taken = await asyncio.to_thread(
        chromium,
        f"--screenshot={shot}",
        "--window-size=1200,1600",
        "--hide-scrollbars",
        url,
        profile=tmp_path / "profile",
    )
    assert taken.returncode == 0, taken.stderr
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"verdict page screenshot: {shot}")


async def test_the_sidecar_serves_each_runbook_behind_its_auth(exporter, tmp_path: Path) -> None:
    users = BasicAuthUsers({"alice": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4))})
    spec = spec_from_config({"thresholds": {"kv_usage_high": 0.8}})
    client = await exporter[3](web_config=WebConfig(users=users), spec=spec)
    alice = basic("alice", "s3cret")
    await poll(exporter, KV_FULL, AFTER)
    assert (await client.get("/runbooks/InferenceKVCachePressure")).status == 401
    answer = await client.get("/runbooks/InferenceKVCachePressure", headers=alice)
    assert answer.status == 200 and answer.content_type == "text/html"
    page = await answer.text()
    assert "<h1>InferenceKVCachePressure</h1>" in page
    assert "<h2>What it means</h2>" in page and "<h2>The rule</h2>" in page
    assert "<td><code>kv_usage_high</code></td>\n<td>0.8 " in page  # the spec it judges with
    assert "<pre><code" in page  # the rule's PromQL
    slo_page = await client.get("/runbooks/InferenceSLOFastBurn", headers=alice)
    assert slo_page.status == 200
    for name in ("NotAnAlert", "..%2Fspec.json", "InferenceKVCachePressure.md"):
        assert (await client.get(f"/runbooks/{name}", headers=alice)).status == 404, name
    # The verdict page links there.
    _, doc = await get(client, headers=alice)
    assert doc["findings"][0]["runbook"] == "runbooks/InferenceKVCachePressure"


async def test_a_real_browser_renders_a_runbook(exporter, tmp_path: Path) -> None:
    client = await exporter[3]()
    url = str(client.make_url("/runbooks/InferenceQueuedWhileIdle"))
    dom = await asyncio.to_thread(chromium, "--dump-dom", url, profile=tmp_path / "profile")
    assert dom.returncode == 0, dom.stderr
    assert "<h2>Likely causes, most likely first</h2>" in dom.stdout
    shot = tmp_path / "runbook.png"
    taken = await asyncio.to_thread(
        chromium, f"--screenshot={shot}", "--window-size=1000,1400", url, profile=tmp_path / "p"
    )
    assert taken.returncode == 0, taken.stderr
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"runbook page screenshot: {shot}")


async def test_a_share_never_exceeds_the_window(exporter) -> None:
    """An engine that stops progressing with requests waiting: the stall is counted from its
    start once it has lasted a second, so a sparkline window that begins inside that second
    gains more queued-while-idle seconds than it lasts. The share still reads at most 1."""
    backend, clock, poller, client, apps = exporter
    await client()
    steps = 'vllm:iteration_tokens_total_count{engine="0",model_name="tiny"} 496.0'
    assert steps in KV_FULL
    for n in range(60):  # polls 0.5 s apart; the engine steps until the 9th, then freezes
        backend.page = KV_FULL.replace(steps, steps.replace("496.0", f"{496 + min(n, 9)}.0"))
        await poller.poll_once()
        await apps[0][VERDICT].refresh()
        clock.now += 0.5
    doc = apps[0][VERDICT].document()
    shares = [value for _, value in doc["series"]["queued_while_idle_ratio"]]
    assert shares and all(value is None or 0.0 <= value <= 1.0 for value in shares), shares
    assert shares[-1] == 1.0  # stalled throughout the last window
    for finding in doc["findings"]:
        for item in finding["evidence"]:
            assert item["unit"] != "ratio" or item["value"] is None or 0 <= item["value"] <= 1, item


async def test_only_a_windows_pages_are_kept(exporter) -> None:
    """The sparklines keep 15 minutes of points; of the pages, the verdict reads the oldest
    inside its window and never an older one, so older ones are not kept."""
    _, _, _, client, apps = exporter
    await client()
    await poll(exporter, *[KV_FULL, AFTER] * 25)  # 50 polls 10 s apart
    history = apps[0][VERDICT]
    doc = history.document()
    kept = [at for at, _ in history._pages]
    assert history.window == 300.0
    assert kept[-1] - kept[0] == history.window and len(kept) == 31
    assert doc["window_seconds"] == history.window  # the verdict still spans the window
    assert len(doc["series"]["running"]) == 49  # every point but the first has a window


async def test_a_usual_verdict_is_computed_on_the_loop_a_huge_ones_in_a_thread(
    exporter, monkeypatch
) -> None:
    """A thread hop costs more than a usual page's verdict; a snapshot of more series than
    INLINE_SERIES has its verdict computed in a worker thread, so that requests keep being
    answered meanwhile."""
    _, _, poller, client, apps = exporter
    await client()
    hops: list[str] = []
    to_thread = asyncio.to_thread

    async def counted(fn, *args):
        hops.append(fn.__name__)
        return await to_thread(fn, *args)

    monkeypatch.setattr(verdict_module.asyncio, "to_thread", counted)
    await poll(exporter, AFTER, KV_FULL)
    assert verdict_module._series(poller.snapshot) <= verdict_module.INLINE_SERIES
    assert hops == [] and apps[0][VERDICT].verdict.state == "findings"
    monkeypatch.setattr(verdict_module, "INLINE_SERIES", 1)
    await poll(exporter, AFTER)
    assert hops == ["_compute"] and apps[0][VERDICT].verdict.state != "collecting"
