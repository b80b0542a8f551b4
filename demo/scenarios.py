"""The fault scenarios of ``make demo`` and of the e2e tests, on the real local stack.

A :class:`LocalStack` runs vLLM (CPU, the tiny model), inferwatch, Prometheus with the
generated rules and Alertmanager with the generated example config, its webhooks pointed
at a local receiver. Baseline first: once vLLM is up, ``inferwatch calibrate`` measures it
and writes the config (thresholds from the measurements; windows and ``for`` durations from
``demo/inferwatch.yaml``, scaled to a 1 s scrape/evaluation interval) that inferwatch serves
with and the rules are generated from; the faults are sized from the same server (see
``demo/calibration.py``).

Each :class:`Scenario` starts a fault (and the traffic that shows it), names the alert it
must raise and the alerts allowed to fire alongside, and undoes the fault. When the alert
does not come, :meth:`LocalStack.explain` says which of its conditions never held.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from demo.calibration import (
    GAP_WINDOWS,
    LONG_PROMPT_OUTPUT,
    Calibration,
    FaultSizes,
    calibrate,
    normal_load,
)
from demo.stack import (
    REPO,
    Alertmanager,
    Inferwatch,
    Prometheus,
    Proxy,
    StackError,
    VllmServer,
    WebhookReceiver,
    metric_value,
    tiny_model,
)
from demo.traffic import Burst, burst, complete_many
from inferwatch.method.alerts import ALERTS, placeholders
from inferwatch.method.signals import SIGNALS
from inferwatch.method.slo import ALERT_NAMES as SLO_ALERTS
from inferwatch.method.slo import BURNS
from inferwatch.method.slo import FAST as SLO_PAGE
from inferwatch.method.spec import seconds, spec_from_config
from inferwatch.settings import load_config_file
from inferwatch.tools.generate import write

CONFIG = REPO / "demo" / "inferwatch.yaml"  # timing; thresholds come from `calibrate`
INTERVAL = "1s"  # scrape and rule evaluation


def alertmanager_config(example: Path, webhook: str, wait: str = "1s") -> dict:
    """The generated Alertmanager example with its receivers at ``webhook/<name>`` and
    short group waits (the routing and inhibitions are kept as they are)."""
    config = yaml.safe_load(example.read_text())
    for receiver in config["receivers"]:
        for hook in receiver["webhook_configs"]:
            hook["url"] = f"{webhook}/{receiver['name']}"
    for route in [config["route"], *config["route"]["routes"]]:
        for key in ("group_wait", "group_interval"):
            if key in route:
                route[key] = wait
    return config


class LocalStack:
    """vLLM + inferwatch + Prometheus + Alertmanager + a webhook receiver, on loopback."""

    def __init__(self, workdir: Path, vllm: VllmServer | None = None) -> None:
        self.workdir = workdir
        self.spec = spec_from_config(load_config_file(CONFIG))
        self.vllm = vllm or VllmServer(workdir)
        self.receiver = WebhookReceiver()
        self.proxy: Proxy | None = None  # the users' path in front of vLLM: the canary's
        self.inferwatch: Inferwatch | None = None
        self.prometheus: Prometheus | None = None
        self.alertmanager: Alertmanager | None = None
        self.calibration: Calibration | None = None

    def start(self) -> LocalStack:
        if not self.vllm.alive():
            self.vllm.start()
        write(self.workdir, self.spec)  # the base config's rules until calibrated
        self.proxy = Proxy(self.workdir, self.vllm.url).start()
        self.receiver.start()
        am_config = self.workdir / "alertmanager.yml"
        am_config.write_text(
            yaml.safe_dump(
                alertmanager_config(
                    self.workdir / "alerts" / "alertmanager.example.yml", self.receiver.url
                )
            )
        )
        self.alertmanager = Alertmanager(self.workdir, am_config).start()
        self.inferwatch = self._inferwatch(CONFIG).start()
        self.prometheus = Prometheus(
            self.workdir,
            [f"127.0.0.1:{self.inferwatch.port}"],
            rule_files=[self.workdir / "alerts" / "inferwatch-rules.yaml"],
            alertmanager=f"127.0.0.1:{self.alertmanager.port}",
            interval=INTERVAL,
        ).start()
        # Baseline first, with the stack running: the service is measured under the load its
        # monitoring puts on the machine, as it will be judged.
        self.calibration = calibrate(self.vllm, CONFIG, self.workdir)
        # The canary's path, measured too: its gap under the normal traffic, on this machine.
        gaps = asyncio.run(self.canary_gaps(GAP_WINDOWS * self.spec.window_seconds))
        self.calibration = self.calibration.with_client_gap(gaps)
        self.spec = self.calibration.spec
        write(self.workdir, self.spec)
        self.prometheus.reload()
        self.inferwatch.stop()  # serve again with the calibrated config (and its baseline)
        self.inferwatch = self._inferwatch(self.calibration.config, self.inferwatch.port).start()
        return self

    def _inferwatch(self, config: Path, port: int | None = None) -> Inferwatch:
        assert self.proxy is not None
        return Inferwatch(
            self.workdir,
            self.vllm.url,
            [
                "--backend", "vllm",
                "--model-path", str(tiny_model()),
                "--peak-memory-bandwidth", "2e10",  # ~DDR4 dual channel: a decode floor on CPU
                "--config", str(config),
                "--canary-url", self.proxy.url,
            ],
            port=port,
        )  # fmt: skip

    async def canary_gaps(self, seconds: float) -> list[float]:
        """The canary's client gap under normal traffic, read every half second for
        ``seconds`` once a whole rate window of it has passed."""
        assert self.inferwatch is not None
        stop = asyncio.Event()
        traffic = asyncio.create_task(normal_traffic(self, stop))
        gaps: list[float] = []
        metrics = f"{self.inferwatch.url}/metrics"
        # Read on this event loop, not in a thread: the traffic running on it holds the GIL
        # most of the time, and a thread's blocking read would wait for it.
        timeout = aiohttp.ClientTimeout(total=60)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                await asyncio.sleep(self.spec.window_seconds)
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    async with session.get(metrics) as response:
                        page = await response.text()
                    with contextlib.suppress(KeyError):  # no gap on this poll
                        gaps.append(metric_value(page, "inferwatch_canary_ttft_gap_seconds"))
                    await asyncio.sleep(0.5)
        finally:
            stop.set()
            await traffic
        if not gaps:
            raise StackError(f"the canary measured no client gap in {seconds:g} s")
        return gaps

    def stop(self) -> None:
        """Stop everything this stack started, by pid, whatever state it is in."""
        for component in (
            self.prometheus,
            self.inferwatch,
            self.alertmanager,
            self.proxy,
            self.vllm,
        ):
            if component is not None:
                with contextlib.suppress(Exception):
                    component.stop()
        self.receiver.stop()

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def held_at_alertmanager(self) -> list[dict]:
        """The alerts Alertmanager has not seen resolve (active or inhibited)."""
        assert self.alertmanager is not None
        return self.alertmanager.alerts()

    def firing_at_alertmanager(self) -> list[dict]:
        return [a for a in self.held_at_alertmanager() if a["status"]["state"] == "active"]

    def for_seconds(self, alert: str) -> float:
        return seconds(self.spec.timing.for_alert(ALERTS[alert]))

    def evaluation_seconds(self) -> float:
        return seconds(self.spec.timing.evaluation_interval)

    def prometheus_alerts(self) -> list[dict]:
        assert self.prometheus is not None
        return self.prometheus.alerts()

    @property
    def faults(self) -> FaultSizes:
        assert self.calibration is not None
        return self.calibration.faults

    def explain(self, alert: str, start: float, end: float) -> str:
        """Each condition of ``alert`` over [start, end] (Unix time) as Prometheus saw it:
        the range of its signal's values and how often it held, and which never did."""
        assert self.prometheus is not None
        values = placeholders(self.spec, ALERTS[alert])
        lines = [f"{alert} conditions from {start:.0f} to {end:.0f} (one step a second):"]
        for cond in ALERTS[alert].conditions():
            keyword = "unless" if cond in ALERTS[alert].unless else "when"
            try:
                series = self.prometheus.query_range(
                    SIGNALS[cond.signal].promql % values, start, end
                )
            except StackError as exc:
                lines.append(f"  {keyword} {cond.signal}: query failed: {exc}")
                continue
            seen = [float(v) for s in series for _, v in s["values"]]
            held = sum(cond.holds(v, self.spec) for v in seen)
            span = f"{min(seen):.4g} .. {max(seen):.4g}" if seen else "no data"
            verdict = "NEVER HELD" if not held else f"held {held}/{len(seen)}"
            lines.append(
                f"  {keyword} {cond.signal} {cond.op} {cond.bound(self.spec):g}: {verdict} "
                f"(values {span})"
            )
        return "\n".join(lines)

    def explain_slo(self, kind: str, start: float, end: float) -> str:
        """The objective's burn rates over [start, end] against the page's factors."""
        assert self.prometheus is not None
        level = self.spec.slos.scope
        lines = [f"{kind} objective burn rates from {start:.0f} to {end:.0f}:"]
        for burn in BURNS:
            factor = burn.factor(self.spec.slos.window)
            for window in (burn.long, burn.short):
                query = f"{level}:inferwatch_slo_{kind}:burnrate{window}"
                try:
                    seen = [
                        float(v)
                        for s in self.prometheus.query_range(query, start, end)
                        for _, v in s["values"]
                    ]
                except StackError as exc:
                    lines.append(f"  {query}: query failed: {exc}")
                    continue
                span = f"{min(seen):.4g} .. {max(seen):.4g}" if seen else "no data"
                lines.append(f"  {query} (page above {factor:.4g}): {span}")
        return "\n".join(lines)


Fault = Callable[[LocalStack, asyncio.Event], Awaitable[None]]


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


# --- background traffic ------------------------------------------------------------------


async def normal_traffic(stack: LocalStack, stop: asyncio.Event) -> None:
    """Two clients back to back, short prompts, short answers: the load calibrated for."""
    await normal_load(stack.vllm.url, stop)


# --- faults ------------------------------------------------------------------------------


async def overload(stack: LocalStack, stop: asyncio.Event) -> None:
    """Four times as many concurrent clients as the engine's batch admits."""
    await complete_many(
        stack.vllm.url, stop, clients=stack.faults.overload_clients, prompt_words=2, max_tokens=12
    )


async def long_prompts(stack: LocalStack, stop: asyncio.Event) -> None:
    """One client whose prompts' prefill alone is a multiple of the TTFT threshold."""
    await complete_many(
        stack.vllm.url,
        stop,
        clients=1,
        prompt_words=stack.faults.long_prompt_words,
        max_tokens=LONG_PROMPT_OUTPUT,
    )


async def kv_pressure(stack: LocalStack, stop: asyncio.Event) -> None:
    """Bursts of long generations whose batch needs twice the KV cache: preemptions."""
    f = stack.faults
    spec = Burst(
        requests=f.kv_requests, prompt_words=f.kv_prompt_words, max_tokens=f.kv_output_tokens
    )
    salt = 0
    while not stop.is_set():
        salt += 1
        await burst(stack.vllm.url, spec, salt=salt)


async def engine_stall(stack: LocalStack, stop: asyncio.Event) -> None:
    """Pause the engine process (SIGSTOP) the moment requests wait: queued while idle.

    Twice the batch in short requests: requests queue, and the backlog released when the
    engine resumes fits in the KV cache.
    """
    engine = stack.vllm.engine_core_pid()
    load = asyncio.create_task(
        complete_many(
            stack.vllm.url, stop, clients=stack.faults.stall_clients, prompt_words=2, max_tokens=12
        )
    )
    waiting = functools.partial(stack.vllm.metric, "vllm:num_requests_waiting")
    try:
        while not stop.is_set():
            while await asyncio.to_thread(waiting) <= 0 and not stop.is_set():
                await asyncio.sleep(0.005)
            os.kill(engine, signal.SIGSTOP)
            # The gauges freeze at the engine's last published stats, which may postdate the
            # queue just seen: hold the stall while they show requests waiting, else resume
            # and catch the next queue.
            while await asyncio.to_thread(waiting) > 0 and not stop.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.2)
            if not stop.is_set():
                os.kill(engine, signal.SIGCONT)
    finally:
        os.kill(engine, signal.SIGCONT)
        await load


async def slow_path(stack: LocalStack, stop: asyncio.Event) -> None:
    """The path in front of the server holds each request twice the client-gap threshold
    before passing it on; the users' traffic goes on as normal."""
    assert stack.proxy is not None
    await asyncio.to_thread(stack.proxy.set_fault, stack.faults.path_delay)
    try:
        await normal_traffic(stack, stop)
    finally:
        await asyncio.to_thread(stack.proxy.set_fault)


async def broken_route(stack: LocalStack, stop: asyncio.Event) -> None:
    """The path in front of the server answers 503 to every request; the server is fine."""
    assert stack.proxy is not None
    await asyncio.to_thread(stack.proxy.set_fault, 0.0, 503)
    try:
        await normal_traffic(stack, stop)
    finally:
        await asyncio.to_thread(stack.proxy.set_fault)


async def backend_crash(stack: LocalStack, stop: asyncio.Event) -> None:
    """Kill the server outright; it is started again when the scenario ends (recovery)."""
    process = stack.vllm.process
    assert process is not None and process.popen is not None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    await asyncio.to_thread(process.popen.wait)  # reap it
    await stop.wait()
    await asyncio.to_thread(stack.vllm.start)


# Every latency fault is also a regression against the calibrated baseline.
REGRESSION = "InferenceLatencyRegression"
# Overloaded or stalled, the server answers the canary after its timeout, as it would a user.
CANARY = "InferenceCanaryFailing"
# Under these faults the engine's threads hold both of this machine's cores: the API server
# and the canary wait for CPU before the engine sees a request, and the canary's first token
# comes later than the server's TTFT says, as a user's would.
GAP = "InferenceClientGap"

SCENARIOS = (
    Scenario(
        "overload",
        "InferenceQueueingDelay",
        overload,
        also_allowed=frozenset({REGRESSION, CANARY, GAP}),
        story="4x the batch in clients: requests wait to be scheduled; TTFT is queue time; "
        "the TTFT objective's budget burns: a page.",
        pages="ttft",
    ),
    Scenario(
        "long prompts",
        "InferencePrefillBottleneck",
        long_prompts,
        also_allowed=frozenset({REGRESSION, GAP}),
        story="Prompts whose prefill alone is 2x the TTFT threshold, no queue: TTFT is "
        "prefill compute.",
    ),
    Scenario(
        "KV-cache pressure",
        "InferenceKVCachePressure",
        kv_pressure,
        # Bursts of 1.5x the batch also queue.
        also_allowed=frozenset({"InferenceQueueingDelay", REGRESSION, CANARY, GAP}),
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


def _slo(alert: dict) -> bool:
    return alert["labels"]["alertname"] in SLO_ALERTS


async def settle(stack: LocalStack, timeout: float) -> None:
    """Normal traffic until no alert is pending or firing in Prometheus."""
    stop = asyncio.Event()
    traffic = asyncio.create_task(normal_traffic(stack, stop))
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            # An SLO alert says how much budget the past burned; it clears with its windows
            # (minutes to days), not with the fault.
            # Alertmanager too must have seen them resolve: an alert that fires again before
            # it did is the same notification to it, and is not sent again.
            held = await asyncio.to_thread(stack.prometheus_alerts)
            held += await asyncio.to_thread(stack.held_at_alertmanager)
            if not [a for a in held if not _slo(a)]:
                return
            await asyncio.sleep(1)
        held = stack.prometheus_alerts() + stack.held_at_alertmanager()
        names = sorted({a["labels"]["alertname"] for a in held if not _slo(a)})
        raise StackError(f"alerts did not clear within {timeout:g} s: {', '.join(names)}")
    finally:
        stop.set()
        await traffic
