"""The local stack the fault scenarios run on, and what it reads back for them.

A :class:`LocalStack` runs vLLM (CPU, the tiny model), inferwatch, Prometheus with the
generated rules and Alertmanager with the generated example config, its webhooks pointed
at a local receiver. Baseline first: once vLLM is up, ``inferwatch calibrate`` measures it
and writes the config (thresholds from the measurements; windows and ``for`` durations from
``demo/inferwatch.yaml``, scaled to a 1 s scrape/evaluation interval) that inferwatch serves
with and the rules are generated from; the faults are sized from the same server (see
``demo/calibration.py``). When an alert does not come, :meth:`LocalStack.explain` says which
of its conditions never held.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import yaml

from demo.calibration import Calibration, FaultSizes, calibrate
from demo.stack import (
    REPO,
    Alertmanager,
    Inferwatch,
    Prometheus,
    Proxy,
    StackError,
    VllmServer,
    WebhookReceiver,
    tiny_model,
)
from inferwatch.method.alerts import ALERTS
from inferwatch.method.rules import placeholders
from inferwatch.method.signals import SIGNALS
from inferwatch.method.slo import BURNS
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
        self.vllm = vllm or VllmServer(workdir, traced=True)
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
        # Started once the rules are the calibrated ones: before, the base config's rules
        # judge with defaults (an info alert may fire), and a rule changed by a reload is a
        # new rule to Prometheus, which sends no resolution for the old one's alert:
        # Alertmanager would hold it for minutes after.
        self.alertmanager = Alertmanager(self.workdir, am_config)
        self.inferwatch = self._inferwatch(CONFIG, self.vllm.spans_port).start()
        self.prometheus = Prometheus(
            self.workdir,
            [f"127.0.0.1:{self.inferwatch.port}"],
            rule_files=[self.workdir / "alerts" / "inferwatch-rules.yaml"],
            alertmanager=f"127.0.0.1:{self.alertmanager.port}",
            interval=INTERVAL,
        ).start()
        # Baseline first, with the stack running: the service is measured under the load its
        # monitoring puts on the machine, as it will be judged.
        self.calibration = calibrate(self.vllm, CONFIG, self.workdir, self.proxy.url)
        self.spec = self.calibration.spec
        write(self.workdir, self.spec)
        # The objectives' history begins now: the calibration loaded the server past them on
        # purpose (its capacity search), and its slow first tokens would burn the budget the
        # slow-burn ticket reads over a day (docs/calibrate.md says the same to users).
        self.prometheus.start_afresh()
        self.alertmanager.start()
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
                # The server's request spans: the window's slowest requests on the verdict.
                *(["--otlp-traces", "on"] if self.vllm.spans_port is not None else []),
            ],
            port=port,
        )  # fmt: skip

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
