"""The config ``inferwatch calibrate`` writes: every setting with where its number came from.

Each threshold is written with a comment saying whether it was measured (and how: the
figure, its spread, the margin), set in ``--config``, or left at its default. A
machine-dependent threshold (``THRESHOLDS``' ``calibrated_by``) that could not be measured is
written commented out, with why: its default is then what the spec judges with, and the
alerts that fire on it stay at info. Sample::

    # measured: 2 x 0.0131 s, the largest of 30 readings of whole rate windows under normal
    # traffic, 0.0102 to 0.0131
    ttft_p95_seconds: 0.0262
    # not measured (the sidecar could not read it: no process listens on port 8000 here);
    # default: A thread that is ready to run waits for a CPU now and then; ...
    # server_cpu_wait_share: 0.25
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from inferwatch import __version__
from inferwatch.baseline import Baseline
from inferwatch.calibration import Derived
from inferwatch.collect.backends import BACKENDS
from inferwatch.logs import printable
from inferwatch.method.thresholds import MACHINE_DEPENDENT, THRESHOLDS


@dataclass(frozen=True)
class Measurements:
    """What calibrate measured: thresholds (and ``engine_step_seconds``) with their sources,
    and why each machine-dependent one it could not measure was not."""

    derived: Mapping[str, Derived]
    not_measured: Mapping[str, str] = field(default_factory=dict)


CONFIG_HEADER = """\
# inferwatch config written by `inferwatch calibrate` (inferwatch {version}) on {date}.
# Measured: {backend} {server_version} serving {model!r} at {url} (gpu: {gpu}), {cells} cells:
# concurrency {concurrency} x prompt tokens {prompts} x output tokens {outputs}; the
# sweep is in {baseline}; then normal traffic as the sidecar reads it, and bursts.
# Each setting says where its number comes from: measured, set (in {given}), or default;
# a machine-dependent threshold not measured is commented out (its alerts stay at info).
# Run calibrate again after a change of model, hardware, server version or traffic;
# `inferwatch generate --config` of this file writes the rules for this service.
"""


def _comment(text: str, indent: str = "  ") -> str:
    return textwrap.fill(text, 96, initial_indent=f"{indent}# ", subsequent_indent=f"{indent}# ")


def config_text(
    baseline: Baseline,
    baseline_path: Path,
    measured: Measurements,
    given: Mapping[str, Any],
    given_name: str,
    objectives: Mapping[str, tuple[dict, str]] | None = None,
) -> str:
    """The config file: header, ``baseline:``, the carried-over settings, every threshold."""
    meta = baseline.metadata
    text = _header(baseline, baseline_path, given_name)
    text += "\n# serve: expose the comparable cell of the sweep as inferwatch_baseline_* gauges.\n"
    text += yaml.safe_dump({"baseline": str(baseline_path)})
    sections = ("baseline", "thresholds", "alerting", "slos")
    carried = {k: v for k, v in given.items() if k not in sections}
    if carried:
        text += _carried(carried, given_name)
    if "backend" not in given and meta.get("backend") in BACKENDS:
        # serve needs no detection, and generate checks objectives against its buckets
        text += f"\n# measured: the server swept\nbackend: {meta['backend']}\n"
    if "engine_step_seconds" not in given:
        text += _engine_step(measured)
    text += _thresholds(measured, given.get("thresholds") or {}, given_name)
    if given.get("alerting"):
        text += _carried({"alerting": given["alerting"]}, given_name)
    if given.get("slos"):
        text += _carried({"slos": given["slos"]}, given_name)
    elif objectives:
        text += _proposed_objectives(objectives)
    return text


def _header(baseline: Baseline, baseline_path: Path, given_name: str) -> str:
    """:data:`CONFIG_HEADER` for this sweep: what was measured, where, and how."""
    cells = baseline.cells
    meta = {k: _one_line(v) for k, v in baseline.metadata.items()}
    return CONFIG_HEADER.format(
        version=__version__,
        date=meta.get("date", "?"),
        backend=meta.get("backend", "unknown"),
        server_version=meta.get("version") or "",
        model=meta.get("model", "?"),
        url=meta.get("url", "?")
        + (
            f" (a router in front of {meta['replicas']} replicas: the rates here are one's share)"
            if "replicas" in meta
            else ""
        ),
        gpu=meta.get("gpu", "unknown"),
        cells=len(cells),
        concurrency=",".join(str(c) for c in sorted({c.concurrency for c in cells})),
        prompts=",".join(str(c or "file") for c in sorted({c.prompt_tokens for c in cells})),
        outputs=",".join(str(c) for c in sorted({c.output_tokens for c in cells})),
        baseline=baseline_path,
        given=given_name,
    )


def _one_line(value: object) -> str:
    """What the server (or the flags) said, as data in a comment line: a line break in a
    server's version would otherwise start keys of the config."""
    return printable(str(value))


def holds_secret(config: Mapping[str, Any]) -> bool:
    """Whether the settings carried over from ``--config`` hold a secret: a header's value,
    or a URL's ``user:password@`` (the only ``@`` a URL setting may hold)."""
    urls = (str(config.get(key, "")) for key in ("backend_url", "canary_url"))
    return "backend_header" in config or any("@" in url for url in urls)


def _carried(doc: dict[str, Any], given_name: str) -> str:
    """Settings of ``--config`` written back as they were given."""
    return f"\n# carried over from {given_name}\n" + yaml.safe_dump(doc, sort_keys=False)


def _engine_step(measured: Measurements) -> str:
    """``engine_step_seconds``, for serve: measured, or left to serve's default."""
    step = measured.derived.get("engine_step_seconds")
    if step is not None:
        why = f"measured: {step.source}"
        return f"\n{_comment(why, indent='')}\nengine_step_seconds: {step.value:g}\n"
    why = measured.not_measured.get("engine_step_seconds", "calibrate was told not to")
    return f"\n# engine_step_seconds: not measured ({_one_line(why)}); serve's default holds\n"


def _thresholds(measured: Measurements, set_here: Mapping[str, Any], given_name: str) -> str:
    """``thresholds:``, each with a comment saying where its number comes from: set in
    ``--config``, measured (the module's sample), or the default and why; a
    machine-dependent one left at its default is commented out."""
    text = "\nthresholds:\n"
    for name, threshold in THRESHOLDS.items():
        derived = measured.derived.get(name)
        if name in set_here:
            value, why = float(set_here[name]), f"set in {given_name}"
        elif derived is not None:
            value, why = derived.value, f"measured: {derived.source}"
        elif name in MACHINE_DEPENDENT:
            why = _one_line(measured.not_measured.get(name, "calibrate measured nothing for it"))
            text += f"{_comment(f'not measured ({why}); default: {threshold.why}')}\n"
            text += f"  # {name}: {threshold.default:g}\n"
            continue
        else:
            value, why = threshold.default, f"default: {threshold.why}"
        text += f"{_comment(why)}\n  {name}: {value:g}\n"
    return text


def _proposed_objectives(objectives: Mapping[str, tuple[dict, str]]) -> str:
    """``slos:`` proposed from the sweep, each objective with why it can be promised."""
    text = (
        "\n# Proposed objectives: what this service can promise its users, to agree on "
        "before\n# relying on them (the burn-rate alerts page on them; see docs/slos.md).\n"
        "slos:\n  window: 28d\n  objectives:\n"
    )
    for kind, (objective, why) in objectives.items():
        text += f"{_comment(why, indent='    ')}\n"
        text += f"    {kind}: {yaml.safe_dump(objective, default_flow_style=True).strip()}\n"
    return text
