"""``inferwatch calibrate``: measure the service, then write the config that judges it.

Baseline first: a short load sweep (``inferwatch baseline``, see ``sweep/command.py``) against the
server, and from what it measured a complete, commented inferwatch config (see
:func:`inferwatch.baseline.thresholds_from`):

- latency thresholds: ``regression_factor`` x the TTFT p95, ITL p95 and ITL p99 at the
  highest measured concurrency, from the server's own histograms (what the rules evaluate);
- the minimum traffic under which latency quantiles are not judged, from the rate window and
  the throughput measured at the lowest concurrency;
- ``baseline:`` the baseline file it wrote, for ``serve`` (``inferwatch_baseline_*``);
- ``slos:`` objectives users can be promised (see :func:`inferwatch.baseline.objectives_from`):
  95 % of first tokens and of output tokens within the server's bucket bound above the
  measured p99 (times ``regression_factor``), 99.9 % of requests without a server error.

The other thresholds are ratios of the server to itself (queue share, KV use...) and keep
their defaults; keys of ``--config`` (timing, exporter settings, thresholds set there) are
carried over, and a threshold set there wins over the measured one. Each threshold's comment
says where its number came from. ``inferwatch generate --config FILE`` then writes the rules
for this service. Sample of the file::

    # measured: 1.5 x 0.0523 s, the server's TTFT p95 at concurrency 4 (prompt 256, output 64)
    ttft_p95_seconds: 0.07845

Exit status: 0; 1 when the sweep cannot run; 2 for bad input.
"""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from inferwatch import __version__
from inferwatch.baseline import Baseline, to_yaml
from inferwatch.calibration import Derived, objectives_from, thresholds_from
from inferwatch.collect.backends import BACKENDS
from inferwatch.logs import printable
from inferwatch.method.spec import spec_from_config
from inferwatch.method.thresholds import THRESHOLDS
from inferwatch.settings import ConfigError, Option, resolve
from inferwatch.tools.sweep import command as sweep

# The sweep's options less those of the baseline file, with defaults for a short run: the
# user names the concurrency and lengths of the traffic the service is for.
_SHORT = {"--concurrency": "1,4", "--output-tokens": "64"}
SHORT_PROMPT_TOKENS = (256,)  # unless --prompts or --prompt-tokens say otherwise
_LEFT_OUT = ("--out", "--previous", "--regression-factor")
OPTIONS = (
    Option("--out", sweep.new_file, None, "config file to write (required)", metavar="FILE"),
    Option(
        "--baseline-out",
        sweep.new_file,
        None,
        "baseline file to write (default: baseline.yaml beside --out)",
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
)

CONFIG_HEADER = """\
# inferwatch config written by `inferwatch calibrate` (inferwatch {version}) on {date}.
# Measured: {backend} {server_version} serving {model!r} at {url} (gpu: {gpu}), {cells} cells:
# concurrency {concurrency} x prompt tokens {prompts} x output tokens {outputs}; the
# sweep is in {baseline}.
# Each threshold says where its number comes from: measured (that sweep), set (in {given}),
# or default. Run calibrate again after a change of model, hardware, server version or
# traffic; `inferwatch generate --config` of this file writes the rules for this service.
"""


def _comment(text: str) -> str:
    return textwrap.fill(text, 96, initial_indent="  # ", subsequent_indent="  # ")


def config_text(
    baseline: Baseline,
    baseline_path: Path,
    derived: Mapping[str, Derived],
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
    text += _thresholds(derived, given.get("thresholds") or {}, given_name)
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
        url=meta.get("url", "?"),
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


def _holds_secret(config: Mapping[str, Any]) -> bool:
    """Whether the settings carried over from ``--config`` hold a secret: a header's value,
    or a URL's ``user:password@`` (the only ``@`` a URL setting may hold)."""
    urls = (str(config.get(key, "")) for key in ("backend_url", "canary_url"))
    return "backend_header" in config or any("@" in url for url in urls)


def _carried(doc: dict[str, Any], given_name: str) -> str:
    """Settings of ``--config`` written back as they were given."""
    return f"\n# carried over from {given_name}\n" + yaml.safe_dump(doc, sort_keys=False)


def _thresholds(
    derived: Mapping[str, Derived], set_here: Mapping[str, Any], given_name: str
) -> str:
    """``thresholds:``, each with a comment saying where its number comes from: set in
    ``--config``, measured (the module's sample), or the default and why."""
    text = "\nthresholds:\n"
    for name, threshold in THRESHOLDS.items():
        if name in set_here:
            value, why = float(set_here[name]), f"set in {given_name}"
        elif name in derived:
            value, why = derived[name].value, f"measured: {derived[name].source}"
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
        text += f"{_comment(why)}\n".replace("  # ", "    # ")
        text += f"    {kind}: {yaml.safe_dump(objective, default_flow_style=True).strip()}\n"
    return text


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
    try:
        measured, _ = sweep.measure(plan)
    except sweep.SweepFailed as failed:
        return failed.code
    baseline = measured.baseline()
    derived = thresholds_from(baseline, spec.threshold("regression_factor"), spec.window_seconds)
    objectives = objectives_from(baseline, spec.threshold("regression_factor"))
    text = config_text(baseline, baseline_path, derived, config, config_name, objectives)
    spec_from_config(yaml.safe_load(text))  # what was written reads back under the same rules
    sweep.write_file(baseline_path, to_yaml(baseline))
    sweep.write_file(out, text, private=_holds_secret(config))
    for name, found in derived.items():
        print(f"inferwatch: {name} {found.value:g} ({found.source})", file=sys.stderr)
    if not config.get("slos"):
        for kind, (objective, why) in objectives.items():
            print(f"inferwatch: slo {kind} {objective} ({why})", file=sys.stderr)
    print(f"inferwatch: wrote {out} and {baseline_path}", file=sys.stderr)
    return 0
