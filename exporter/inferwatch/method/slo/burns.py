"""When an objective's error budget burns too fast: the multi-window burn-rate conditions."""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.method.durations import hours


@dataclass(frozen=True, kw_only=True)
class Burn:
    """One multi-window burn-rate condition: ``share`` of the budget gone within ``long``.

    It holds when the bad-event rate over ``long`` and over ``short`` (a twelfth of it: the
    alert resets soon after the burn stops) both exceed ``factor`` times the budget rate.
    """

    severity: str
    long: str
    short: str
    share: float  # of the whole window's budget

    def factor(self, window: str) -> float:
        """How many times the sustainable rate the budget burns at, over compliance ``window``."""
        return self.share * hours(window) / hours(self.long)

    def threshold(self, window: str) -> str:
        """The factor as the alert's expression compares a burn rate with it: ``13.44``."""
        return f"{self.factor(window):.4g}"


# The SRE workbook's table (for 30 days: 14.4x, 6x, 3x, 1x), kept as shares of the budget so
# that it means the same over any compliance window: page when 2 % of the budget goes in an
# hour or 5 % in six; file a ticket when 10 % goes in a day or in three.
BURNS = (
    Burn(severity="critical", long="1h", short="5m", share=0.02),
    Burn(severity="critical", long="6h", short="30m", share=0.05),
    Burn(severity="warning", long="1d", short="2h", share=0.10),
    Burn(severity="warning", long="3d", short="6h", share=0.10),
)
# Every window a burn rate is recorded over, shortest first.
WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
# Burn-rate windows up to an hour (the fast burn's) are rates of the raw series; longer ones
# add up the recorded 5m rates. Raw, a day of every replica's samples is most of what the
# rules cost at fleet size (bench/fleet.py); added up, the newest minutes weigh 1/5 (a 5m
# rate's ramp), which would page on an outage a couple of minutes late but is nothing to a
# 2h+ window.
LONGEST_RAW_WINDOW = "1h"
