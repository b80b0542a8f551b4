"""A fast reader of the few families a backend maps, from Prometheus text exposition.

prometheus_client's ``text_string_to_metric_families`` parses every line of a ~50 KB vLLM
page and costs ~15 ms per poll; at 10 Hz that is more than the whole CPU budget. This
reader works family by family: it cuts the page at its ``# TYPE`` lines, skips the families
nobody maps, and re-parses a wanted family only when its text changed since the last poll
(between two polls most histograms of a server are unchanged: they move when a request
finishes). ``bench/exporter.py`` measures it against prometheus_client in the same run.

It follows the text format: ``name{label="value",...} value [timestamp]``, label values with
``\\\\``, ``\\"`` and ``\\n`` escapes, ``NaN``/``+Inf``/``-Inf`` values (and the
``-nan(ind)`` some C++ servers print), comments ignored.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection

from inferwatch.model import Labels

_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}

# Suffixes a sample name adds to its family name (counters, histograms, _created gauges).
_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


class ExpositionError(ValueError):
    """The body is not Prometheus text exposition (or is cut short)."""


def parse_labels(text: str) -> Labels:
    """``'engine="0",model_name="m"'`` -> ``(("engine", "0"), ("model_name", "m"))``."""
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
        pairs.append((match.group(1), value))
        pos = match.end()
    return tuple(pairs)


def scan(text: str, wanted: Collection[str]) -> dict[str, list[tuple[str, float]]]:
    """Samples of the wanted sample names (``foo_bucket``, ``foo_total``...), in page order,
    as ``(label text, value)``; the label text (``'engine="0",le="0.1"'``) is left for
    :func:`parse_labels` so that callers can cache per text.

    Raises :class:`ExpositionError` when the body is cut short (the format requires every
    line, the last included, to end with a newline) or a wanted sample is malformed.
    """
    if text and not text.endswith("\n"):
        raise ExpositionError("exposition truncated (last line has no newline)")
    found: dict[str, list[tuple[str, float]]] = {}
    for line in text.split("\n"):
        if not line or line[0] == "#":
            continue
        brace = line.find("{")  # an unlabelled sample line holds no brace at all
        if brace > 0:
            name = line[:brace]
            if name not in wanted:
                continue
            close = line.rfind("}")  # values and timestamps never hold a brace
            if close < brace:
                raise ExpositionError(f"{name}: unterminated label set")
            labels = line[brace + 1 : close]
            rest = line[close + 1 :]
        else:
            name, _, rest = line.partition(" ")
            if "\t" in name:
                name, _, rest = line.partition("\t")
            if name not in wanted:
                continue
            labels = ""
        try:
            value = float(rest)  # float() ignores surrounding whitespace
        except ValueError:
            value = _value(name, rest)
        found.setdefault(name, []).append((labels, value))
    return found


def _value(name: str, rest: str) -> float:
    """The value when more than a plain number follows the labels (a timestamp, ignored)."""
    raw = rest.split(None, 1)[0] if rest.strip() else ""
    try:
        return float(raw)
    except ValueError:
        # C++ stream output on Windows (llama.cpp) prints 0/0 as "-nan(ind)".
        if raw.lstrip("+-").lower().startswith("nan"):
            return math.nan
        raise ExpositionError(f"{name}: value {raw[:40]!r} is not a number") from None


class PageScanner:
    """Scans successive pages of one server, reusing what did not change.

    The page is cut at its ``# TYPE`` lines and only the wanted families' lines are read:
    the format requires all lines of a family to form one group after its TYPE line. Lines
    before the first TYPE line (untyped samples) are always read; a page without TYPE lines
    is read line by line. A family's lines are re-parsed only when its text differs from
    the last page, and the same list objects are returned for an unchanged family, so
    callers can reuse work of their own by identity.
    """

    def __init__(self, wanted: Collection[str]) -> None:
        self.wanted = frozenset(wanted)
        self._blocks: dict[str, tuple[str, dict[str, list[tuple[str, float]]]]] = {}
        self._families_of: dict[frozenset[str], frozenset[str]] = {}
        self._last_text: str | None = None
        self._last_chunks: list[tuple[str, str]] = []

    def scan(
        self, text: str, names: frozenset[str] | None = None
    ) -> dict[str, list[tuple[str, float]]]:
        """Like :func:`scan`, for the wanted names (or the subset ``names`` of them).

        Scanning the same page twice (first a subset, then all) cuts it only once.
        """
        if text and not text.endswith("\n"):
            raise ExpositionError("exposition truncated (last line has no newline)")
        names = self.wanted if names is None else names
        if "# TYPE " not in text:
            return scan(text, names)
        families = self._families_of.get(names)
        if families is None:
            families = self._families_of[names] = _families(names)
        found: dict[str, list[tuple[str, float]]] = {}
        for family, chunk in self._chunks(text):
            if family and family not in families:
                continue
            key = family or "\n"  # the untyped prologue has no family name
            block = chunk[chunk.find("\n") + 1 :] if family else chunk
            cached = self._blocks.get(key)
            if cached is None or cached[0] != block:
                whole = block if not block or block.endswith("\n") else block + "\n"
                cached = (block, scan(whole, self.wanted))
                self._blocks[key] = cached
            for name, samples in cached[1].items():
                if name in names:
                    found[name] = found[name] + samples if name in found else samples
        return found

    def _chunks(self, text: str) -> list[tuple[str, str]]:
        """(family, text from its TYPE line on) for each family; ("", prologue) first."""
        if text is not self._last_text:
            # Chunk i+1 starts with "<family> <type>\n" and holds the family's lines (and, at
            # its end, the next family's # HELP line); chunk 0 precedes any TYPE line.
            chunks = ("\n" + text).split("\n# TYPE ")
            self._last_chunks = [("", chunks[0])] + [
                (c[: c.find(" ", 0, c.find("\n"))], c) for c in chunks[1:]
            ]
            self._last_text = text
            present = {family for family, _ in self._last_chunks}
            for family in self._blocks.keys() - present - {"\n"}:
                del self._blocks[family]  # a family that left the page
        return self._last_chunks


def _families(names: frozenset[str]) -> frozenset[str]:
    """The family names whose TYPE line may announce the given sample names."""
    return frozenset(names | {n[: -len(s)] for n in names for s in _SUFFIXES if n.endswith(s)})
