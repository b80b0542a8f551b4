"""Service level objectives: what users feel, as error budgets and multi-window burn-rate alerts.

An objective says which share of events must be good over a compliance window: "99 % of
requests get their first token within 0.5 s over 28 days". Its SLI comes from the server's
own series: good events are a histogram's bucket at the objective's bound (``le``), all
events its count; for ``errors``, finished requests less those that ended in a server error
(an abort is the client's choice and counts as neither good nor bad). The config section
(parsed strictly, :mod:`.config`)::

    slos:
      window: 28d              # compliance window
      scope: model             # judge a model across its replicas; `instance`: each pod
      objectives:              # every model...
        errors: {target: 0.999}
        ttft: {target: 0.99, seconds: 0.5}
      models:                  # ...unless it has its own
        llama-3-70b:
          ttft: {target: 0.99, seconds: 2.5}

The generated recording rules (``model:`` or ``instance:`` level, by objective kind;
:mod:`.recording`)::

    model:inferwatch_slo_ttft_events:rate5m        all events per second
    model:inferwatch_slo_ttft_bad_events:rate5m    events that missed the objective
    model:inferwatch_slo_errors_finished:rate1h    errors only: finished requests per second
                                                   by reason (5m, 30m and 1h)
    model:inferwatch_slo_ttft:burnrate1h           bad share over 1h / (1 - target)
    model:inferwatch_slo_ttft:error_budget_remaining   over the compliance window
    model:inferwatch_slo_ttft:objective            the target, on the model's labels

Alerts (:data:`BURNS` says when; :mod:`.alerting`): ``InferenceSLOFastBurn`` pages,
``InferenceSLOSlowBurn`` files a ticket, ``InferenceSLOUnmeasured`` says an objective's bound
is not a bucket of the server's histogram (:mod:`.buckets` has the known ones). Their
descriptions list the cause alerts of the same model: the method's alerts explain the page.
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
