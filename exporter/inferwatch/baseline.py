"""The baseline file: what the service measured under known load, to compare live latency with.

``inferwatch baseline`` writes it (a load sweep, ``tools/sweep/``); ``serve --baseline FILE``
exposes the cell comparable to the load as ``inferwatch_baseline_*`` gauges; ``generate
--baseline FILE`` derives the latency thresholds from it. Format (YAML)::

    inferwatch_baseline: 1
    metadata: {date: ..., backend: vllm, version: 0.32.0, model: tiny, gpu: ..., api: completions}
    cells:
    - concurrency: 4
      prompt_tokens: 256          # requested prompt length
      output_tokens: 64
      requests: 40
      errors: 0
      ttft_seconds: {p50: 0.031, p95: 0.052, p99: 0.06}      # client side
      itl_seconds: {p50: 0.011, p95: 0.017, p99: 0.024}
      e2e_seconds: {p50: 0.79, p95: 0.91, p99: 0.95}
      requests_per_second: 4.9
      output_tokens_per_second: 313.0
      server_ttft_seconds: {p50: 0.025, p95: 0.047, p99: 0.055}   # optional: the server's
      server_itl_seconds: {p50: 0.009, p95: 0.015, p99: 0.021}    # histograms, same window
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from inferwatch.method.thresholds import THRESHOLDS
from inferwatch.model import BackendSample, Labels
from inferwatch.settings import ConfigError, non_negative_number, read_text

FORMAT_VERSION = 1
QUANTILES = ("p50", "p95", "p99")
# The `percentile` label of the exposed gauges -> the cell's field. (Not `quantile`: that
# label belongs to summaries, and `promtool check metrics` flags it on a gauge.)
PERCENTILE_LABELS = {"50": "p50", "95": "p95", "99": "p99"}
# Cell fields a sweep without the server's histograms leaves out.
OPTIONAL_FIELDS = ("server_ttft_seconds", "server_itl_seconds")


@dataclass(frozen=True)
class Quantiles:
    p50: float
    p95: float
    p99: float

    def get(self, name: str) -> float:
        return getattr(self, name)


@dataclass(frozen=True)
class Cell:
    """One point of the sweep: a concurrency, a prompt and an output length."""

    concurrency: int
    prompt_tokens: int
    output_tokens: int
    requests: int
    errors: int
    ttft_seconds: Quantiles
    itl_seconds: Quantiles
    e2e_seconds: Quantiles
    requests_per_second: float
    output_tokens_per_second: float
    server_ttft_seconds: Quantiles | None = None
    server_itl_seconds: Quantiles | None = None

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.concurrency, self.prompt_tokens, self.output_tokens)

    def ttft(self) -> tuple[Quantiles, str]:
        """TTFT as the rules see it: the server's histogram where the sweep read it, else
        the client's timing; and which side it is."""
        if self.server_ttft_seconds is not None:
            return self.server_ttft_seconds, "server"
        return self.ttft_seconds, "client"

    def itl(self) -> tuple[Quantiles, str]:
        """Inter-token latency as the rules see it (see :meth:`ttft`)."""
        if self.server_itl_seconds is not None:
            return self.server_itl_seconds, "server"
        return self.itl_seconds, "client"


@dataclass(frozen=True)
class Baseline:
    metadata: Mapping[str, Any]
    cells: tuple[Cell, ...] = field(default_factory=tuple)

    def comparable(self, running: float) -> Cell | None:
        """The cell to compare live latency with at ``running`` concurrent requests.

        The nearest measured concurrency (a tie goes to the higher level: a live load between
        two levels is heavier than the lower one, and must not be held to its latency); among
        its cells, the one with the median prompt length.
        """
        if not self.cells:
            return None
        levels = sorted({c.concurrency for c in self.cells})
        nearest = min(levels, key=lambda level: (abs(level - running), -level))
        at_level = sorted((c for c in self.cells if c.concurrency == nearest), key=lambda c: c.key)
        return at_level[(len(at_level) - 1) // 2]

    def busiest(self) -> list[Cell]:
        """Cells at the highest measured concurrency."""
        top = max((c.concurrency for c in self.cells), default=0)
        return [c for c in self.cells if c.concurrency == top]


def series(
    baseline: Baseline, sample: BackendSample, running: float
) -> dict[str, dict[Labels, float]]:
    """The ``inferwatch_baseline_*`` series of the cell comparable to ``running`` requests
    (the load over the rate window: :mod:`inferwatch.collect.load`)."""
    cell = baseline.comparable(running)
    if cell is None:
        return {}
    base = (
        ("backend", sample.backend),
        ("model", sample.model),
        ("concurrency", str(cell.concurrency)),
        ("prompt_tokens", str(cell.prompt_tokens)),
        ("output_tokens", str(cell.output_tokens)),
    )
    out: dict[str, dict[Labels, float]] = {}
    # Live latency comes from the server's histograms: compare it with the same side.
    for key, values in (
        ("baseline_time_to_first_token_seconds", cell.ttft()[0]),
        ("baseline_inter_token_latency_seconds", cell.itl()[0]),
        ("baseline_request_duration_seconds", cell.e2e_seconds),
    ):
        out[key] = {
            (*base, ("percentile", label)): values.get(name)
            for label, name in PERCENTILE_LABELS.items()
        }
    return out


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
    out: dict[str, Derived] = {}
    for name, label, latency, q in _LATENCY:
        measured = [(*latency(cell), cell) for cell in busiest]
        values, side, cell = max(measured, key=lambda m: m[0].get(q))
        value = values.get(q)
        if value > 0:
            out[name] = Derived(
                _significant(factor * value),
                f"{factor:g} x {value:.4g} s, the {side}'s {label} at {_where(cell)}",
            )
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
# tail (vLLM on CPU here: 1-4 % of first tokens past 1.5 x the sweep's p99), and a 99 % promise
# there spends the budget in normal operation; tighten it once the tail is known.
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


def to_yaml(baseline: Baseline) -> str:
    doc = {
        "inferwatch_baseline": FORMAT_VERSION,
        "metadata": dict(baseline.metadata),
        "cells": [_cell_doc(c) for c in baseline.cells],
    }
    return yaml.safe_dump(doc, sort_keys=False)


def _cell_doc(cell: Cell) -> dict[str, Any]:
    doc = asdict(cell)
    for name in OPTIONAL_FIELDS:
        if doc[name] is None:
            del doc[name]
    return doc


def load(path: Path) -> Baseline:
    """Read and validate a baseline file; ConfigError names the file and what is wrong."""
    try:
        text = read_text(path)
    except ConfigError as exc:
        raise ConfigError(f"baseline {exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"baseline {path}: not YAML ({getattr(exc, 'problem', exc)})") from None
    try:
        return parse(doc)
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"baseline {path}: {exc}") from None


def parse(doc: Any) -> Baseline:
    if not isinstance(doc, dict) or doc.get("inferwatch_baseline") != FORMAT_VERSION:
        raise ValueError(
            f"not an inferwatch baseline (expected `inferwatch_baseline: {FORMAT_VERSION}`)"
        )
    unknown = set(doc) - {"inferwatch_baseline", "metadata", "cells"}
    if unknown:
        raise ValueError(f"unknown key {sorted(unknown)[0]!r}")
    metadata = doc.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ValueError("metadata: expected a mapping")
    cells = doc.get("cells")
    if not isinstance(cells, list) or not cells:
        raise ValueError("cells: expected a non-empty list")
    parsed = tuple(_cell(c, i) for i, c in enumerate(cells))
    keys = [c.key for c in parsed]
    if len(set(keys)) != len(keys):
        raise ValueError("cells: two cells with the same concurrency, prompt and output tokens")
    return Baseline(metadata=metadata, cells=parsed)


_CELL_FIELDS = {f for f in Cell.__dataclass_fields__}


def _cell(doc: Any, index: int) -> Cell:
    where = f"cells[{index}]"
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: expected a mapping")
    unknown = set(doc) - _CELL_FIELDS
    if unknown:
        raise ValueError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    missing = _CELL_FIELDS - set(doc) - set(OPTIONAL_FIELDS)
    if missing:
        raise ValueError(f"{where}: missing {sorted(missing)[0]!r}")
    values: dict[str, Any] = {}
    for name in ("concurrency", "prompt_tokens", "output_tokens", "requests", "errors"):
        value = doc[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{where}.{name}: {value!r} is not a non-negative integer")
        values[name] = value
    if values["concurrency"] == 0:
        raise ValueError(f"{where}.concurrency: must be at least 1")
    for name in ("requests_per_second", "output_tokens_per_second"):
        values[name] = non_negative_number(doc[name], f"{where}.{name}")
    for name in ("ttft_seconds", "itl_seconds", "e2e_seconds", *OPTIONAL_FIELDS):
        if name in doc:
            values[name] = _quantiles(doc[name], f"{where}.{name}")
    return Cell(**values)


def _quantiles(doc: Any, where: str) -> Quantiles:
    if not isinstance(doc, dict) or set(doc) != set(QUANTILES):
        raise ValueError(f"{where}: expected {{p50, p95, p99}}")
    return Quantiles(**{q: non_negative_number(doc[q], f"{where}.{q}") for q in QUANTILES})
