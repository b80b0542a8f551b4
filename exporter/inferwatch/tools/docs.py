"""Keeps the generated regions of the docs pages equal to what they are generated from.

``make generate`` runs ``python -m inferwatch.tools.docs``. Each region sits between two HTML
comments and is rewritten from its definition: the flags of ``docs/exporter.md``, the metric
table of ``docs/metrics.md``, the alert table of ``docs/alerts.md``, the backend matrix of
``docs/backends.md``, the example config and burn table of ``docs/slos.md``. The regions a run
writes are :mod:`inferwatch.tools.measured`'s.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from inferwatch.collect.backends import BACKENDS, Backend, Feed, Source
from inferwatch.method.alerts import ALERTS, OUTSIDE_THE_SLIS, Cond
from inferwatch.method.alerts.slo import SLO_FAST, SLO_SLOW
from inferwatch.method.findings import fmt
from inferwatch.method.signals import MODEL, SIGNALS
from inferwatch.method.slo.alerting import FAST, SLOW
from inferwatch.method.slo.burns import BURNS
from inferwatch.method.slo.objectives import SLOs
from inferwatch.method.spec import Spec, spec_from_config
from inferwatch.metrics import (
    BACKEND,
    BASELINE,
    CANARY,
    CAPACITY,
    CAPTURE,
    DERIVED,
    GPU,
    LATENCY_WINDOW,
    SELF,
    SERVER_CPU,
    MetricDef,
)
from inferwatch.serve.options import OPTIONS
from inferwatch.settings import Option

ABSENT = "—"


@dataclass(frozen=True)
class Region:
    """A part of a page between two markers, written by ``render``."""

    name: str
    source: str  # what it is generated from, as the marker says
    render: Callable[[], str]
    by: str = "make generate"

    @property
    def begin(self) -> str:
        return f"<!-- {self.name}: generated from {self.source} by {self.by}; do not edit -->\n"

    @property
    def end(self) -> str:
        return f"<!-- end of {self.name} -->\n"

    def span(self, text: str, page: str = "the page") -> tuple[int, int]:
        """Where the region's body starts and stops in ``text``."""
        if text.count(self.begin) != 1 or text.count(self.end) != 1:
            raise ValueError(
                f"{page}: expected one {self.begin.strip()} and one {self.end.strip()}"
            )
        start, stop = text.index(self.begin) + len(self.begin), text.index(self.end)
        if stop < start:
            raise ValueError(f"{page}: {self.end.strip()} comes before its start")
        return start, stop

    def body(self, text: str) -> str:
        start, stop = self.span(text)
        return text[start:stop]

    def write(self, text: str, body: str, page: str = "the page") -> str:
        start, stop = self.span(text, page)
        return text[:start] + body + text[stop:]


def cell(text: str) -> str:
    """Text for a Markdown table cell: a ``|`` (even in a code span) is no column break."""
    return text.replace("|", "\\|")


def prose(text: str) -> str:
    """Plain text for a table cell: no column breaks, no accidental emphasis."""
    return cell(text).replace("*", "\\*")


# -- docs/exporter.md: the flags ---------------------------------------------------------


def _default(option: Option) -> str:
    value = option.default
    if value is None:
        return ABSENT
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, int) and value >= 1024:
        for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
            if value % size == 0:
                return f"`{value}` ({value // size} {unit})"
    return f"`{value}`"


def flags_table() -> str:
    """One row per option of ``inferwatch serve``: flag, variable, config key, default, help."""
    rows = [
        "| flag | environment variable | config key | default | what |",
        "|---|---|---|---|---|",
    ]
    for option in OPTIONS:
        what = prose(option.help)
        if option.choices:
            what += "; one of " + ", ".join(f"`{c}`" for c in option.choices)
        rows.append(
            f"| `{option.flag}` | `{option.env}` | `{option.key}` | {_default(option)} | {what} |"
        )
    return "\n".join(rows) + "\n"


# -- docs/alerts.md: the cause alerts ----------------------------------------------------


# Each group of the metric contract with the labels all its series carry ([engine]: where
# the server has one).
METRIC_GROUPS: tuple[tuple[str, dict[str, MetricDef], tuple[str, ...]], ...] = (
    ("backend", BACKEND, ("backend", "model", "[engine]")),
    ("GPU (NVML)", GPU, ("gpu", "uuid", "name")),
    ("derived", DERIVED, ("backend", "model", "[engine]")),
    ("latency window", LATENCY_WINDOW, ("backend", "model", "quantile")),
    (
        "baseline",
        BASELINE,
        ("backend", "model", "concurrency", "prompt_tokens", "output_tokens", "percentile"),
    ),
    ("capacity", CAPACITY, ("backend", "model", "prompt_tokens", "output_tokens")),
    ("canary", CANARY, ("backend", "model")),
    ("capture", CAPTURE, ()),
    ("server CPU", SERVER_CPU, ()),
    ("exporter", SELF, ()),
)


def metric_table() -> str:
    """The metric table of docs/metrics.md, one row per family, from the definitions."""
    rows = ["| series | type | labels | meaning |", "|---|---|---|---|"]
    for group, defs, labels in METRIC_GROUPS:
        for d in defs.values():
            names = ", ".join(f"`{x}`" for x in (*labels, *d.labels)) or "none"
            rows.append(f"| `{d.name}` | {d.kind.value} | {names} | {group}: {d.help} |")
    return "\n".join(rows) + "\n"


# -- docs/alerts.md: the cause alerts ----------------------------------------------------


def _condition(cond: Cond, spec: Spec) -> str:
    signal = SIGNALS[cond.signal]
    label, fallback = signal.label, signal.fallback
    while fallback is not None:  # what the server lacking the signal's series is judged on
        label += f" (else {SIGNALS[fallback].label})"
        fallback = SIGNALS[fallback].fallback
    return f"{label} {cond.op} {fmt(cond.bound(spec), signal.unit)}"


def alert_table(spec: Spec | None = None, runbooks: str = "../alerts/runbooks/") -> str:
    """One row per cause alert: severity, phase / layer, scope and when it fires."""
    spec = spec_from_config({}) if spec is None else spec
    rows = [
        "| alert | severity | phase / layer | scope | fires when (defaults) |",
        "|---|---|---|---|---|",
    ]
    for alert in ALERTS.values():
        severity = spec.severity(alert)
        if alert.severity == "critical" and alert.name not in OUTSIDE_THE_SLIS:
            severity += " (critical with `paging: causes`)"
        when = ", ".join(_condition(c, spec) for c in alert.when)
        when += " or ".join(_condition(c, spec) for c in alert.any_of)
        if alert.unless:
            when += ", unless " + " or ".join(_condition(c, spec) for c in alert.unless)
        rows.append(
            f"| [{alert.name}]({runbooks}{alert.name}.md) | {severity} | {alert.phase} / "
            f"{alert.layer} | {'model' if alert.level == MODEL else 'pod'} | {when}, for "
            f"{spec.timing.for_alert(alert)} |"
        )
    return "\n".join(rows) + "\n"


# -- docs/backends.md: the matrix --------------------------------------------------------


def _family(source: Source) -> str:
    """A source as it reads on the page: its name, the label values it keeps, its scale."""
    where = ",".join(
        f'{label}="{test}"' if isinstance(test, str) else f"{label}=…"
        for label, test in source.where.items()
    )
    text = f"`{source.name}{{{where}}}`" if where else f"`{source.name}`"
    if source.scale != 1.0:
        text += f" x {source.scale:g}"
    return text


def _labels_product(labels: tuple[str, ...]) -> str:
    return " x ".join(f"`{label}`" for label in labels)


def source_cell(source: Source) -> str:
    """How one source gives its contract series: read, or derived from labels or a product."""
    if source.from_labels:
        alternatives = ", else ".join(_labels_product(a) for a in source.from_labels)
        return f"derived: {_family(source)}'s labels {alternatives}"
    if source.times is not None:
        return f"derived: {_family(source)} x {_family(source.times)}"
    return _family(source)


def _twin(source: Source) -> str:
    """A source with ``_`` for ``:`` in its name: the same family as a relay re-exposes it
    (SGLang's SMG router writes ``sglang_*`` for ``sglang:*``)."""
    return source_cell(
        Source(source.name.replace(":", "_"), where=source.where, scale=source.scale)
    )


def feed_cell(found: Feed | None) -> str:
    """The matrix cell of one backend's feed: its first source, and how many other families
    it falls back to (a family's ``_``-for-``:`` twin is not another one); a feed that adds
    its sources, all of them."""
    if found is None:
        return ABSENT
    if found.adds:  # every source on the page, added
        return " + ".join(source_cell(s) for s in found.sources)
    cell = source_cell(found.sources[0])
    more = len({_twin(s) for s in found.sources}) - 1
    if more:
        cell += f" (+{more} fallback{'s' if more > 1 else ''})"
    return cell


def _feed(backend: Backend, key: str) -> Feed | None:
    return next((f for f in backend.feeds if f.key == key), None)


def backends_matrix() -> str:
    """One row per backend series of the contract, one column per backend (``--backend``)."""
    backends = list(BACKENDS.values())
    rows = [
        "| series | " + " | ".join(f"`{b.name}`" for b in backends) + " |",
        "|---|" + "---|" * len(backends),
    ]
    for key, definition in BACKEND.items():
        cells = [cell(feed_cell(_feed(b, key))) for b in backends]
        rows.append(f"| `{definition.name}` | " + " | ".join(cells) + " |")
    recognised = [", ".join(f"`{p}…`" for p in b.signature) for b in backends]
    rows.append("| *`--backend auto` recognises* | " + " | ".join(recognised) + " |")
    profilers = [
        f"`{b.profiler.start_path}`, `{b.profiler.stop_path}`" if b.profiler else ABSENT
        for b in backends
    ]
    rows.append("| *profiler endpoints (capture)* | " + " | ".join(profilers) + " |")
    return "\n".join(rows) + "\n"


# -- docs/slos.md: the burn-rate conditions ----------------------------------------------


def burn_table(window: str | None = None) -> str:
    """The multi-window burn-rate conditions, with their factor over the compliance window."""
    window = SLOs.window if window is None else window
    rows = [
        f"| alert | budget spent | long and short window | burn factor ({window}) |",
        "|---|---|---|---|",
    ]
    for burn in BURNS:
        alert = FAST if burn.severity == "critical" else SLOW
        tier = "page" if burn.severity == "critical" else "ticket"
        rows.append(
            f"| `{alert}` ({tier}) | {burn.share * 100:g} % | {burn.long} and {burn.short} | "
            f"{burn.threshold(window)}x |"
        )
    return "\n".join(rows) + "\n"


SLO_EXAMPLE = "alerts/slos.example.yaml"


def slo_example(root: Path | None = None) -> str:
    """The example config's SLO section as committed (its header comment left out), read
    from the checkout this module runs from (``make generate`` runs in one)."""
    root = Path(__file__).resolve().parents[3] if root is None else root
    lines = (root / SLO_EXAMPLE).read_text().splitlines(keepends=True)
    body = "".join(lines[next(i for i, line in enumerate(lines) if not line.startswith("#")) :])
    return "```yaml\n" + body + "```\n"


def slo_scenarios() -> str:
    """The SLO alerts' promtool scenarios by name (each says what must fire, and when)."""
    return "".join(f"- {prose(s['name'])}\n" for s in (*SLO_FAST, *SLO_SLOW))


# -- the pages ---------------------------------------------------------------------------

PACKAGE = "exporter/inferwatch/"

PAGES: dict[str, tuple[Region, ...]] = {
    "docs/exporter.md": (Region("flags table", PACKAGE + "serve/options.py", flags_table),),
    "docs/metrics.md": (Region("metric table", PACKAGE + "metrics/", metric_table),),
    "docs/alerts.md": (Region("alert table", PACKAGE + "method/alerts/", alert_table),),
    "docs/backends.md": (Region("backend matrix", PACKAGE + "collect/backends/", backends_matrix),),
    "docs/slos.md": (
        Region("slo example", SLO_EXAMPLE, slo_example),
        Region("burn table", PACKAGE + "method/slo/burns.py", burn_table),
        Region("slo scenarios", PACKAGE + "method/alerts/slo.py", slo_scenarios),
    ),
}


def with_regions(text: str, regions: tuple[Region, ...], page: str = "the page") -> str:
    """``text`` with each region rewritten from its definition."""
    for region in regions:
        text = region.write(text, region.render(), page)
    return text


def generate(root: Path) -> list[str]:
    """Rewrites every page's regions under ``root``; returns the pages that changed."""
    changed = []
    for page, regions in PAGES.items():
        path = root / page
        text = path.read_text()
        new = with_regions(text, regions, page)
        if new != text:
            path.write_text(new)
            changed.append(page)
    return changed


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(".")
    for page in generate(root):
        print(f"rewrote {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
