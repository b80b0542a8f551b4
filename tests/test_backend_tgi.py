"""TGI pages normalize to exactly the values on the page (see ``conftest.TGI_PAGE``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest
from aiohttp import web

from demo.stack import Prometheus
from inferwatch.collect.backends import TGI, detect
from inferwatch.collect.backends.mapping import Mapper
from inferwatch.collect.canary import CanarySample
from inferwatch.collect.poller import Poller, PollSettings
from inferwatch.collect.textparse import read_page
from inferwatch.collect.upstream import Upstream
from inferwatch.method.findings import exporter_report, fmt, phase_of
from inferwatch.method.rules import dump_yaml, rules_document
from inferwatch.method.spec import spec_from_config
from inferwatch.model import CollectorStatus, Histogram, Snapshot
from inferwatch.serve.exposition import render
from inferwatch.serve.sidecar import make_app
from inferwatch.serve.web import VERDICT
from inferwatch.tools import diagnose
from inferwatch.tools.report import render as render_report

from conftest import TGI_PAGE as PAGE
from conftest import assert_matches_oracle, fixture_text, thread_server

# A real TGI v3 page (DataDog's integration tests), its families copied whole.
REAL = "tgi-3.x-datadog-payload-excerpt.prom"

M = (("model", "meta-llama/Llama-3.1-8B-Instruct"),)  # GET /info -> model_id


def test_values_read_off_the_page() -> None:
    sample = TGI.normalize(PAGE, model_hint="meta-llama/Llama-3.1-8B-Instruct")
    assert sample.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert sample.values["requests_waiting"] == {M: 3.0}
    assert sample.values["requests_running"] == {M: 4.0}
    assert sample.values["engine_steps"] == {M: 1386.0}  # prefill 9 + decode 1377
    assert sample.values["prompt_tokens"] == {M: 4096.0}  # tgi_request_input_length_sum
    assert sample.values["generation_tokens"] == {M: 384.0}
    queue = sample.histograms["request_queue_time_seconds"][M]
    assert queue.buckets[:3] == (
        ("0.00015000000000000001", 0.0),
        ("0.00022500000000000002", 5.0),
        ("0.0003375", 9.0),
    )
    assert (queue.sum, queue.count) == (1.25, 12.0)
    assert sample.histograms["request_duration_seconds"][M].sum == 30.5
    assert sample.histograms["request_prompt_tokens"][M].buckets[0] == ("40.96", 2.0)


def test_what_tgi_does_not_provide_honestly_is_absent() -> None:
    sample = TGI.normalize(PAGE, model_hint="m")
    # The mean-time-per-token histogram includes prefill; the prefill batch histogram is
    # per batch: neither is exported as ITL or TTFT. Reserved batch tokens are not KV use.
    for key in (
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
        "request_time_per_output_token_seconds",  # mean_time_per_token includes prefill
    ):
        assert key not in sample.histograms, key
    for key in (
        "kv_cache_usage_ratio",
        "preemptions",
        "kv_cache_capacity_tokens",
        "spec_decode_draft_tokens",
        "spec_decode_accepted_tokens",
        "http_requests",
    ):
        assert key not in sample.values, key


def test_without_info_the_model_is_unknown() -> None:
    assert TGI.normalize(PAGE).model == "unknown"


def test_every_series_matches_an_independent_parse() -> None:
    assert_matches_oracle(TGI, PAGE, model_hint="m")


def test_auto_detection_recognises_tgi() -> None:
    assert detect(PAGE) is TGI


def test_a_real_tgi_page_maps_to_its_values() -> None:
    sample = TGI.normalize(fixture_text(REAL), model_hint="m")
    m = (("model", "m"),)
    assert sample.dropped == ()
    assert sample.values["requests_waiting"] == {m: 0.0}
    assert sample.values["requests_running"] == {m: 0.0}
    assert sample.values["engine_steps"] == {m: 1525.0}  # decode 1509 + prefill 16
    # 109 successes; its 2 validation failures are the client's errors, not counted.
    assert sample.values["requests_finished"] == {(*m, ("reason", "success")): 109.0}
    duration = sample.histograms["request_duration_seconds"][m]
    assert (duration.sum, duration.count) == (541.2140316159999, 109.0)
    assert dict(duration.buckets)["19.175105923288406"] == 108.0
    queue = sample.histograms["request_queue_time_seconds"][m]
    assert (queue.sum, queue.count, queue.buckets[0]) == (
        295.275961956,
        109.0,
        ("0.00015000000000000001", 9.0),
    )


@pytest.mark.parametrize("warm", [False, True], ids=["fresh", "warm"])
def test_tgi_failures_count_as_the_servers_errors_or_the_clients_aborts(warm: bool) -> None:
    # The real page with failures of every kind TGI counts (backends/v3's err values): the
    # server's refusals and faults are errors, a client gone is an abort, a request the
    # client got wrong is not a finished request. Warm: the mapper's page-layout path.
    page = fixture_text(REAL).replace(
        'tgi_request_failure{err="validation"} 2\n',
        'tgi_request_failure{err="validation"} 2\n'
        'tgi_request_failure{err="template"} 5\n'
        'tgi_request_failure{err="overloaded"} 7\n'
        'tgi_request_failure{err="generation"} 1\n'
        'tgi_request_failure{err="incomplete"} 2\n'
        'tgi_request_failure{err="dropped"} 3\n',
    )
    mapper = Mapper(TGI)
    for _ in range(3 if warm else 1):
        sample = mapper.normalize(page, "m")
    reason = {dict(k)["reason"]: v for k, v in sample.values["requests_finished"].items()}
    assert reason == {"success": 109.0, "error": 10.0, "abort": 3.0}


def test_a_real_tgi_pages_step_latency_by_kind() -> None:
    # tgi_batch_inference_duration by method: the step latency the method reads where
    # TGI has no per-request TTFT or inter-token histogram.
    steps = TGI.normalize(fixture_text(REAL), model_hint="m").histograms["engine_step_seconds"]
    decode = steps[(("model", "m"), ("kind", "decode"))]
    prefill = steps[(("model", "m"), ("kind", "prefill"))]
    assert (decode.count, decode.sum) == (1509.0, 90.32630366600002)
    assert dict(decode.buckets)["0.0656840835571289"] == 1434.0
    assert dict(decode.buckets)["0.49878850951194753"] == 1509.0
    assert (prefill.count, prefill.sum) == (16.0, 1.3892931830000002)
    assert dict(prefill.buckets)["0.22168378200531003"] == 15.0
    assert len(steps) == 2


def test_the_token_budget_and_what_the_batch_reserved() -> None:
    real = TGI.normalize(fixture_text(REAL), model_hint="m")
    assert real.values["batch_reserved_tokens"] == {(("model", "m"),): 0.0}
    assert "batch_token_budget" not in real.values  # set before the recorder: often absent
    page = "# TYPE tgi_batch_max_total_tokens gauge\ntgi_batch_max_total_tokens 16000\n"
    with_budget = TGI.normalize(fixture_text(REAL) + page, model_hint="m")
    assert with_budget.values["batch_token_budget"] == {(("model", "m"),): 16000.0}


def test_step_latency_falls_back_to_the_forward_duration() -> None:
    page = fixture_text(REAL)
    start = page.index("# HELP tgi_batch_inference_duration")
    steps = TGI.normalize(page[:start], model_hint="m").histograms["engine_step_seconds"]
    decode = steps[(("model", "m"), ("kind", "decode"))]
    assert (decode.count, decode.sum) == (1509.0, 89.03133092599998)


def test_method_is_a_kind_of_step_only() -> None:
    # engine_steps stays one series per pod: method is not a label of its contract series.
    sample = TGI.normalize(fixture_text(REAL), model_hint="m")
    assert list(sample.values["engine_steps"]) == [(("model", "m"),)]


def _exporter_page(tgi_page: str, canary: CanarySample | None = None) -> str:
    """inferwatch's /metrics page after a good poll of a TGI server serving ``tgi_page``
    (and the canary's probes so far, with ``canary``)."""
    snap = Snapshot(
        backend_kind="tgi",
        backend_up=True,
        backend_scrape_seconds=0.003,
        backend=TGI.normalize(tgi_page, model_hint="m"),
        collectors={"backend": CollectorStatus(True, 0.003)},
        sources={"canary": canary} if canary is not None else {},
    )
    return render(snap).decode()


def _canary(probes: int) -> CanarySample:
    """The canary after ``probes`` probes, each with its first token in (0.1, 0.25] s."""
    ttft = Histogram((("0.1", 0.0), ("0.25", probes), ("+Inf", probes)), 0.2 * probes, probes)
    done = Histogram((("+Inf", probes),), 0.5 * probes, probes)
    return CanarySample("m", ttft, done, done, {"ok": probes})


def _generated_tokens(page: str, requests: int, tokens: int) -> str:
    """The page with ``tgi_request_generated_tokens``, which the capture left out (a live
    TGI has it): ``requests`` finished requests that generated ``tokens`` in all."""
    return page + (
        "# TYPE tgi_request_generated_tokens histogram\n"
        f'tgi_request_generated_tokens_bucket{{le="+Inf"}} {requests}\n'
        f"tgi_request_generated_tokens_sum {tokens}\n"
        f"tgi_request_generated_tokens_count {requests}\n"
    )


def _slower_decode_steps(page: str, steps: int, seconds_each: float) -> str:
    """The real page ``steps`` decode steps later, each in the 0.148 s bucket."""
    out = []
    for line in page.splitlines():
        name, _, value = line.rpartition(" ")
        decode = name.startswith("tgi_batch_inference_duration") and 'method="decode"' in name
        if (
            decode and "_bucket" in name and float(name.split('le="')[1].split('"')[0]) >= 0.14
        ) or (decode and "_count" in name):
            line = f"{name} {int(value) + steps}"
        elif decode and "_sum" in name:
            line = f"{name} {float(value) + steps * seconds_each!r}"
        out.append(line)
    return "\n".join(out) + "\n"


def test_the_verdict_judges_a_real_tgi_page_by_its_decode_steps() -> None:
    # No TTFT or inter-token histogram on TGI: the phase is read off its decode steps, and
    # says so. Over the window the server took 1000 decode steps of ~0.14 s each.
    before = fixture_text(REAL)
    after = _slower_decode_steps(before, 1000, 0.14)
    spec = spec_from_config({})
    report = exporter_report(
        "tgi", read_page(_exporter_page(before)), read_page(_exporter_page(after)), 60.0, spec
    )
    # Read in ITL's place: the decode step latency. The canary is off here: neither TTFT
    # has series, so TTFT is named as itself, without a value.
    assert list(report.phase_signals) == ["ttft_p95", "decode_step_p95"]
    assert report.phase_signals["ttft_p95"] is None
    step = report.phase_signals["decode_step_p95"]
    assert step == pytest.approx(
        0.09852612533569335 + 0.95 * (0.14778918800354002 - 0.09852612533569335)
    )
    phase, detail = phase_of(report.phase_signals, spec)
    assert phase == "decode"
    assert detail.endswith(f"decode step p95 (server step latency) {fmt(step, 'seconds')} > 100 ms")
    text = render_report(report)
    assert "phase: decode" in text and "decode step p95 (server step latency)" in text


def test_a_real_tgi_page_with_slow_decode_steps_finds_the_decode_bottleneck() -> None:
    # The canary on (--canary auto on TGI): its first tokens are normal, the decode steps
    # slow. The finding's evidence names what was read: step latency and the canary's TTFT.
    page = fixture_text(REAL)
    before = _exporter_page(_generated_tokens(page, 109, 20_000), _canary(10))
    after = _exporter_page(
        _generated_tokens(_slower_decode_steps(page, 1000, 0.14), 150, 28_000), _canary(14)
    )
    spec = spec_from_config({})
    report = exporter_report("tgi", read_page(before), read_page(after), 60.0, spec)
    assert [f.alert.name for f in report.findings] == ["InferenceDecodeBottleneck"]
    evidence = {cond.measured: value for cond, value in report.findings[0].evidence}
    assert evidence["decode_step_p95"] == pytest.approx(
        0.09852612533569335 + 0.95 * (0.14778918800354002 - 0.09852612533569335)
    )
    assert evidence["canary_ttft_p95"] == pytest.approx(0.1 + 0.95 * 0.15)
    assert evidence["generation_rate"] == pytest.approx(8000 / 60)
    text = render_report(report)
    assert "decode step p95 (server step latency)" in text
    assert "TTFT p95 (canary, client side)" in text


class _TgiServer:
    """A loopback TGI whose /metrics answers the page the test sets."""

    def __init__(self, page: str) -> None:
        self.page = page

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.page, content_type="text/plain")

    async def info(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "3.3.6", "model_id": "m"})


async def test_the_verdict_page_names_what_it_read_on_tgi(aiohttp_server, aiohttp_client) -> None:
    # The exporter's own verdict over two polls of a real TGI page, its decode steps slower
    # in between: the phase, and the sparkline of per-token latency, say decode steps.
    tgi = _TgiServer(fixture_text(REAL))
    app = web.Application()
    app.router.add_get("/metrics", tgi.metrics)
    app.router.add_get("/info", tgi.info)
    server = await aiohttp_server(app)
    upstream = Upstream(str(server.make_url("")).rstrip("/"), timeout=2.0, max_bytes=1 << 24)
    now = [1000.0]
    poller = Poller(upstream, TGI, None, PollSettings(interval=0.2), clock=lambda: now[0])
    exporter = make_app(poller, run_poller=False)
    client = await aiohttp_client(exporter)
    try:
        for page in (tgi.page, _slower_decode_steps(tgi.page, 1000, 0.14)):
            tgi.page = page
            await poller.poll_once()
            await exporter[VERDICT].refresh()
            now[0] += 10.0
        doc = await (await client.get("/verdict.json")).json()
        html = await (await client.get("/")).text()
    finally:
        await upstream.close()
    assert doc["phase"] == "decode"
    assert "decode step p95 (server step latency)" in doc["phase_detail"]
    assert doc["series_info"]["itl_p95"]["label"] == "decode step p95 (server step latency)"
    # The page has the reserved tokens but not the budget gauge: no fallback to read.
    assert doc["series_info"]["kv_usage"]["label"] == "KV-cache use"
    assert "decode step p95 (server step latency)" in html


def test_diagnose_over_a_real_prometheus_reads_the_fallbacks_on_tgi(tmp_path: Path) -> None:
    # A real Prometheus scrapes an exporter page of a real TGI page whose decode steps slow
    # and whose canary answers (rebuilt on every scrape, counters growing with time), under
    # the generated rules with a 20 s window: diagnose --prometheus finds the decode
    # bottleneck, its evidence the decode steps and the canary's TTFT, as the verdict does.
    spec = spec_from_config({"alerting": {"rate_window": "20s", "evaluation_interval": "1s"}})
    page, start = fixture_text(REAL), time.monotonic()

    def exporter_page() -> bytes:
        t = time.monotonic() - start
        tgi_page = _generated_tokens(
            _slower_decode_steps(page, int(t * 20), 0.14), 109 + int(t), 20_000 + int(t * 100)
        )
        return _exporter_page(tgi_page, _canary(10 + int(t / 2))).encode()

    rules = tmp_path / "rules.yaml"
    rules.write_text(dump_yaml(rules_document(spec)))
    with contextlib.ExitStack() as stack:
        target = stack.enter_context(thread_server(lambda request: (200, exporter_page())))
        prometheus = Prometheus(tmp_path, [target], rule_files=[rules]).start()
        stack.callback(prometheus.stop)
        deadline = time.monotonic() + 120  # a guard against hanging, not a bound
        while not prometheus.query("instance:inferwatch_requests_finished:rate20s"):
            assert time.monotonic() < deadline, "the recording rules never evaluated"
            time.sleep(1)
        time.sleep(5)  # the rate window holds a few scrapes of the slower steps
        report = asyncio.run(diagnose.from_prometheus(prometheus.url, spec))
    decode = [f for f in report.findings if f.alert.name == "InferenceDecodeBottleneck"]
    assert decode, [f.alert.name for f in report.findings]
    read = {cond.signal: cond.measured for cond, _ in decode[0].evidence}
    assert read["itl_p95"] == "decode_step_p95" and read["ttft_p95"] == "canary_ttft_p95"
    assert list(report.phase_signals) == ["canary_ttft_p95", "decode_step_p95"]
    assert "decode step p95 (server step latency)" in render_report(report)
