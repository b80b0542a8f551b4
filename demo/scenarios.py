"""The fault scenarios of ``make demo`` and of the e2e tests, on the real local stack
(:mod:`demo.local_stack`; the faults themselves are in :mod:`demo.faults`).

Each :class:`Scenario` starts a fault (and the traffic that shows it), names the alert it
must raise and the alerts allowed to fire alongside, and undoes the fault. When the alert
does not come, :meth:`LocalStack.explain` says which of its conditions never held.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from demo.faults import (
    Fault,
    backend_crash,
    broken_route,
    engine_stall,
    kv_pressure,
    load_ramp,
    long_prompts,
    noisy_neighbour,
    normal_traffic,
    overload,
    prompts_into_streams,
    slow_path,
)
from demo.local_stack import LocalStack, alertmanager_config
from demo.stack import StackError
from inferwatch.method.alerts import ALERTS
from inferwatch.method.slo import ALERT_NAMES as SLO_ALERTS
from inferwatch.method.slo import FAST as SLO_PAGE

# The stack and its traffic, importable from here with the scenarios that run on them.
__all__ = [
    "SCENARIOS",
    "LocalStack",
    "Outcome",
    "Scenario",
    "alertmanager_config",
    "normal_traffic",
    "run_scenario",
    "settle",
]


@dataclass(frozen=True)
class Scenario:
    """A fault, the alert it must raise, and the alerts that may fire with it."""

    name: str
    expect: str
    fault: Fault
    also_allowed: frozenset[str] = field(default_factory=frozenset)
    story: str = ""
    # The objective this fault must page for (an SLO burn), besides raising its cause alert.
    # Any scenario may burn a budget: the SLO alerts are never unexpected.
    pages: str | None = None
    # Alerts (the SLO page by its name) that, where they arrive, arrive after ``expect``.
    after: frozenset[str] = field(default_factory=frozenset)
    # The alert whose word on where the slowest requests spent their time (its
    # ``first_token_waits_in``, ``slow_tokens_spent_in``) their spans must confirm under this
    # fault; None: ``expect``'s, where it names a place.
    spans_confirm: str | None = None


# Every latency fault is also a regression against the calibrated baseline.
REGRESSION = "InferenceLatencyRegression"
NEAR_CAPACITY, QUEUEING = "InferenceNearCapacity", "InferenceQueueingDelay"
# Overloaded or stalled, the server answers the canary after its timeout, as it would a user.
CANARY = "InferenceCanaryFailing"
# Under these faults the engine's threads hold every core of the machine: the API server
# and the canary wait for CPU before the engine sees a request, and the canary's first token
# comes later than the server's TTFT says, as a user's would.
GAP = "InferenceClientGap"
# Past the measured capacity: the queue (listed under the capacity ticket, which explains
# it), the regression and what users see.
PAST_CAPACITY = frozenset({QUEUEING, REGRESSION, CANARY, GAP})
# Near the capacity, each step carries a full batch's decodes and admits new prompts'
# prefill chunks: tokens and first tokens slow before any queue forms, and what the capacity
# ticket explains may hold, listed under it (inhibited where the ticket came first).
NEAR_CAPACITY_EXPLAINS = frozenset(ALERTS[NEAR_CAPACITY].explains)

SCENARIOS = (
    Scenario(
        "load ramp",
        NEAR_CAPACITY,
        load_ramp,
        also_allowed=PAST_CAPACITY | NEAR_CAPACITY_EXPLAINS,
        story="Traffic stepping up through the measured capacity: 60 % of it, then between "
        "the ticket's threshold and the capacity, then the overload: the capacity ticket "
        "comes while requests still meet their objectives, before the queue and the page.",
        pages="ttft",
        after=frozenset({QUEUEING, SLO_PAGE}),
    ),
    Scenario(
        "overload",
        NEAR_CAPACITY,
        overload,
        # The queue forms at once: InferenceQueueingDelay holds too, listed under the
        # capacity it explains (Alertmanager inhibits it while the ticket fires), and the
        # slowest first tokens waited there.
        also_allowed=PAST_CAPACITY,
        spans_confirm=QUEUEING,
        story="4x the batch in clients at once, past the measured capacity: requests wait to "
        "be scheduled, TTFT is queue time (the queueing listed under the capacity ticket).",
    ),
    Scenario(
        "long prompts",
        "InferencePrefillBottleneck",
        long_prompts,
        # The canary's tokens decode beside the long prefills and wait for them: where that
        # tail holds too, the stall leads and the prefill bottleneck is listed under it.
        # Prompts this long use the capacity measured at the normal shape sooner: on a slow
        # machine (a capacity of a few requests/s once scaled to them) the ticket may hold.
        also_allowed=frozenset({"InferencePrefillStallsDecode", NEAR_CAPACITY, REGRESSION, GAP}),
        story="Prompts whose prefill alone is 2x the TTFT threshold, no queue: TTFT is "
        "prefill compute.",
    ),
    Scenario(
        "long prompts into streams",
        "InferencePrefillStallsDecode",
        prompts_into_streams,
        # The long prompts' first tokens are slow too: the prefill bottleneck holds, listed
        # under the stall (Alertmanager inhibits it while the stall fires). The streams' long
        # answers and the long prompts use the capacity measured at the normal shape sooner:
        # on a slow machine the ticket may hold.
        also_allowed=frozenset({"InferencePrefillBottleneck", NEAR_CAPACITY, REGRESSION, GAP}),
        story="Long prompts one after another into four streams that decode: each prefill "
        "runs in the streams' steps, and their next token waits for it.",
    ),
    Scenario(
        "KV-cache pressure",
        "InferenceKVCachePressure",
        kv_pressure,
        # Bursts of 1.5x the batch also queue, and each begins with a batch of prefills
        # before the cache fills; generations this long use the capacity measured at the
        # normal shape sooner: all are listed under the cache's pressure.
        also_allowed=frozenset(
            {QUEUEING, "InferencePrefillBottleneck", NEAR_CAPACITY, REGRESSION, CANARY, GAP}
        ),
        story="A batch of long generations that needs twice the KV cache: the scheduler preempts.",
    ),
    Scenario(
        "engine stall",
        "InferenceQueuedWhileIdle",
        engine_stall,
        # Queued requests finish late after the stall: their queueing is the stall's, and
        # Alertmanager inhibits InferenceQueueingDelay while InferenceQueuedWhileIdle fires.
        also_allowed=frozenset({"InferenceQueueingDelay", REGRESSION, CANARY, GAP}),
        story="The engine process is paused with requests waiting: queued while idle.",
    ),
    Scenario(
        "slow path",
        "InferenceClientGap",
        slow_path,
        story="A proxy in front of the server holds each request 2x the client-gap threshold: "
        "the canary's first token is late, the server's own TTFT is not.",
    ),
    Scenario(
        "noisy neighbour",
        "InferenceServerCPUStarved",
        noisy_neighbour,
        # The starved server is slow in every phase: what its slowness looks like in the
        # compute and scheduling layers is this cause's, listed under it.
        also_allowed=frozenset(
            {
                "InferencePrefillBottleneck",
                "InferenceDecodeBottleneck",
                "InferencePrefillStallsDecode",
                "InferenceQueueingDelay",
                "InferenceQueuedWhileIdle",
                REGRESSION,
                CANARY,
                GAP,
            }
        ),
        story="Busy loops beside the server, one per core, at a priority above the server's: "
        "its threads wait for the cores they are ready to run on.",
    ),
    Scenario(
        "broken route",
        "InferenceCanaryFailing",
        broken_route,
        story="The proxy in front of the server answers 503; the server itself is healthy.",
    ),
    Scenario(
        "backend crash",
        "InferenceBackendDown",
        backend_crash,
        story="The server is killed; then started again (recovery, ~1-2 min).",
    ),
)


@dataclass
class Outcome:
    """What arrived at the webhook while a scenario's fault was on, and when."""

    scenario: Scenario
    onset: float  # monotonic time the fault began
    began_at: float  # the same, as Unix time (for Prometheus queries)
    received: dict[str, float] = field(default_factory=dict)  # alert -> first arrival
    on_alert: Any = None  # what ``on_alert`` returned while the fault was on

    @property
    def latency(self) -> float | None:
        at = self.received.get(self.scenario.expect)
        return None if at is None else at - self.onset

    @property
    def page_latency(self) -> float | None:
        """Seconds from onset to the SLO page, where the scenario expects one."""
        at = self.received.get(SLO_PAGE) if self.scenario.pages else None
        return None if at is None else at - self.onset

    def done(self, hold: float) -> bool:
        """The cause alert (and the page, where one is expected) arrived ``hold`` s ago."""
        wanted = [self.scenario.expect] + ([SLO_PAGE] if self.scenario.pages else [])
        arrived = [self.received.get(name) for name in wanted]
        return None not in arrived and time.monotonic() > max(arrived) + hold


async def run_scenario(
    stack: LocalStack,
    scenario: Scenario,
    hold: float,
    timeout: float,
    on_alert: Callable[[], Awaitable[Any]] | None = None,
) -> Outcome:
    """Run the fault until its alert arrives at the webhook and ``hold`` seconds more (or
    ``timeout``), then undo it. ``on_alert`` is awaited once when the alert arrives, with
    the fault still on. Returns what arrived, when, and what ``on_alert`` returned."""
    already = len(stack.receiver.notifications)
    stop = asyncio.Event()
    outcome = Outcome(scenario, time.monotonic(), time.time())
    task = asyncio.create_task(scenario.fault(stack, stop))
    deadline = outcome.onset + timeout
    try:
        while time.monotonic() < deadline and not task.done():
            for arrived, alert in stack.receiver.firing(since=already):
                outcome.received.setdefault(alert["labels"]["alertname"], arrived)
            if scenario.expect in outcome.received and on_alert is not None:
                outcome.on_alert, on_alert = await on_alert(), None
            if outcome.done(hold):
                break
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        await task
    return outcome


def _is_slo(alert: dict) -> bool:
    """An SLO burn alert (it clears with its windows, not with the fault)."""
    return alert["labels"]["alertname"] in SLO_ALERTS


async def settle(stack: LocalStack, timeout: float) -> None:
    """Normal traffic until no alert has been pending or firing in Prometheus for one rate
    window (and an evaluation): the next fault's windows then hold normal traffic only.

    Without the quiet window a fault's aftermath can still be in a window when the next
    fault begins (the last requests of an engine stall finish with a TTFT of seconds), and
    a condition flickering between two evaluations would count against the next fault.
    """
    stop = asyncio.Event()
    traffic = asyncio.create_task(normal_traffic(stack, stop))
    quiet_for = stack.spec.window_seconds + stack.evaluation_seconds()
    deadline = time.monotonic() + timeout
    quiet_since = time.monotonic()
    seen: dict[str, str] = {}  # each alert that broke the quiet, and its state then
    try:
        while time.monotonic() < deadline:
            # An SLO alert says how much budget the past burned; it clears with its windows
            # (minutes to days), not with the fault.
            # Alertmanager too must have seen them resolve: an alert that fires again before
            # it did is the same notification to it, and is not sent again.
            held = await asyncio.to_thread(stack.prometheus_alerts)
            held += await asyncio.to_thread(stack.held_at_alertmanager)
            held = [a for a in held if not _is_slo(a)]
            if held:
                quiet_since = time.monotonic()
                seen |= {a["labels"]["alertname"]: a.get("state", "active") for a in held}
            elif time.monotonic() - quiet_since >= quiet_for:
                return
            await asyncio.sleep(1)
        raise StackError(
            f"alerts were not quiet for {quiet_for:g} s within {timeout:g} s: "
            + ", ".join(f"{name} ({state})" for name, state in sorted(seen.items()))
        )
    finally:
        stop.set()
        await traffic
