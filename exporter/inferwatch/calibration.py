"""What a baseline determines: the thresholds that judge the service, and the objectives it
can promise (``inferwatch calibrate``, ``generate --baseline FILE``).

Each number comes with one line saying where it came from (:class:`Derived`), for the
config file's comments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from inferwatch.baseline import Baseline, Cell
from inferwatch.method.thresholds import THRESHOLDS


@dataclass(frozen=True)
class Derived:
    """A threshold computed from a baseline, and in one line where it came from."""

    value: float
    source: str


# A quantile needs samples: fewer requests than this in a rate window and the p95 rests on a
# handful of them. 15 is what the shipped default assumes (0.05 requests/s over 5 m).
MIN_REQUESTS_PER_WINDOW = 15
# The latency thresholds and the quantile of each cell they come from.
_LATENCY = (
    ("ttft_p95_seconds", "TTFT p95", Cell.ttft, "p95"),
    ("itl_p95_seconds", "ITL p95", Cell.itl, "p95"),
    ("itl_p99_seconds", "ITL p99", Cell.itl, "p99"),
)


def _significant(value: float) -> float:
    return float(f"{value:.4g}")


def _where(cell: Cell) -> str:
    return (
        f"concurrency {cell.concurrency} (prompt {cell.prompt_tokens or 'file'}, "
        f"output {cell.output_tokens})"
    )


def _client_gap(baseline: Baseline, concurrency: int) -> tuple[float, Cell] | None:
    """What the sweep's path added to the server's TTFT p50 at ``concurrency`` (the largest
    over its cells), where the sweep read the server's histograms."""
    gaps = [
        (c.ttft_seconds.get("p50") - c.server_ttft_seconds.get("p50"), c)
        for c in baseline.cells
        if c.concurrency == concurrency and c.server_ttft_seconds is not None
    ]
    return max(gaps, key=lambda g: g[0]) if gaps else None


def _server_bound(baseline: Baseline, kind: str, factor: float) -> tuple[float, str] | None:
    """The server's smallest ``kind`` bucket bound at or above ``factor`` x its p99 at the
    highest concurrency (the worst cell there), and where that came from; None without the
    server's bounds (a sweep of the client side only) or its histograms there."""
    bounds = (baseline.metadata.get("server_bucket_bounds") or {}).get(kind)
    busiest = baseline.busiest()
    if not busiest or not bounds:
        return None
    latency = Cell.ttft if kind == "ttft" else Cell.itl
    values, side, cell = max(((*latency(c), c) for c in busiest), key=lambda m: m[0].p99)
    above = [b for b in sorted(bounds) if b >= factor * values.p99]
    if side != "server" or values.p99 <= 0 or not above:
        return None
    why = (
        f"the server's smallest {kind.upper()} bucket bound at or above {factor:g} x "
        f"{values.p99:.4g} s, its {kind.upper()} p99 at {_where(cell)}"
    )
    return above[0], why


def _latency_thresholds(busiest: list[Cell], factor: float) -> dict[str, Derived]:
    """``factor`` x each latency quantile (:data:`_LATENCY`) of the worst busiest cell."""
    out: dict[str, Derived] = {}
    for name, label, latency, q in _LATENCY:
        measured = [(*latency(cell), cell) for cell in busiest]
        values, side, cell = max(measured, key=lambda m: m[0].get(q))
        value = values.get(q)
        if value > 0:
            if side == "server decode step":  # TGI's per-token latency (Cell.itl)
                side, label = "server", f"decode step {q}"
            out[name] = Derived(
                _significant(factor * value),
                f"{factor:g} x {value:.4g} s, the {side}'s {label} at {_where(cell)}",
            )
    return out


def thresholds_from(baseline: Baseline, factor: float, window_seconds: float) -> dict[str, Derived]:
    """The thresholds a baseline determines, each with its source.

    - Latency: ``factor`` x the p95 (p99) measured at the highest concurrency (the worst
      cell there), as the rules see it (:meth:`Cell.ttft`, :meth:`Cell.itl`).
    - Traffic: the rate under which quantiles are not judged, ``MIN_REQUESTS_PER_WINDOW``
      requests per rate window, but at most half of what the lowest measured concurrency
      carried (so a slow service is still judged at its own light load); the token rate
      is that many requests of the shortest measured answer.
    - The client gap: ``factor`` x what the sweep's path added to the server's TTFT at the
      lowest concurrency, where that is above the default (a path measured slower is the
      service's normal; a faster one keeps the default's margin for noise).
    - The ITL tail bound: the server's smallest ITL bucket bound at or above ``factor`` x
      its ITL p99 at the highest concurrency (a gap counted above a bound, not a quantile
      interpolated in a wide bucket).
    """
    busiest = baseline.busiest()
    if not busiest:
        return {}
    out = _latency_thresholds(busiest, factor)
    lowest = min(c.concurrency for c in baseline.cells)
    light = min((c for c in baseline.cells if c.concurrency == lowest), key=_rate)
    enough = MIN_REQUESTS_PER_WINDOW / window_seconds
    if 0 < light.requests_per_second / 2 < enough:
        rate = Derived(
            _significant(light.requests_per_second / 2),
            f"half of the {light.requests_per_second:g} requests/s measured at {_where(light)}",
        )
    else:
        rate = Derived(
            _significant(enough),
            f"{MIN_REQUESTS_PER_WINDOW} requests per {window_seconds:g} s rate window",
        )
    out["min_request_rate"] = rate
    gap = _client_gap(baseline, lowest)
    if gap is not None and factor * gap[0] > THRESHOLDS["client_gap_seconds"].default:
        out["client_gap_seconds"] = Derived(
            _significant(factor * gap[0]),
            f"{factor:g} x {gap[0]:.4g} s, client TTFT p50 - server TTFT p50 at {_where(gap[1])}",
        )
    tail = _server_bound(baseline, "itl", factor)
    if tail is not None:
        out["itl_tail_bound_seconds"] = Derived(*tail)
    shortest = min(_tokens_per_request(c) for c in baseline.cells)
    if shortest > 0:
        out["min_token_rate"] = Derived(
            _significant(rate.value * shortest),
            f"min_request_rate x {shortest:g} tokens, the shortest measured answer",
        )
    return out


# Objectives calibrate proposes: this share of events within a bound above what the service
# measured at its busiest (the thresholds' factor). Not 99 %: a sweep's p99 under-samples the
# tail, and a 99 % promise there spends the budget in normal operation; tighten it once the
# tail is known.
PROPOSED_TARGET = 0.95
PROPOSED_ERRORS_TARGET = 0.999


def objectives_from(baseline: Baseline, factor: float) -> dict[str, tuple[dict, str]]:
    """SLO objectives (the config's ``slos.objectives`` entries) and where each came from.

    A latency bound is the server's smallest histogram bucket bound at or above ``factor`` x
    the p99 measured at the highest concurrency: an SLI counts good events per bucket, so no
    other number can be measured. Without the server's bounds in the baseline (a sweep of
    the client side only) no latency objective is proposed.
    """
    out: dict[str, tuple[dict, str]] = {}
    for kind in ("ttft", "itl"):
        bound = _server_bound(baseline, kind, factor)
        if bound is not None:
            out[kind] = ({"target": PROPOSED_TARGET, "seconds": bound[0]}, bound[1])
    out["errors"] = (
        {"target": PROPOSED_ERRORS_TARGET},
        "no measure: one request in a thousand may fail; the sweep saw "
        f"{sum(c.errors for c in baseline.cells)} errors in "
        f"{sum(c.requests for c in baseline.cells)} requests",
    )
    return out


def _rate(cell: Cell) -> float:
    return cell.requests_per_second


def _tokens_per_request(cell: Cell) -> float:
    if not cell.requests_per_second:
        return 0.0
    return round(cell.output_tokens_per_second / cell.requests_per_second, 1)


# What the sidecar judges under normal traffic, and the thresholds set from it: (threshold,
# signal, how far above the largest window reading the threshold goes). The rules judge one
# rate window at a time, and a window's reading varies from window to window under the
# same load more than a sweep's percentile over all its requests says.
NORMAL_MARGIN = 2.0
# The CPU wait as odds (wait per second of run time): the threshold is the share at which
# the server waits this many times as long per CPU second as it did at most when healthy.
CPU_WAIT_ODDS = 4.0
# A frontend held by one interpreter lock tops out near one core: a small margin above
# what it used when healthy, or the threshold would be out of its reach.
FRONTEND_MARGIN = 1.25
READ_UNDER_NORMAL_TRAFFIC = (
    ("ttft_p95_seconds", "ttft_p95", NORMAL_MARGIN),
    ("itl_p95_seconds", "itl_p95", NORMAL_MARGIN),
    ("itl_p99_seconds", "itl_p99", NORMAL_MARGIN),
    ("itl_tail_share", "itl_tail_share", NORMAL_MARGIN),
    ("client_gap_seconds", "canary_ttft_gap", NORMAL_MARGIN),
    ("server_cpu_wait_share", "server_cpu_wait_share", CPU_WAIT_ODDS),
    ("frontend_cpu_cores", "frontend_cpu", FRONTEND_MARGIN),
)
_LATENCY_READ = ("ttft_p95_seconds", "itl_p95_seconds", "itl_p99_seconds")


@dataclass(frozen=True)
class NormalReadings:
    """What the sidecar read under normal traffic: each signal over every whole rate window
    it could (one reading a second), and why a signal has none."""

    values: dict[str, tuple[float, ...]]
    seconds: float  # of normal traffic read
    absent: dict[str, str]  # signal -> why it was not read


def _above(name: str, most: float, margin: float) -> float:
    """``margin`` above the largest reading: times it, or for the CPU wait, in odds."""
    if name != "server_cpu_wait_share":
        return margin * most
    if most >= 1:
        return 1.0
    odds = margin * most / (1 - most)
    return odds / (1 + odds)


def _margin_text(name: str, margin: float, most: float, values: tuple[float, ...]) -> str:
    unit = {"s": " s", "cores": " cores"}.get(THRESHOLDS[name].unit, "")
    spread = (
        f"{len(values)} readings of whole rate windows under normal traffic, "
        f"{min(values):.4g} to {most:.4g}{unit}"
    )
    if name == "server_cpu_wait_share":
        return (
            f"the share at which the server waits {margin:g} x as long per CPU second as at "
            f"most under normal traffic ({spread})"
        )
    return f"{margin:g} x {most:.4g}{unit}, the largest of {spread}"


def thresholds_from_readings(
    readings: NormalReadings, spec_threshold: Callable[[str], float], sources: Mapping[str, str]
) -> tuple[dict[str, Derived], dict[str, str]]:
    """The thresholds the readings under normal traffic set, each with its source, and why
    each of the others was not measured. ``spec_threshold``: each threshold so far (the
    sweep's where it measured one, else the default), whose source ``sources`` holds: a
    reading above it raises it, one under keeps it (measured: the healthy server stays
    under it). The regression factor rises as far as the latency thresholds did."""
    out: dict[str, Derived] = {}
    why_not: dict[str, str] = {}
    raised = 1.0
    for name, signal, margin in READ_UNDER_NORMAL_TRAFFIC:
        values = readings.values.get(signal, ())
        if not values:
            why_not[name] = readings.absent.get(signal, "no reading under normal traffic")
            continue
        most, current = max(values), spec_threshold(name)
        wanted = _above(name, most, margin)
        reason = _margin_text(name, margin, most, values)
        if name == "itl_tail_share" and wanted >= 0.5:
            why_not[name] = (
                f"{most:.1%} of the token gaps under normal traffic are above the tail bound: "
                "no tail can be told from the normal"
            )
        elif wanted > current:
            out[name] = Derived(_significant(wanted), reason)
            if name in _LATENCY_READ:
                raised = max(raised, wanted / current)
        else:
            kept = sources.get(name, "the default")
            out[name] = Derived(current, f"{kept} kept, above {reason}")
    if raised > 1.0:
        factor = spec_threshold("regression_factor")
        out["regression_factor"] = Derived(
            _significant(factor * raised),
            f"{factor:g} x {raised:.3g}, as far as the latency thresholds rose over the "
            "readings under normal traffic",
        )
    return out, why_not
