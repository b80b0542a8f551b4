"""Service level objectives: what users feel, as error budgets and multi-window burn-rate alerts.

An objective is the share of events that must be good over a compliance window; good events
are a histogram's bucket at the objective's bound, all events its count (``errors``: finished
requests less server errors). The config section (:mod:`.config`)::

    slos:
      window: 28d
      objectives: {errors: {target: 0.999}, ttft: {target: 0.99, seconds: 0.5}}

Some of the recording rules (:mod:`.recording`)::

    model:inferwatch_slo_ttft:burnrate1h           bad share over 1h / (1 - target)
    model:inferwatch_slo_ttft:error_budget_remaining   over the compliance window

Alerts (:data:`BURNS`, :mod:`.alerting`): ``InferenceSLOFastBurn`` pages,
``InferenceSLOSlowBurn`` files a ticket, ``InferenceSLOUnmeasured`` says an objective's bound
is not a bucket of the server's histogram.
"""

from __future__ import annotations

from inferwatch.method.slo.alerting import ALERT_NAMES, FAST, SLOW, UNMEASURED, alert_rules
from inferwatch.method.slo.buckets import BUCKET_BOUNDS
from inferwatch.method.slo.burns import BURNS, WINDOWS, Burn
from inferwatch.method.slo.config import slos_document, slos_from_config
from inferwatch.method.slo.objectives import (
    KINDS,
    SCOPES,
    ModelObjectives,
    Objective,
    ObjectiveKind,
    SLOs,
)
from inferwatch.method.slo.recording import Rule, recording_rules
from inferwatch.method.slo.series import record

__all__ = [
    "ALERT_NAMES",
    "BUCKET_BOUNDS",
    "BURNS",
    "FAST",
    "KINDS",
    "SCOPES",
    "SLOW",
    "UNMEASURED",
    "WINDOWS",
    "Burn",
    "ModelObjectives",
    "Objective",
    "ObjectiveKind",
    "Rule",
    "SLOs",
    "alert_rules",
    "record",
    "recording_rules",
    "slos_document",
    "slos_from_config",
]
