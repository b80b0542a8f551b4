"""Prometheus text exposition, read line by line: the samples of the wanted names.

Only the lines of the names asked for are read, and each label text is left for
:func:`parse_labels` so that callers can cache per text (``bench/exporter.py`` compares it
with prometheus_client's parser). The text format: ``name{label="value",...} value
[timestamp]``, label values with ``\\\\``, ``\\"`` and ``\\n`` escapes, ``NaN``/``+Inf``/``-Inf``
(and ``-nan(ind)``); OpenMetrics pages read the same, exemplars skipped. A malformed line of a
wanted name is reported in :attr:`Scan.malformed` and its samples left out; an oversized label
set is counted in :attr:`Scan.oversized`; a page cut short, or over the caller's sample
budget, raises :class:`ExpositionError`.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

from inferwatch.model import Labels

_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}
# A sample name runs to the first brace or blank.
SAMPLE_NAME = re.compile(r"([^{\s]+)[ \t]*")

# Suffixes a sample name adds to its family name (counters, histograms, _created gauges).
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")

Samples = dict[str, list[tuple[str, float]]]

# A UTF-8 byte-order mark some proxies and gateways put before a body: not part of the page.
BOM = "\ufeff"


class ExpositionError(ValueError):
    """The body is not usable Prometheus text exposition; ``str()`` is a one-line cause.

    ``kind`` names the cause without its details (``"truncated"``, ``"malformed"``...), so
    that logs can be rate limited by kind whatever the text.
    """

    def __init__(self, cause: str, kind: str = "malformed") -> None:
        super().__init__(cause)
        self.kind = kind


@dataclass
class Scan:
    """What a scan found: samples of the wanted names in page order, as ``(label text,
    value)``, the wanted names with a malformed line (name -> what is wrong with its first
    one), left out of ``samples``, and how many samples of each name were left out for a
    label set longer than the bound (``oversized``)."""

    samples: Samples = field(default_factory=dict)
    malformed: dict[str, str] = field(default_factory=dict)
    oversized: dict[str, int] = field(default_factory=dict)

    def count(self) -> int:
        return sum(len(s) for s in self.samples.values())


def parse_labels(text: str) -> Labels:
    """``'engine="0",model_name="m"'`` -> ``(("engine", "0"), ("model_name", "m"))``.

    Names and values are interned: the same few (``model_name``, the model's name) recur in
    every series of a page, and the memos that keep parsed label sets (a huge page's
    hundred thousand) then hold one string of each."""
    pairs = []
    pos = 0
    while pos < len(text):
        match = _LABEL.match(text, pos)
        if match is None:
            if text[pos:].strip(" ,"):
                raise ExpositionError(f"malformed label set {{{text[:80]}}}")
            break
        value = match.group(2)
        if "\\" in value:
            value = _UNESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), value)
        pairs.append((sys.intern(match.group(1)), sys.intern(value)))
        pos = match.end()
    return tuple(pairs)


def scan(text: str, wanted: Collection[str], limit: float = math.inf) -> Scan:
    """Samples of the wanted sample names (``foo_bucket``, ``foo_total``...); the label text
    (``'engine="0",le="0.1"'``) is left for :func:`parse_labels` so that callers can cache
    per text.

    Raises :class:`ExpositionError` when the body is cut short (the format requires every
    line, the last included, to end with a newline) or holds more than ``limit`` samples of
    the wanted names (checked before any of them is parsed further).
    """
    if text and not text.endswith("\n"):
        raise truncated()
    return scan_lines(text.split("\n"), wanted, limit)


def scan_lines(
    lines: list[str], wanted: Collection[str], limit: float, max_label_bytes: float = math.inf
) -> Scan:
    """:func:`scan` of a page already cut into its lines; a sample whose label set (the
    text between its braces) is longer than ``max_label_bytes`` in UTF-8 is counted in
    :attr:`Scan.oversized`, not kept."""
    found = Scan()
    samples = found.samples
    count = 0
    for line in lines:
        if not line or line[0] == "#":
            continue
        match = SAMPLE_NAME.match(line)
        if match is None:  # a line starting with a blank or a brace: nobody's sample
            continue
        name = match.group(1)
        if name not in wanted:
            continue
        count += 1
        if count > limit:
            raise too_many(limit)
        try:
            labels, value = read_sample(line, match.end())
        except ExpositionError as exc:
            found.malformed.setdefault(name, str(exc))
            continue
        if len(labels) * 4 > max_label_bytes and oversized(labels, max_label_bytes):
            found.oversized[name] = found.oversized.get(name, 0) + 1
            continue
        samples.setdefault(name, []).append((labels, value))
    for name in found.malformed:
        samples.pop(name, None)
    return found


# Every sample of a page by its name on the wire: ``{name: [(labels, value), ...]}``.
Page = dict[str, list[tuple[dict[str, str], float]]]


def read_page(text: str) -> Page:
    """Every sample of a whole page, labels as dicts: how the verdict and ``diagnose
    --exporter`` read an exporter's page (a tenth of prometheus_client's parse; the tests
    compare the two). Samples of one label set share one dict: read it, never change it.

    Raises ValueError (one line) on a malformed sample line.
    """
    return PageReader().read(text)


class PageReader:
    """Reads successive pages of one exporter (:func:`read_page`), each label set parsed
    once: a page shares the label dicts of the last page read for its unchanged label
    texts (a series keeps its label text from page to page), so that the pages kept side
    by side (a window's two ends) hold one dict per series, not one each."""

    def __init__(self) -> None:
        self._last: dict[str, dict[str, str]] = {}

    def read(self, text: str) -> Page:
        out: Page = {}
        known = self._last
        labels_of: dict[str, dict[str, str]] = {}
        for line in _lines(text):
            if not line or line[0] == "#":
                continue
            match = SAMPLE_NAME.match(line)
            if match is None:
                continue
            try:
                label_text, value = read_sample(line, match.end())
                labels = labels_of.get(label_text)
                if labels is None:
                    labels = known.get(label_text)
                    if labels is None:
                        labels = dict(parse_labels(label_text))
                    labels_of[label_text] = labels
            except ExpositionError as exc:
                raise ValueError(f"not Prometheus text: {exc}") from None
            out.setdefault(match.group(1), []).append((labels, value))
        self._last = labels_of
        return out


def _lines(text: str) -> Iterator[str]:
    """The lines of ``text``, one at a time: a page of 100,000 series is not held twice, as
    the page and as its lines, while it is read."""
    start = 0
    end = text.find("\n")
    while end >= 0:
        yield text[start:end]
        start, end = end + 1, text.find("\n", end + 1)
    yield text[start:]


def oversized(labels: str, max_bytes: float) -> bool:
    """Whether a label text is longer than ``max_bytes`` in UTF-8."""
    return len(labels) > max_bytes or len(labels.encode()) > max_bytes


def truncated() -> ExpositionError:
    return ExpositionError("exposition truncated (last line has no newline)", "truncated")


def too_many(limit: float) -> ExpositionError:
    return ExpositionError(
        f"more than {limit:.0f} samples of mapped families (--backend-max-series)",
        "too many series",
    )


def read_sample(line: str, pos: int) -> tuple[str, float]:
    """(label text, value) of a sample line whose name ends at ``pos``."""
    labels = ""
    if line.startswith("{", pos):
        # Values and timestamps never hold a brace, so the last one closes the label set,
        # unless an exemplar follows the value; then the label pairs are walked.
        close = _labels_end(line, pos) if " # " in line else line.rfind("}")
        if close < pos:
            raise ExpositionError("unterminated label set")
        labels = line[pos + 1 : close]
        pos = close + 1
    rest = line[pos:]
    try:
        return labels, float(rest)  # float() ignores surrounding whitespace
    except ValueError:
        pass
    # More than a plain number: a timestamp and/or an exemplar follows (both ignored).
    raw = rest.split(None, 1)[0] if rest.strip() else ""
    try:
        return labels, float(raw)
    except ValueError:
        # C++ stream output on Windows (llama.cpp) prints 0/0 as "-nan(ind)".
        if raw.lstrip("+-").lower().startswith("nan"):
            return labels, math.nan
        raise ExpositionError(f"value {raw[:40]!r} is not a number") from None


def _labels_end(line: str, brace: int) -> int:
    """Index of the brace closing the label set opened at ``brace``, or -1."""
    pos = brace + 1
    while True:
        match = _LABEL.match(line, pos)
        if match is None:
            end = len(line) - len(line[pos:].lstrip())
            return end if line.startswith("}", end) else -1
        pos = match.end()
