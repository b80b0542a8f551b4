"""The baseline file's capacity section: read strictly, and scaled to the live shape."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from inferwatch.baseline import parse
from inferwatch.capacity import MAX_SCALE, Capacity, at_shape

STEP = {
    "rate": 4.0,
    "requests": 60,
    "requests_per_second": 3.9,
    "goodput_share": 0.967,
    "concurrency": 3.1,
    "ttft_p95": 0.2,
    "itl_p95": 0.03,
    "e2e_p95": 2.1,
}
ENTRY = {
    "prompt_tokens": 128,
    "output_tokens": 64,
    "requests_per_second": 4.0,
    "concurrency": 3.1,
    "goodput_share": 0.967,
    "target_share": 0.95,
    "arrivals": "poisson",
    "tolerance": 0.1,
    "ended": "converged",
    "steps": [STEP],
}
CELL = {
    "concurrency": 1,
    "prompt_tokens": 128,
    "output_tokens": 64,
    "requests": 8,
    "errors": 0,
    "ttft_seconds": {"p50": 0.1, "p95": 0.2, "p99": 0.3},
    "itl_seconds": {"p50": 0.01, "p95": 0.02, "p99": 0.03},
    "e2e_seconds": {"p50": 1.0, "p95": 1.2, "p99": 1.3},
    "requests_per_second": 1.0,
    "output_tokens_per_second": 64.0,
}


def document(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"inferwatch_baseline": 1, "metadata": {}, "cells": [CELL], "capacity": list(entries)}


def capacity(prompt: int, output: int, rate: float | None) -> Capacity:
    return Capacity(prompt, output, rate, 1.0, 1.0, 0.95, "poisson", 0.1, "converged")


def test_a_capacity_section_is_read_with_its_steps() -> None:
    entry = {**ENTRY, "knee_requests_per_second": 3.5}
    (read,) = parse(document(entry)).capacity
    assert read.requests_per_second == 4.0 and read.knee_requests_per_second == 3.5
    assert read.steps[0].requests == 60 and read.steps[0].e2e_p95 == 2.1
    assert parse(document()).capacity == ()  # optional


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"arrivals": "bursty"}, "capacity[0].arrivals: 'bursty' is not one of poisson, constant"),
        ({"goodput_share": 1.5}, "capacity[0].goodput_share: 1.5 is not a share"),
        ({"requests_per_second": -1}, "capacity[0].requests_per_second: -1 is not a non-negative"),
        ({"steps": [{**STEP, "requests": 1.5}]}, "capacity[0].steps[0].requests: 1.5 is not a"),
        ({"speed": 1}, "capacity[0]: unknown key 'speed'"),
        ({"ended": None}, "capacity[0].ended: None is not one of"),
    ],
)
def test_a_bad_entry_names_where_it_is_wrong(change: dict, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse(document({**ENTRY, **change}))
    assert str(raised.value).startswith(message)
    missing = copy.deepcopy(ENTRY)
    del missing["tolerance"]
    with pytest.raises(ValueError, match="capacity\\[0\\]: missing 'tolerance'"):
        parse(document(missing))
    with pytest.raises(ValueError, match="two entries with the same prompt and output tokens"):
        parse(document(ENTRY, ENTRY))


def test_the_live_shape_picks_the_nearest_measured_one_and_scales_by_output_length() -> None:
    measured = [capacity(128, 64, 8.0), capacity(1024, 64, 4.0), capacity(128, 256, 2.0)]
    # Without live lengths: the lowest capacity, unscaled.
    assert at_shape(measured, None, None) == (measured[2], 2.0)
    # Live requests of the measured shape: as measured.
    assert at_shape(measured, 128, 64) == (measured[0], 8.0)
    # Twice the output of the nearest shape: half its rate (decode-bound).
    assert at_shape(measured, 1000, 128) == (measured[1], 2.0)
    # Shorter outputs carry more, bounded to MAX_SCALE.
    assert at_shape(measured, 128, 1) == (measured[0], 8.0 * MAX_SCALE)
    # A shape whose search found no good rate is never chosen; none at all: None.
    assert at_shape([capacity(128, 64, None), measured[1]], 128, 64) == (measured[1], 4.0)
    assert at_shape([capacity(128, 64, None)], 128, 64) is None
