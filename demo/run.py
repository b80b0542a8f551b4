"""``make demo``: a real vLLM on CPU watched by inferwatch, Prometheus and Alertmanager,
driven through faults while the terminal shows what inferwatch sees.

Baseline first: once vLLM is up, ``inferwatch calibrate`` measures it and the thresholds
and fault sizes come from that (the first screen shows them). The first-time tour
(:data:`TOUR`): normal -> overload -> long prompts -> KV-cache pressure -> engine stall ->
backend crash -> recovery, one fault per layer; ``--full`` (``make demo-full``) runs every
scenario the e2e tests run, the load ramp through the measured capacity to the SLO page, the
slow path and the broken route in front of the server among them. For each, the live view shows the phase verdict (which phase and layer the
firing alerts name), the key series (the canary's client gap among them), and the alerts
Alertmanager holds with their runbooks; at the end, a table of the time from each fault to
its alert. inferwatch's own verdict page (its URL is on every screen) shows the same from
the sidecar's polls alone. Ctrl-C stops every process the demo started.

    .venv/bin/python demo/run.py [--workdir DIR] [--quick] [--full]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demo.scenarios import SCENARIOS, LocalStack, normal_traffic, run_scenario, settle
from demo.stack import REPO, StackError, metric_value
from inferwatch.method.slo import FAST as SLO_PAGE

RESET = "\x1b[H\x1b[2J"
# The first-time tour: a fault in each layer (scheduling, compute, memory, the engine, the
# server's availability), each alert within seconds of its fault.
TOUR = ("overload", "long prompts", "KV-cache pressure", "engine stall", "backend crash")


def _value(page: str, name: str, labels: str = "") -> str:
    try:
        return f"{metric_value(page, name, labels):g}"
    except KeyError:
        return "-"


def _latency(stack: LocalStack, expr: str) -> str:
    assert stack.prometheus is not None
    try:
        result = stack.prometheus.query(expr)
    except StackError:
        return "-"
    if not result:
        return "-"
    return f"{float(result[0]['value'][1]) * 1000:.1f} ms"


def render(stack: LocalStack, phase: str, story: str, started: float) -> str:
    """The live view: one screen of what inferwatch, Prometheus and Alertmanager see."""
    assert stack.inferwatch is not None
    try:
        page = stack.inferwatch.page()
    except (OSError, StackError):
        page = ""
    w = stack.spec.rate_name
    p95 = '{quantile="0.95"}'
    ttft = f"max(model:inferwatch_time_to_first_token_seconds:quantile_{w}{p95})"
    itl = f"max(model:inferwatch_inter_token_latency_seconds:quantile_{w}{p95})"
    window, hist = stack.spec.timing.window, "inferwatch_request_queue_time_seconds"
    queue = f"sum(rate({hist}_sum[{window}])) / sum(rate({hist}_count[{window}]))"
    gap = "max(inferwatch_canary_ttft_gap_seconds)"
    ok = 'result="ok"'
    assert stack.calibration is not None
    lines = [
        f"inferwatch demo  |  phase: {phase}  ({time.monotonic() - started:4.0f} s)"
        f"  |  verdict page {stack.inferwatch.url}/",
        f"  {story}",
        "",
        *stack.calibration.summary(),
        "",
        f"  backend up {_value(page, 'inferwatch_backend_up')}   running "
        f"{_value(page, 'inferwatch_requests_running')}   waiting "
        f"{_value(page, 'inferwatch_requests_waiting')}   KV cache "
        f"{_value(page, 'inferwatch_kv_cache_usage_ratio')}   queued-while-idle "
        f"{_value(page, 'inferwatch_queued_while_idle_seconds_total')} s   preemptions "
        f"{_value(page, 'inferwatch_preemptions_total')}",
        f"  TTFT p95 {_latency(stack, ttft)}   queue mean {_latency(stack, queue)}"
        f"   ITL p95 {_latency(stack, itl)}",
        f"  canary (through the proxy): client gap {_latency(stack, gap)} over the server's "
        f"TTFT   probes ok {_value(page, 'inferwatch_canary_probes_total', ok)}"
        f" / {_value(page, 'inferwatch_canary_probes_total')}",
        "",
        "  verdict: " + verdict(stack),
        "",
        "  alerts at Alertmanager:",
    ]
    firing = stack.firing_at_alertmanager()
    for alert in sorted(firing, key=lambda a: a["labels"]["alertname"]):
        labels, notes = alert["labels"], alert["annotations"]
        lines.append(
            f"    [{labels.get('severity', '?')}] {labels['alertname']} "
            f"({_place(labels)}): {notes.get('summary', '')}"
        )
        runbook = REPO / "alerts" / "runbooks" / f"{labels['alertname']}.md"
        lines.append(f"        runbook: {runbook}")
    if not firing:
        lines.append("    (none)")
    return "\n".join(lines)


def _place(labels: dict) -> str:
    """An alert's place in the method (phase / layer), or the objective it burns."""
    if "slo" in labels:
        return f"objective {labels['slo']}"
    return f"{labels.get('phase', '?')} / {labels.get('layer', '?')}"


def verdict(stack: LocalStack) -> str:
    """Phase and layer named by the cause alerts Prometheus evaluates (pending ones too), and
    the objectives whose budget burns."""
    order = {"critical": 0, "warning": 1, "info": 2}
    alerts = sorted(
        stack.prometheus_alerts(), key=lambda a: order.get(a["labels"].get("severity", ""), 3)
    )
    causes = [a for a in alerts if "slo" not in a["labels"]]
    burning = sorted({a["labels"]["slo"] for a in alerts if "slo" in a["labels"]})
    users = f"; objectives burning: {', '.join(burning)}" if burning else ""
    if not alerts:
        return "healthy: no inferwatch alert pending or firing"
    if not causes:
        return "no cause alert pending or firing" + users
    top = causes[0]["labels"]
    more = f" (+{len(causes) - 1} more)" if len(causes) > 1 else ""
    return f"{top['alertname']} ({causes[0]['state']}): {_place(top)}{more}{users}"


async def show(stack: LocalStack, state: dict, stop: asyncio.Event) -> None:
    """Redraw the view every second on a terminal (every 5 s in a log), once more at the end."""
    tty = sys.stdout.isatty()
    while True:
        screen = await asyncio.to_thread(
            render, stack, state["phase"], state["story"], state["since"]
        )
        print((RESET if tty else "\n") + screen, flush=True)
        if stop.is_set():
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 1 if tty else 5)


async def normal_for(stack: LocalStack, seconds: float) -> None:
    stop = asyncio.Event()
    traffic = asyncio.create_task(normal_traffic(stack, stop))
    await asyncio.sleep(seconds)
    stop.set()
    await traffic


async def demo(stack: LocalStack, quick: bool, full: bool) -> list:
    state = {
        "phase": "normal",
        "story": "Normal traffic, the load calibrated for: everything healthy.",
        "since": time.monotonic(),
    }
    stop_view = asyncio.Event()
    view = asyncio.create_task(show(stack, state, stop_view))
    outcomes = []
    try:
        await normal_for(stack, 10 if quick else 30)
        for scenario in SCENARIOS if full else [s for s in SCENARIOS if s.name in TOUR]:
            state.update(phase=scenario.name, story=scenario.story, since=time.monotonic())
            outcomes.append(await run_scenario(stack, scenario, hold=10, timeout=180))
            state.update(
                phase=f"recovery after {scenario.name}",
                story="Normal traffic until every alert has cleared.",
                since=time.monotonic(),
            )
            await settle(stack, timeout=240)
        state.update(
            phase="recovered",
            story="Every fault undone: normal traffic, no cause alert pending or firing (an "
            "SLO alert stays until its windows pass the faults).",
            since=time.monotonic(),
        )
        await normal_for(stack, 10)
    finally:
        stop_view.set()
        await view
    return outcomes


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM and SIGHUP clean up like Ctrl-C


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, help="where logs and data go (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="shorter normal phase")
    parser.add_argument("--full", action="store_true", help="every scenario the e2e tests run")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="inferwatch-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    for signum in (signal.SIGTERM, signal.SIGHUP):  # a closed terminal cleans up too
        signal.signal(signum, _interrupt)
    started = time.monotonic()
    stack = LocalStack(workdir)
    print(
        "starting vLLM (CPU), calibrating against it, then inferwatch, Prometheus and "
        f"Alertmanager; logs in {workdir} ..."
    )
    try:
        stack.start()
        assert stack.inferwatch and stack.prometheus and stack.alertmanager
        print(f"  verdict page {stack.inferwatch.url}/  (open it in a browser)")
        print(f"  inferwatch   {stack.inferwatch.url}/metrics")
        print(f"  Prometheus   {stack.prometheus.url}/alerts")
        print(f"  Alertmanager {stack.alertmanager.url}")
        outcomes = asyncio.run(demo(stack, args.quick, args.full))
    except KeyboardInterrupt:
        print("\ninterrupted: stopping everything the demo started")
        return 130
    except StackError as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
    print(f"\nthe demo took {(time.monotonic() - started) / 60:.1f} min, start-up included")
    print("\nfault -> alert received at Alertmanager's webhook:")
    for outcome in outcomes:
        latency = outcome.latency
        took = f"{latency:5.1f} s" if latency is not None else "  not received"
        print(f"  {outcome.scenario.name:20} {outcome.scenario.expect:32} {took}")
        if outcome.scenario.pages:
            paged = outcome.page_latency
            took = f"{paged:5.1f} s" if paged is not None else "  not received"
            page = f"{SLO_PAGE} ({outcome.scenario.pages})"
            print(f"  {'':20} {page:32} {took}")
    received = all(o.latency is not None for o in outcomes)
    paged = all(o.page_latency is not None for o in outcomes if o.scenario.pages)
    return 0 if received and paged else 1


if __name__ == "__main__":
    raise SystemExit(main())
