"""Which contract families a :class:`Snapshot` holds, in page order: one writer for every
encoder (:mod:`inferwatch.serve.exposition`'s pages; ``bench/exposition.py`` feeds
prometheus_client's families the same way), so that no format can show another set.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from operator import attrgetter

from inferwatch import __version__
from inferwatch.gpu_gauges import GPU_GAUGES
from inferwatch.model import GpuSample, Labels, Sink, Snapshot

# GpuSample fields exposed one-to-one as gauges, besides the table's (GPU_GAUGES).
_GPU_FIELDS = (
    "utilization_ratio",
    "memory_used_bytes",
    "memory_total_bytes",
    "memory_bandwidth_peak_bytes_per_second",
    "pcie_peak_bytes_per_second",
    "nvlink_peak_bytes_per_second",
)


def write_snapshot(snap: Snapshot, sink: Sink) -> None:
    """Every contract family the snapshot holds, in page order; empty families are skipped
    by the sink."""
    kind = (("backend", snap.backend_kind),)
    sink.scalars("build_info", {(("version", __version__),): 1.0})
    sink.scalars("backend_up", {kind: float(snap.backend_up)})
    sink.scalars("backend_scrape_duration_seconds", {kind: snap.backend_scrape_seconds})
    dropped = snap.series_dropped
    sink.scalars("backend_series_dropped", {(*kind, ("reason", r)): n for r, n in dropped.items()})
    status = snap.collectors
    sink.scalars(
        "collector_success", {(("collector", c),): float(s.success) for c, s in status.items()}
    )
    sink.scalars(
        "collector_duration_seconds",
        {(("collector", c),): s.duration_seconds for c, s in status.items()},
    )
    sample = snap.backend
    if sample is not None:
        prefix = (("backend", sample.backend),)
        info = (*prefix, ("version", sample.version), ("model", sample.model))
        if snap.server:
            info = (*info, ("server", snap.server))
        if snap.role:
            info = (*info, ("role", snap.role))
        sink.scalars("backend_info", {info: 1.0})
        for key, series in sample.values.items():
            sink.scalars(key, series, prefix)
        for key, hseries in sample.histograms.items():
            sink.histograms(key, hseries, prefix)
    _write_gpus(snap.gpus, sink)
    d = snap.derived
    sink.scalars("queued_while_idle", {k: float(v) for k, v in d.queued_while_idle.items()})
    sink.scalars("queued_while_idle_seconds", d.queued_while_idle_seconds_total)
    sink.scalars("decode_floor_seconds", d.decode_floor_seconds)
    for key, series in d.latency_window.items():
        sink.scalars(key, series)
    for key, series in snap.baseline.items():
        sink.scalars(key, series)
    for name in sorted(snap.sources):
        snap.sources[name].write(sink, snap.backend_kind)


def _write_gpus(gpus: tuple[GpuSample, ...], sink: Sink) -> None:
    for field in _GPU_FIELDS:
        sink.scalars(f"gpu_{field}", _each(gpus, attrgetter(field)))
    for gauge in GPU_GAUGES:
        sink.scalars(gauge.name, _each(gpus, lambda g, name=gauge.name: g.gauges.get(name)))
    sink.scalars("gpu_busy_seconds", _each(gpus, attrgetter("busy_seconds_total")))
    sink.scalars(
        "gpu_clock_throttled",
        _each_by(gpus, "reason", lambda g: {r: float(on) for r, on in g.clock_throttled.items()}),
    )
    sink.scalars(
        "gpu_pcie_bytes_per_second",
        _each_by(gpus, "direction", attrgetter("pcie_bytes_per_second")),
    )
    sink.scalars("gpu_nvlink_bytes", _each_by(gpus, "direction", attrgetter("nvlink_bytes_total")))
    # Health: a GPU that is failing.
    for key in ("row_remap_pending", "row_remap_failed", "retired_pages_pending"):
        sink.scalars(f"gpu_{key}", _each(gpus, attrgetter(f"health.{key}")))
    sink.scalars("gpu_pcie_replays", _each(gpus, attrgetter("health.pcie_replays_total")))
    ecc = {
        (*g.labels, ("error", error), ("counter", counter)): n
        for g in gpus
        for (error, counter), n in g.health.ecc_errors_total.items()
    }
    sink.scalars("gpu_ecc_errors", ecc)
    sink.scalars("gpu_remapped_rows", _each_by(gpus, "kind", attrgetter("health.remapped_rows")))
    sink.scalars("gpu_xid_errors", _each_by(gpus, "xid", attrgetter("health.xid_errors_total")))


def _each(
    gpus: tuple[GpuSample, ...], value: Callable[[GpuSample], float | None]
) -> dict[Labels, float]:
    """Each GPU's value; a GPU without one left out."""
    return {g.labels: v for g in gpus if (v := value(g)) is not None}


def _each_by(
    gpus: tuple[GpuSample, ...], label: str, values: Callable[[GpuSample], Mapping[str, float]]
) -> dict[Labels, float]:
    """Each GPU's values by ``label`` (its directions, its throttle reasons...)."""
    return {(*g.labels, (label, k)): v for g in gpus for k, v in values(g).items()}
