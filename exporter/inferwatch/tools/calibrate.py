"""``inferwatch calibrate``: measure the service, then write the config that judges it.

Every threshold that depends on the machine and the traffic is measured as the sidecar will
read it: a short load sweep (the latency thresholds, :mod:`inferwatch.calibration`), normal
traffic read by the sidecar's own parts (``normal_traffic.py``), the longest engine step
(``engine_steps.py``) and the capacity (``--search on``, ``sweep/search.py``). Each value is
written with its source (``calibrate_file.py``); what could not be measured says why, and
keys of ``--config`` are carried over, a threshold set there winning.

Exit status: 0; 1 when the sweep cannot run; 2 for bad input.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from inferwatch.baseline import Baseline, to_yaml
from inferwatch.calibration import (
    Derived,
    NormalReadings,
    objectives_from,
    thresholds_from,
    thresholds_from_readings,
)
from inferwatch.collect.stream import Client, SweepError
from inferwatch.method.spec import Spec, spec_from_config
from inferwatch.method.thresholds import MACHINE_DEPENDENT, THRESHOLDS
from inferwatch.serve import options as serve_options
from inferwatch.serve.config import ServeConfig
from inferwatch.settings import ConfigError, Option, bounded_int, http_url, resolve
from inferwatch.tools.calibrate_file import Measurements, config_text, holds_secret
from inferwatch.tools.engine_steps import LongestStep, longest_step, max_model_len
from inferwatch.tools.normal_traffic import EmbeddedSidecar, closed_loop, read_normal
from inferwatch.tools.sweep import command as sweep
from inferwatch.tools.sweep.prompts import Prompts
from inferwatch.tools.sweep.prompts import calibrate as fit_prompts
from inferwatch.tools.sweep.search import search_shape, summary

# The sweep's options less those of the baseline file, with defaults for a short run: the
# user names the concurrency and lengths of the traffic the service is for. The capacity
# search is on: the capacity is one of the figures the rules judge with.
_SHORT = {
    "--concurrency": "1,4",
    "--output-tokens": "64",
    "--search": "on",
    "--search-seconds": "300",
}
SHORT_PROMPT_TOKENS = (256,)  # unless --prompts or --prompt-tokens say otherwise
_LEFT_OUT = ("--out", "--previous", "--regression-factor")
# The sidecar's poll while calibrate reads it: fine enough to time an engine step.
STEP_POLL = 0.05
# Prompt tags past the sweep's (its cells, its probe and its search steps).
TAGS = 1_000_000
OPTIONS = (
    Option(
        "--out",
        parse=sweep.new_file,
        default=None,
        help="config file to write (required)",
        metavar="FILE",
    ),
    Option(
        "--baseline-out",
        parse=sweep.new_file,
        default=None,
        help="baseline file to write (default: baseline.yaml beside --out)",
        metavar="FILE",
    ),
    *(
        dataclasses.replace(
            o,
            default=_SHORT.get(o.flag, o.default),
            help=o.help.replace(sweep.DEFAULT_PROMPT_TOKENS, str(SHORT_PROMPT_TOKENS[0])),
        )
        for o in sweep.OPTIONS
        if o.flag not in _LEFT_OUT
    ),
    Option(
        "--normal-windows",
        parse=bounded_int(0, 100),
        default=2,
        help="rate windows of normal traffic the sidecar's own parts read after the sweep (its CPU "
        "wait, the canary's gap, the ITL tail, the frontend's CPU); 0: none",
        metavar="N",
    ),
    Option(
        "--normal-traffic",
        parse=str,
        default="sweep",
        help="normal traffic: the sweep's highest concurrency over its shapes, or the server's "
        "own (observe: the service carries its usual traffic meanwhile)",
        choices=("sweep", "observe"),
    ),
    Option(
        "--canary-url",
        parse=http_url,
        default=None,
        help="the path users take to the server, for the canary's gap (default: --url)",
        metavar="URL",
    ),
    Option(
        "--engine-step",
        parse=str,
        default="on",
        help="measure the longest engine step at the server's biggest batch (two bursts that "
        "overflow its KV cache), for serve's engine_step_seconds",
        choices=("on", "off"),
    ),
)


def main(flags: Mapping[str, Any], config: Mapping[str, Any], config_name: str) -> int:
    """``inferwatch calibrate``; returns the exit status (ConfigError for bad input)."""
    values = resolve(OPTIONS, flags, {})
    if values["out"] is None:
        raise ConfigError("--out is required (or INFERWATCH_OUT)")
    out: Path = values["out"]
    baseline_path: Path = values["baseline_out"] or out.with_name("baseline.yaml")
    if baseline_path.resolve() == out.resolve():
        raise ConfigError("--baseline-out and --out name the same file")
    spec = spec_from_config(config)
    if values["prompts"] is None and values["prompt_tokens"] is None:
        values["prompt_tokens"] = SHORT_PROMPT_TOKENS
    plan = sweep.plan_from({**values, "out": baseline_path, "previous": None}, spec.slos)
    sidecar = _sidecar_config(plan, values, config)
    try:
        measured, _ = sweep.measure(dataclasses.replace(plan, search=None))
    except sweep.SweepFailed as failed:
        return failed.code
    baseline = measured.baseline()
    derived = thresholds_from(baseline, spec.threshold("regression_factor"), spec.window_seconds)
    try:
        measurements, baseline = asyncio.run(
            _beyond_the_sweep(plan, values, sidecar, config, baseline, derived)
        )
    except SweepError as exc:
        print(f"inferwatch: error: {exc}", file=sys.stderr)
        return sweep.EXIT_FAILED
    objectives = objectives_from(baseline, spec.threshold("regression_factor"))
    text = config_text(baseline, baseline_path, measurements, config, config_name, objectives)
    spec_from_config(yaml.safe_load(text))  # what was written reads back under the same rules
    sweep.write_file(baseline_path, to_yaml(baseline))
    sweep.write_file(out, text, private=holds_secret(config))
    _report(measurements, config, objectives)
    print(f"inferwatch: wrote {out} and {baseline_path}", file=sys.stderr)
    return 0


def _report(
    measurements: Measurements, config: Mapping[str, Any], objectives: Mapping[str, Any]
) -> None:
    """What was measured and what was not, on stderr."""
    for name, found in measurements.derived.items():
        print(f"inferwatch: {name} {found.value:g} ({found.source})", file=sys.stderr)
    for name, why in measurements.not_measured.items():
        print(f"inferwatch: {name} not measured: {why}", file=sys.stderr)
    if not config.get("slos"):
        for kind, (objective, why) in objectives.items():
            print(f"inferwatch: slo {kind} {objective} ({why})", file=sys.stderr)
    given = config.get("thresholds") or {}
    left = [n for n in measurements.not_measured if n in MACHINE_DEPENDENT and n not in given]
    if left:
        print(
            f"inferwatch: uncalibrated (the alerts on them stay at info): {', '.join(left)}",
            file=sys.stderr,
        )


def _sidecar_config(
    plan: sweep.Plan, values: Mapping[str, Any], config: Mapping[str, Any]
) -> ServeConfig:
    """The sidecar calibrate runs: serve's settings from the same config, against the
    server (--url, or behind a router --replica-url), its canary on (unless the config
    turns it off) through --canary-url (default: --url, the users' path), polled often
    enough to time an engine step."""
    flags: dict[str, Any] = {"backend_url": plan.server_root, "capture_dir": None}
    if values["canary_url"] or plan.replica_root:
        flags["canary_url"] = values["canary_url"] or values["url"]
    if config.get("canary", "on") != "off":
        flags["canary"] = "on"
    resolved = resolve(serve_options.OPTIONS, flags, config)
    resolved["poll_interval"] = min(resolved["poll_interval"], STEP_POLL)
    resolved["canary_model"] = resolved["canary_model"] or values["model"]
    return ServeConfig.from_values(resolved)


def _note(text: str) -> None:
    print(f"inferwatch: {text}", file=sys.stderr)


async def _beyond_the_sweep(
    plan: sweep.Plan,
    values: Mapping[str, Any],
    sidecar_config: ServeConfig,
    config: Mapping[str, Any],
    baseline: Baseline,
    derived: Mapping[str, Derived],
) -> tuple[Measurements, Baseline]:
    """Steps 2 to 4 of the module's docstring, with one client and the sidecar's parts."""
    found = dict(derived)
    not_measured: dict[str, str] = {}
    spec = _spec(config, found)
    client, server = (
        Client(
            root,
            plan.api,
            plan.model,
            timeout=plan.request_timeout,
            connections=0,
            api_key=plan.api_key,
        )
        for root in (plan.root, plan.server_root)
    )
    try:
        prompts = await _prompts(plan, client)
        async with EmbeddedSidecar(sidecar_config, spec) as sidecar:
            try:
                await sidecar.wait_until_up(30.0)
            except TimeoutError as exc:
                raise SweepError(str(exc)) from None
            readings = await _normal(sidecar, plan, values, client, prompts)
            more, why_not = _from_readings(readings, spec, derived, values["normal_windows"])
            found.update(more)
            not_measured.update(why_not)
            if values["engine_step"] == "on":  # one engine's: sent to it, past any router
                context = await max_model_len(plan.server_root, plan.model, plan.request_timeout)
                step = await longest_step(
                    sidecar, server, prompts, min(plan.prompt_tokens), TAGS + 2, context
                )
                if isinstance(step, LongestStep):
                    seconds = max(step.seconds, sidecar.poller.settings.interval)
                    found["engine_step_seconds"] = Derived(seconds, step.source)
                else:
                    not_measured["engine_step_seconds"] = step
            else:
                not_measured["engine_step_seconds"] = "--engine-step off"
        if plan.search is not None:
            baseline = await _capacity(plan, client, prompts, baseline, _spec(config, found))
    finally:
        await client.close()
        await server.close()
    return Measurements(found, not_measured), baseline


def _spec(config: Mapping[str, Any], found: Mapping[str, Derived]) -> Spec:
    """The spec with the thresholds measured so far."""
    return spec_from_config(config, {n: d.value for n, d in found.items() if n in THRESHOLDS})


async def _prompts(plan: sweep.Plan, client: Client) -> Prompts:
    """The sweep's prompts again: the file's, or generated to length (fitted anew)."""
    prompts = Prompts(plan.api, plan.seed, file=plan.file_prompts)
    return prompts if plan.file_prompts else await fit_prompts(client, prompts, TAGS, _note)


async def _normal(
    sidecar: EmbeddedSidecar,
    plan: sweep.Plan,
    values: Mapping[str, Any],
    client: Client,
    prompts: Prompts,
) -> NormalReadings | None:
    """The sidecar's readings under normal traffic (None with --normal-windows 0)."""
    if not values["normal_windows"]:
        return None
    traffic: Callable[[asyncio.Event], Any] | None = None
    if values["normal_traffic"] == "sweep":

        def traffic(stop: asyncio.Event) -> Any:
            return closed_loop(
                client, prompts, plan.shapes(), max(plan.concurrency), TAGS + 1, stop
            )

    return await read_normal(sidecar, values["normal_windows"], traffic, _note)


def _from_readings(
    readings: NormalReadings | None,
    spec: Spec,
    derived: Mapping[str, Derived],
    windows: int,
) -> tuple[dict[str, Derived], dict[str, str]]:
    """The thresholds the readings set, and why the others were not measured."""
    if readings is None:
        return {}, {name: "--normal-windows 0" for name in MACHINE_DEPENDENT if name not in derived}
    sources = {name: f"measured by the sweep: {d.source}" for name, d in derived.items()}
    sources |= {n: f"the default {spec.threshold(n):g}" for n in THRESHOLDS if n not in derived}
    found, why_not = thresholds_from_readings(readings, spec.threshold, sources)
    return found, {n: why for n, why in why_not.items() if n not in derived}


async def _capacity(
    plan: sweep.Plan, client: Client, prompts: Prompts, baseline: Baseline, spec: Spec
) -> Baseline:
    """The baseline with the capacity at each shape: the highest rate whose goodput meets
    its target, a good request's first token within the calibrated TTFT threshold (unless
    an objective or --goodput-ttft gives one); behind a router, one replica's share."""
    assert plan.search is not None
    objectives = plan.objectives
    if objectives.ttft is None:
        objectives = dataclasses.replace(objectives, ttft=spec.threshold("ttft_p95_seconds"))
    found = []
    for index, shape in enumerate(plan.shapes()):
        first_tag = TAGS + 10 + index * (plan.search.steps + 1)
        capacity = await search_shape(
            client, prompts, shape, plan.search, objectives, plan.seed, first_tag, _note
        )
        print(summary(capacity))
        found.append(capacity.share(plan.replicas))
    metadata = {**baseline.metadata, "goodput_objectives": objectives.document()}
    return dataclasses.replace(baseline, metadata=metadata, capacity=tuple(found))
