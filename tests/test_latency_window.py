"""The exporter's latency quantiles over the rate window (collect/window.py).

That they equal Prometheus' own ``histogram_quantile`` over the raw buckets is proven through
promtool in tests/test_signals.py; here, what a window holds as polls come and go: counter
resets, engines, a backend that goes away, series that appear or change their bounds.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from test_hostile_pages import PageUpstream

from inferwatch.collect.backends import VLLM
from inferwatch.collect.poller import Poller, PollSettings
from inferwatch.collect.window import MIN_SPAN, STEPS, LatencyWindow
from inferwatch.model import BackendSample, Histogram, Labels
from inferwatch.serve.exposition import render

from conftest import fixture_text

ITL = "inter_token_latency_seconds"
TTFT = "time_to_first_token_seconds"
FAMILY = "inter_token_latency_window_seconds"
BOUNDS = ("0.1", "0.5", "1.0", "+Inf")


def hist(*counts: float, bounds: tuple[str, ...] = BOUNDS) -> Histogram:
    return Histogram(tuple(zip(bounds, counts, strict=True)), 0.0, counts[-1])


def sample(engines: dict[str, Histogram], model: str = "m", key: str = ITL) -> BackendSample:
    """A page whose ``key`` histogram has one series per engine ("" for none)."""
    series: dict[Labels, Histogram] = {
        (("model", model), *((("engine", e),) if e else ())): h for e, h in engines.items()
    }
    return BackendSample("vllm", model, histograms={key: series})


def q(out: dict, quantile: str, model: str = "m", family: str = FAMILY) -> float:
    return out[family][(("backend", "vllm"), ("model", model), ("quantile", quantile))]


def test_absent_until_the_exporter_has_polled_a_minute_or_the_whole_window() -> None:
    window = LatencyWindow(300.0)
    assert window.update(0.0, sample({"": hist(0, 0, 0, 0)})) == {}
    assert window.update(MIN_SPAN - 1, sample({"": hist(10, 10, 10, 10)})) == {}
    assert q(window.update(MIN_SPAN, sample({"": hist(10, 10, 10, 10)})), "0.5") == 0.05
    short = LatencyWindow(15.0)  # a window shorter than a minute: once it is whole
    short.update(0.0, sample({"": hist(0, 0, 0, 0)}))
    assert short.update(14.0, sample({"": hist(10, 10, 10, 10)})) == {}
    assert q(short.update(15.0, sample({"": hist(10, 10, 10, 10)})), "0.99") == 0.099


def test_the_window_holds_only_its_own_observations() -> None:
    window = LatencyWindow(60.0)
    window.update(0.0, sample({"": hist(0, 0, 0, 0)}))
    window.update(30.0, sample({"": hist(100, 100, 100, 100)}))  # all fast
    out = window.update(60.0, sample({"": hist(100, 100, 100, 120)}))
    assert q(out, "0.5") == pytest.approx(0.1 * 60 / 100)  # 100 fast, 20 slow since 0 s
    # 90 s: the window starts at 30 s; only the 20 slow ones and 20 new medium ones are in it.
    out = window.update(90.0, sample({"": hist(100, 120, 120, 140)}))
    assert q(out, "0.5") == pytest.approx(0.1 + 0.4 * 20 / 20)
    assert q(out, "0.95") == 1.0  # in the +Inf bucket: the highest finite bound
    out = window.update(140.0, sample({"": hist(100, 120, 120, 140)}))
    assert math.isnan(q(out, "0.5"))  # nothing observed since 90 s: NaN, as PromQL
    # No poll inside the window but this one: nothing to take a rate of, as in PromQL.
    assert window.update(240.0, sample({"": hist(100, 120, 120, 140)})) == {}


def test_a_counter_reset_counts_from_zero_as_prometheus_rate() -> None:
    window = LatencyWindow(60.0)
    window.update(0.0, sample({"": hist(50, 50, 50, 50)}))
    window.update(30.0, sample({"": hist(60, 60, 60, 60)}))  # 10 fast
    out = window.update(60.0, sample({"": hist(0, 0, 10, 10)}))  # restarted: 10 slow since
    assert q(out, "0.5") == pytest.approx(0.1)  # 10 fast + 10 at (0.5, 1]: the median at 0.1
    assert q(out, "0.95") == pytest.approx(0.5 + 0.5 * 9 / 10)


def test_engines_of_a_model_are_pooled_and_models_kept_apart() -> None:
    window = LatencyWindow(60.0)
    zero = hist(0, 0, 0, 0)
    window.update(0.0, sample({"0": zero, "1": zero}))
    out = window.update(60.0, sample({"0": hist(10, 10, 10, 10), "1": hist(0, 0, 10, 10)}))
    assert q(out, "0.5") == pytest.approx(0.1)  # 20 observations: 10 fast, 10 slow
    assert q(out, "0.95") == pytest.approx(0.5 + 0.5 * 9 / 10)
    assert set(out) == {FAMILY}  # no TTFT on these pages: no TTFT family
    ttft = LatencyWindow(60.0)
    ttft.update(0.0, sample({"": zero}, key=TTFT))
    assert q(
        ttft.update(60.0, sample({"": hist(0, 4, 4, 4)}, key=TTFT)),
        "0.5",
        family="time_to_first_token_window_seconds",
    ) == pytest.approx(0.3)


def test_a_backend_that_goes_away_keeps_its_window() -> None:
    window = LatencyWindow(60.0)
    window.update(0.0, sample({"": hist(0, 0, 0, 0)}))
    window.update(30.0, sample({"": hist(10, 10, 10, 10)}))
    assert q(window.update(60.0, None), "0.5") == 0.05  # down: the window spans the gap
    out = window.update(75.0, sample({"": hist(10, 10, 10, 30)}))
    assert q(out, "0.5") == 1.0  # the 20 since 30 s are all over 1 s: the highest finite bound


def test_new_series_count_from_their_first_poll_and_gone_ones_are_dropped() -> None:
    window = LatencyWindow(60.0)
    window.update(0.0, sample({"": hist(0, 0, 0, 0)}, model="a"))
    # Model b appears with 1,000 observations already made: they are not the window's.
    window.update(30.0, sample({"": hist(1000, 1000, 1000, 1000)}, model="b"))
    out = window.update(60.0, sample({"": hist(1000, 1000, 1010, 1010)}, model="b"))
    assert set(out[FAMILY]) == {
        (("backend", "vllm"), ("model", "b"), ("quantile", x)) for x in ("0.5", "0.95", "0.99")
    }
    assert q(out, "0.5", model="b") == pytest.approx(0.75)  # only the 10 new, all slow


def test_new_bounds_start_a_new_series() -> None:
    window = LatencyWindow(60.0)
    window.update(0.0, sample({"": hist(100, 100, 100, 100)}))
    other = ("0.2", "+Inf")
    out = window.update(60.0, sample({"": hist(10, 10, bounds=other)}))
    assert q(out, "0.5") == pytest.approx(0.1)  # 10 new observations under 0.2, from zero


def test_the_history_stays_bounded_however_fast_it_polls() -> None:
    window = LatencyWindow(60.0)
    for i in range(10_000):  # 100 Hz for 100 s
        window.update(i / 100, sample({"": hist(i, i, i, i)}))
    assert len(window._past) <= STEPS + 2
    assert q(window.update(100.0, sample({"": hist(1e4, 1e4, 1e4, 1e4)})), "0.5") == 0.05


def test_a_poll_every_tenth_of_a_second_has_its_histograms_read_once_a_second() -> None:
    read: list[str] = []

    class Watched(dict):
        def get(self, key: str, default: object = None) -> object:
            read.append(key)
            return super().get(key, default)

    window = LatencyWindow(300.0)
    for i in range(601):  # 60 s at 10 Hz, one more fast observation every poll
        polled = sample({"": hist(i, i, i, i)})
        window.update(i / 10, BackendSample("vllm", "m", histograms=Watched(polled.histograms)))
    assert len(read) == 61 * 2  # each summarized histogram at 0, 1, ..., 60 s
    # What grew between two folds is counted at the next: nothing is lost.
    assert window._totals[(ITL, "vllm", (("model", "m"),))].count == 600


def test_a_bug_in_the_window_leaves_out_its_series_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: LatencyWindow, now: float, sample: BackendSample | None) -> dict:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(LatencyWindow, "update", broken)
    upstream = PageUpstream(fixture_text("vllm-0.32.0-cpu-loaded-kv-full.prom"))
    poller = Poller(upstream, VLLM, None, PollSettings())
    snaps = [asyncio.run(poller.poll_once()) for _ in range(3)]
    assert all(s.backend_up and s.backend is not None for s in snaps)
    page = render(snaps[-1]).decode()
    assert "inferwatch_time_to_first_token_seconds_bucket" in page
    assert "_window_seconds" not in page
    failures = [r for r in caplog.records if "latency window failed" in r.getMessage()]
    assert len(failures) == 1  # once, then at most once a minute


def test_the_quantiles_are_computed_once_when_read_not_at_every_poll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    computed = []
    monkeypatch.setattr(
        "inferwatch.collect.window.histogram_quantile",
        lambda q, buckets: computed.append(q) or 0.5,
    )
    window = LatencyWindow(60.0)
    for i in range(100):  # a minute and more of polls, nobody reading
        out = window.update(float(i), sample({"": hist(i, i, i, i)}))
    assert computed == []
    assert q(out, "0.5") == 0.5 and q(out, "0.99") == 0.5
    assert len(computed) == 3  # each quantile of the one series, once
    assert q(out, "0.95") == 0.5 and len(computed) == 3


def test_a_bug_in_computing_the_quantiles_when_read_leaves_out_their_series_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(q: float, buckets: list) -> float:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr("inferwatch.collect.window.histogram_quantile", broken)
    monkeypatch.setattr("inferwatch.collect.window.MIN_SPAN", 0.0)
    clock = iter(range(1000))
    upstream = PageUpstream(fixture_text("vllm-0.32.0-cpu-loaded-kv-full.prom"))
    poller = Poller(upstream, VLLM, None, PollSettings(), clock=lambda: float(next(clock)))
    snaps = [asyncio.run(poller.poll_once()) for _ in range(3)]
    page = render(snaps[-1]).decode()
    assert "inferwatch_backend_up 1" in page.replace('{backend="vllm"}', "")
    assert "inferwatch_time_to_first_token_seconds_bucket" in page
    assert "_window_seconds" not in page
    assert any("latency window failed" in r.getMessage() for r in caplog.records)
