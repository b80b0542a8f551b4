"""The baseline file: what the service measured under known load, to compare live latency with.

``inferwatch baseline`` writes it (a load sweep, ``tools/sweep/``); ``serve --baseline FILE``
exposes the cell comparable to the load as ``inferwatch_baseline_*`` gauges; ``generate
--baseline FILE`` derives the latency thresholds from it (:mod:`inferwatch.calibration`). Format (YAML)::

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
      server_decode_step_seconds: {...}   # optional: decode steps, where the server times them
      goodput_share: 0.95                 # optional: requests that met every objective
      goodput_requests_per_second: 4.65   # (metadata: goodput_objectives), and their rate
      goodput_tokens_per_second: 297.6
    capacity: [...]   # optional: the load search's (``--search``), see inferwatch.capacity
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from inferwatch.capacity import Capacity, at_shape, per
from inferwatch.capacity import document as capacity_document
from inferwatch.capacity import parse as parse_capacity
from inferwatch.model import BackendSample, Labels
from inferwatch.settings import (
    ConfigError,
    check_fields,
    non_negative_int,
    non_negative_number,
    read_text,
)

FORMAT_VERSION = 1
QUANTILES = ("p50", "p95", "p99")
# The `percentile` label of the exposed gauges -> the cell's field. (Not `quantile`: that
# label belongs to summaries, and `promtool check metrics` flags it on a gauge.)
PERCENTILE_LABELS = {"50": "p50", "95": "p95", "99": "p99"}
# Cell fields a sweep without the server's histograms leaves out.
OPTIONAL_QUANTILES = ("server_ttft_seconds", "server_itl_seconds", "server_decode_step_seconds")
GOODPUT_FIELDS = ("goodput_share", "goodput_requests_per_second", "goodput_tokens_per_second")
OPTIONAL_FIELDS = (*OPTIONAL_QUANTILES, *GOODPUT_FIELDS)


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
    server_decode_step_seconds: Quantiles | None = None  # TGI's, see :meth:`itl`
    goodput_share: float | None = None
    goodput_requests_per_second: float | None = None
    goodput_tokens_per_second: float | None = None

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
        """Inter-token latency as the rules see it (see :meth:`ttft`); where the server has
        no histogram of it, its decode steps, as the rules read them (TGI)."""
        if self.server_itl_seconds is not None:
            return self.server_itl_seconds, "server"
        if self.server_decode_step_seconds is not None:
            return self.server_decode_step_seconds, "server decode step"
        return self.itl_seconds, "client"


@dataclass(frozen=True)
class Baseline:
    metadata: Mapping[str, Any]
    cells: tuple[Cell, ...] = field(default_factory=tuple)
    capacity: tuple[Capacity, ...] = field(default_factory=tuple)  # ``--search``'s, per shape

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

    def share(self, replicas: int) -> Baseline:
        """One of ``replicas`` like replicas' share of what was measured through their router
        (each cell's concurrency a multiple of ``replicas``): the rates, the concurrency and
        the capacity over ``replicas``; latencies are each request's, as measured."""
        if replicas == 1:
            return self
        cells = tuple(
            replace(
                c,
                concurrency=c.concurrency // replicas,
                requests_per_second=per(c.requests_per_second, replicas),
                output_tokens_per_second=per(c.output_tokens_per_second, replicas),
                goodput_requests_per_second=per(c.goodput_requests_per_second, replicas),
                goodput_tokens_per_second=per(c.goodput_tokens_per_second, replicas),
            )
            for c in self.cells
        )
        capacity = tuple(c.share(replicas) for c in self.capacity)
        metadata = {**self.metadata, "replicas": replicas}
        return Baseline(metadata=metadata, cells=cells, capacity=capacity)

    def busiest(self) -> list[Cell]:
        """Cells at the highest measured concurrency."""
        top = max((c.concurrency for c in self.cells), default=0)
        return [c for c in self.cells if c.concurrency == top]


def capacity_series(
    model: Labels, measured: Capacity, rate: float
) -> dict[str, dict[Labels, float]]:
    """The capacity at the live shape (``rate``: ``measured``'s, scaled) and the curve the
    load search measured at that shape, one point per offered rate."""
    shape = (
        *model,
        ("prompt_tokens", str(measured.prompt_tokens)),
        ("output_tokens", str(measured.output_tokens)),
    )
    out: dict[str, dict[Labels, float]] = {
        "baseline_capacity_requests_per_second": {shape: rate},
        "baseline_step_requests_per_second": {},
        "baseline_step_goodput_ratio": {},
        "baseline_step_latency_seconds": {},
    }
    for step in measured.steps:
        at = (*shape, ("rate", f"{step.rate:g}"))
        out["baseline_step_requests_per_second"][at] = step.requests_per_second
        out["baseline_step_goodput_ratio"][at] = step.goodput_share
        for latency, value in (
            ("ttft", step.ttft_p95),
            ("itl", step.itl_p95),
            ("e2e", step.e2e_p95),
        ):
            out["baseline_step_latency_seconds"][(*at, ("latency", latency))] = value
    return out


def series(
    baseline: Baseline,
    sample: BackendSample,
    running: float,
    shape: tuple[float, float] | None = None,
) -> dict[str, dict[Labels, float]]:
    """The ``inferwatch_baseline_*`` series of the cell comparable to ``running`` requests,
    and the capacity at the live ``shape`` (mean prompt and output tokens; both over the
    rate window: :mod:`inferwatch.collect.load`)."""
    cell = baseline.comparable(running)
    if cell is None:
        return {}
    model = (("backend", sample.backend), ("model", sample.model))
    out: dict[str, dict[Labels, float]] = {}
    found = at_shape(baseline.capacity, *(shape or (None, None)))
    if found is not None:
        out.update(capacity_series(model, *found))
    base = (
        *model,
        ("concurrency", str(cell.concurrency)),
        ("prompt_tokens", str(cell.prompt_tokens)),
        ("output_tokens", str(cell.output_tokens)),
    )
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


def to_yaml(baseline: Baseline) -> str:
    doc = {
        "inferwatch_baseline": FORMAT_VERSION,
        "metadata": dict(baseline.metadata),
        "cells": [_cell_doc(c) for c in baseline.cells],
    }
    if baseline.capacity:
        doc["capacity"] = [capacity_document(c) for c in baseline.capacity]
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
    unknown = set(doc) - {"inferwatch_baseline", "metadata", "cells", "capacity"}
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
    capacity = doc.get("capacity") or []
    if not isinstance(capacity, list):
        raise ValueError("capacity: expected a list")
    shapes = tuple(parse_capacity(c, f"capacity[{i}]") for i, c in enumerate(capacity))
    if len({c.shape for c in shapes}) != len(shapes):
        raise ValueError("capacity: two entries with the same prompt and output tokens")
    return Baseline(metadata=metadata, cells=parsed, capacity=shapes)


def _cell(doc: Any, index: int) -> Cell:
    where = f"cells[{index}]"
    check_fields(doc, Cell, where, OPTIONAL_FIELDS)
    values: dict[str, Any] = {}
    for name in ("concurrency", "prompt_tokens", "output_tokens", "requests", "errors"):
        values[name] = non_negative_int(doc[name], f"{where}.{name}")
    if values["concurrency"] == 0:
        raise ValueError(f"{where}.concurrency: must be at least 1")
    for name in ("requests_per_second", "output_tokens_per_second"):
        values[name] = non_negative_number(doc[name], f"{where}.{name}")
    for name in ("ttft_seconds", "itl_seconds", "e2e_seconds", *OPTIONAL_QUANTILES):
        if name in doc:
            values[name] = _quantiles(doc[name], f"{where}.{name}")
    for name in GOODPUT_FIELDS:
        if name in doc:
            values[name] = non_negative_number(doc[name], f"{where}.{name}")
    if values.get("goodput_share", 0.0) > 1:
        raise ValueError(f"{where}.goodput_share: {values['goodput_share']} is not a share")
    return Cell(**values)


def _quantiles(doc: Any, where: str) -> Quantiles:
    if not isinstance(doc, dict) or set(doc) != set(QUANTILES):
        raise ValueError(f"{where}: expected {{p50, p95, p99}}")
    return Quantiles(**{q: non_negative_number(doc[q], f"{where}.{q}") for q in QUANTILES})
