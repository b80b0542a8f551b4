"""Durations of one unit as Prometheus writes them (``250ms``, ``30s``, ``5m``, ``1h``, ``28d``).

The one parser the spec's ``alerting:`` timings and the SLOs' windows share; each caller
says which units it accepts.
"""

from __future__ import annotations

import re
from collections.abc import Collection

SECONDS_PER_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d)$")


def is_duration(text: str, units: Collection[str]) -> bool:
    """Whether ``text`` is a whole number of one of ``units``: ``5m`` is one of ``("m", "h")``."""
    match = _DURATION.match(text)
    return match is not None and match.group(2) in units


def _count_and_unit(text: str) -> tuple[int, str]:
    value, unit = _DURATION.match(text).groups()
    return int(value), unit


def seconds(text: str) -> float:
    """``5m`` -> 300: a duration ``is_duration`` accepted, in seconds."""
    count, unit = _count_and_unit(text)
    return count * SECONDS_PER_UNIT[unit]


def hours(text: str) -> float:
    """``90m`` -> 1.5: the count times the unit's length in hours (a minute is 1/60)."""
    count, unit = _count_and_unit(text)
    return count * (SECONDS_PER_UNIT[unit] / 3600)
