"""Exposition by numbers: the hand renderer against prometheus_client (prints figures; not a test).

The exporter renders each format once per poll (when the first scrape after the poll asks
for it) and serves those bytes until the next poll, so the work that matters is one render
of one snapshot. Per render, it times:

- ``hand text 0.0.4``: :func:`inferwatch.serve.exposition.render`, the exporter's own
  writer, its label-text cache warm (label sets repeat from poll to poll on a live
  exporter); ``label cache cold``: the same with the cache cleared before every render (the
  first poll's cost).
- ``prometheus_client text``: a custom collector, registered once in a
  ``CollectorRegistry``, that builds fresh ``GaugeMetricFamily``/``CounterMetricFamily``/
  ``HistogramMetricFamily`` objects from the snapshot on every collect, encoded by
  ``prometheus_client.generate_latest``; ``collect only``: building the families alone.
- ``hand OpenMetrics 1.0.0``: :func:`inferwatch.serve.exposition.render_openmetrics`.
- ``prometheus_client OpenMetrics``: the same collector through
  ``prometheus_client.openmetrics.exposition.generate_latest``.
- the ``process_*``/``python_*`` section (prometheus_client's Process/Platform/GC collectors
  and encoders, :class:`inferwatch.serve.selfmetrics.SelfMetrics`) that the exporter adds to
  each page it renders, whichever renderer writes the rest.

The snapshots are the exporter's own: the four real vLLM 0.32 captures in tests/fixtures,
each through the real poll (``Poller.poll_once``: the backend's normalize, a fake NVML with
two H100s as the tests use, the derived signals, the baseline fixture). Only the network is
left out (an in-process upstream hands the poller each capture), as a render never touches
it. Every renderer rotates through the four snapshots.

Before timing, the script checks that all four pages of every snapshot carry the same
samples (read back with prometheus_client's text and OpenMetrics parsers), so the figures
compare like with like. Each figure is the median of ``--renders`` timed renders
(``time.perf_counter``) after 50 untimed ones; the ratios are against the hand renderer of
the same format, measured in the same run.

    .venv/bin/python bench/exposition.py [--renders 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import version
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_text

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the fake NVML the tests use

from inferwatch.baseline import load as load_baseline  # noqa: E402
from inferwatch.collect.backends import VLLM  # noqa: E402
from inferwatch.collect.gpu import GpuSource  # noqa: E402
from inferwatch.collect.poller import Poller, PollSettings  # noqa: E402
from inferwatch.collect.upstream import Upstream  # noqa: E402
from inferwatch.metrics import ALL, Kind  # noqa: E402
from inferwatch.model import Histogram, Labels, Snapshot  # noqa: E402
from inferwatch.serve import exposition, families  # noqa: E402
from inferwatch.serve.selfmetrics import SelfMetrics  # noqa: E402

from fake_nvml import FakeGpu, FakeNvml  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
CAPTURES = sorted(FIXTURES.glob("vllm-0.32.0-cpu-*.prom"))
BASELINE = FIXTURES / "baseline-vllm-0.32.0-cpu-tiny.yaml"


class CaptureUpstream(Upstream):
    """The captures in turn, in process: a render never touches the network."""

    def __init__(self, pages: list[str]) -> None:
        super().__init__("http://vllm:8000", timeout=1.0, max_bytes=1 << 24)
        self.pages = pages
        self.served = 0

    async def get_exposition(self, path: str) -> str:
        self.served += 1
        return self.pages[(self.served - 1) % len(self.pages)]

    async def get_json_field(self, path: str, field: str) -> str:
        return "0.32.0"


def snapshots() -> list[Snapshot]:
    """One snapshot per capture, as a live exporter publishes them (the real poll path), the
    captures polled a minute apart (so the latency window has its quantiles)."""
    gpus = [FakeGpu(0, util=80, gpm_supported=True), FakeGpu(1, util=35)]
    source = GpuSource(nvml=FakeNvml(gpus))
    source.start()
    settings = PollSettings(
        interval=0.1, model_weights_bytes=16e9, baseline=load_baseline(BASELINE)
    )
    clock = [0.0]
    poller = Poller(
        CaptureUpstream([c.read_text() for c in CAPTURES]),
        VLLM,
        source,
        settings,
        clock=lambda: clock[0],
    )

    async def polls() -> list[Snapshot]:
        await poller.poll_once()  # warm up: the busy-seconds integration needs two samples
        out = []
        for _ in CAPTURES:
            clock[0] += 60.0
            out.append(await poller.poll_once())
        return out

    out = asyncio.run(polls())
    assert all(s.backend_up and s.gpus and s.baseline for s in out)
    return out


# -- prometheus_client: a custom collector over the snapshot -----------------------------


def _family(key: str) -> Metric:
    spec = ALL[key]
    if spec.kind is Kind.COUNTER:
        return CounterMetricFamily(spec.name, spec.help)  # strips _total; samples get it
    if spec.kind is Kind.HISTOGRAM:
        return HistogramMetricFamily(spec.name, spec.help)
    return GaugeMetricFamily(spec.name, spec.help)


class _Families:
    """A :class:`~inferwatch.serve.families.Sink` that builds prometheus_client families."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def scalars(self, key: str, series: Mapping[Labels, float], prefix: Labels = ()) -> None:
        if not series:
            return
        family = _family(key)
        name = family.name + ("_total" if family.type == "counter" else "")
        for labels, value in series.items():
            family.add_sample(name, dict(prefix + labels), value)
        self.families.append(family)

    def histograms(self, key: str, series: Mapping[Labels, Histogram], prefix: Labels) -> None:
        if not series:
            return
        family = _family(key)
        name = family.name
        for labels, hist in series.items():
            base = dict(prefix + labels)
            for le, count in hist.buckets:
                family.add_sample(name + "_bucket", {**base, "le": le}, count)
            if not math.isnan(hist.count):
                family.add_sample(name + "_count", base, hist.count)
            if not math.isnan(hist.sum):
                family.add_sample(name + "_sum", base, hist.sum)
        self.families.append(family)


class SnapshotCollector:
    """The exporter's families, built fresh from the current snapshot on every collect(),
    walked by the exporter's own :func:`~inferwatch.serve.families.write_snapshot`."""

    def __init__(self, current: Callable[[], Snapshot]) -> None:
        self.current = current

    def collect(self) -> Iterable[Metric]:
        sink = _Families()
        families.write_snapshot(self.current(), sink)
        return sink.families


# -- the comparison ----------------------------------------------------------------------


def samples_of(page: bytes, parse: Callable) -> set[tuple]:
    """Every sample on a page as (name, sorted labels, value), ``le`` read as a number."""
    out = set()
    for family in parse(page.decode()):
        for s in family.samples:
            labels = {k: (repr(float(v)) if k == "le" else v) for k, v in s.labels.items()}
            value = "NaN" if math.isnan(s.value) else s.value
            out.add((s.name, tuple(sorted(labels.items())), value))
    return out


def check_same_samples(snaps: list[Snapshot], renderers: dict[str, Callable]) -> int:
    """Every page of every snapshot holds the same samples; returns how many a page has."""
    counts = set()
    for snap in snaps:
        want = samples_of(exposition.render(snap), parse_text)
        for label, (render, parse) in renderers.items():
            got = samples_of(render(snap), parse)
            assert got == want, (label, sorted(got ^ want)[:5])
        counts.add(len(want))
    return max(counts)


def median_ms(render: Callable[[Snapshot], object], snaps: list[Snapshot], n: int) -> float:
    for i in range(50):
        render(snaps[i % len(snaps)])
    times = []
    for i in range(n):
        snap = snaps[i % len(snaps)]
        start = time.perf_counter()
        render(snap)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--renders", type=int, default=2000, help="timed renders per figure")
    args = parser.parse_args()

    snaps = snapshots()
    current = {"snap": snaps[0]}
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: current["snap"]))

    def pc_text(snap: Snapshot) -> bytes:
        current["snap"] = snap
        return generate_latest(registry)

    def pc_openmetrics(snap: Snapshot) -> bytes:
        current["snap"] = snap
        return openmetrics.generate_latest(registry)

    def pc_collect_only(snap: Snapshot) -> list[Metric]:
        current["snap"] = snap
        return list(registry.collect())

    def hand_cold(snap: Snapshot) -> bytes:
        exposition._label_text.clear()
        return exposition.render(snap)

    per_page = check_same_samples(
        snaps,
        {
            "hand OpenMetrics": (exposition.render_openmetrics, parse_openmetrics),
            "prometheus_client text": (pc_text, parse_text),
            "prometheus_client OpenMetrics": (pc_openmetrics, parse_openmetrics),
        },
    )
    sizes = [len(exposition.render(s)) for s in snaps]
    self_metrics = SelfMetrics()
    section = self_metrics.section(openmetrics=False)
    print(f"python {platform.python_version()}, prometheus_client {version('prometheus_client')}")
    print(
        f"snapshots: {', '.join(c.name for c in CAPTURES)}, each through the poller with 2 fake "
        f"GPUs and a baseline: {per_page} samples, {min(sizes) / 1024:.0f}-"
        f"{max(sizes) / 1024:.0f} KiB a page; the four renderers' pages carry the same samples"
    )
    print(f"median ms per render, over {args.renders} renders each:")
    figures = {
        "hand text 0.0.4": median_ms(exposition.render, snaps, args.renders),
        "hand text 0.0.4, label cache cold": median_ms(hand_cold, snaps, args.renders),
        "prometheus_client text": median_ms(pc_text, snaps, args.renders),
        "prometheus_client, collect only": median_ms(pc_collect_only, snaps, args.renders),
        "hand OpenMetrics 1.0.0": median_ms(exposition.render_openmetrics, snaps, args.renders),
        "prometheus_client OpenMetrics": median_ms(pc_openmetrics, snaps, args.renders),
    }
    hand, hand_om = figures["hand text 0.0.4"], figures["hand OpenMetrics 1.0.0"]
    for label, ms in figures.items():
        ref = hand_om if "OpenMetrics" in label else hand
        ratio = "" if ms == ref else f"  = {ms / ref:.1f}x the hand renderer"
        print(f"  {label:44s} {ms:6.3f} ms{ratio}")
    for label, om in (("text", False), ("OpenMetrics", True)):
        ms = median_ms(lambda _, om=om: self_metrics.section(om), snaps, args.renders)
        print(
            f"  {'+ process_*/python_* section, ' + label:44s} {ms:6.3f} ms  "
            f"(added to every page; {section.count(chr(10))} lines)"
        )


if __name__ == "__main__":
    main()
