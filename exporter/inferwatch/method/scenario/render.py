"""Alert annotations rendered as Prometheus renders them: the Go-template subset the rules use
(``with``, ``if``, ``else``, pipelines), Prometheus's template functions, over given labels,
``$value`` and what each query returns.

The functions are Prometheus's own (template/template.go): ``humanize`` with SI prefixes
and ``%.4g``, ``humanizeDuration``, ``humanizePercentage``, ``printf`` as Go's ``Sprintf``
for the verbs the rules use (``%s``, ``%g``, ``%f``, with a precision).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Series:
    """One series a query returns: its value, and the labels a template reads off it."""

    value: float
    labels: Mapping[str, str] = field(default_factory=dict)


# What a query returns: one series (a number, or a Series with labels), or no series (None:
# the template's ``else`` branch, ``n/a``).
Answer = float | Series | None


class Answers:
    """Each distinct query's answer, handed out in the order the queries are first rendered
    (a query asked again, as ``if`` and then ``with`` over the same series, gets its first
    answer)."""

    def __init__(self, answers: Sequence[Answer]) -> None:
        self._left = list(answers)
        self._given: dict[str, Answer] = {}

    def of(self, query: str) -> list[Series]:
        if query not in self._given:
            if not self._left:
                raise ValueError(f"no answer given for the query {query}")
            self._given[query] = self._left.pop(0)
        answer = self._given[query]
        if answer is None:
            return []
        return [answer if isinstance(answer, Series) else Series(float(answer))]

    def check_all_asked(self) -> None:
        if self._left:
            raise ValueError(f"answers left that no query asked for: {self._left}")


def humanize(v: float) -> str:
    """A number with an SI prefix, to 4 significant digits: ``3.2k``, ``100m``."""
    if v == 0 or math.isnan(v) or math.isinf(v):
        return f"{v:.4g}"
    prefix = ""
    if abs(v) >= 1:
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(v) < 1000:
                break
            prefix, v = p, v / 1000
        return f"{v:.4g}{prefix}"
    return _small(v, "")


def humanize_duration(v: float) -> str:
    """Seconds as a duration: ``916.7ms``, ``4.875s``, ``2m 5s``, ``1d 0h 0m 3s``."""
    if math.isnan(v) or math.isinf(v):
        return f"{v:.4g}"
    if v == 0:
        return f"{v:.4g}s"
    if abs(v) >= 1:
        sign, v = ("-", -v) if v < 0 else ("", v)
        whole = int(v)
        seconds, minutes = whole % 60, whole // 60 % 60
        hours, days = whole // 3600 % 24, whole // 86400
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{v:.4g}s"
    return _small(v, "s")


def _small(v: float, unit: str) -> str:
    """A number under 1 with its SI prefix (milli, micro...), as humanize and
    humanizeDuration print it."""
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return f"{v:.4g}{prefix}{unit}"


def humanize_percentage(v: float) -> str:
    """A ratio as a percentage, to 4 significant digits: ``7.333%``."""
    return f"{v * 100:.4g}%"


def printf(form: str, *args: Any) -> str:
    """Go's Sprintf for the verbs the rules use, which Python's ``%`` writes alike."""
    if re.search(r"%[^%sgfd.0-9]", form):
        raise ValueError(f"a printf verb this renderer does not know: {form}")
    return form % args


def _label(name: str, series: Series) -> str:
    return series.labels[name]


def _or(*args: Any) -> Any:
    return next((a for a in args if a), args[-1])


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "humanize": humanize,
    "humanizeDuration": humanize_duration,
    "humanizePercentage": humanize_percentage,
    "printf": printf,
    "first": lambda series: series[0],
    "value": lambda series: series.value,
    "label": _label,
    "or": _or,
}

# An action ``{{ ... }}`` (quoted strings may hold braces), and its words: a quoted string
# (Go's "..." or raw `...`), a pipe, or a run of other text.
ACTION = re.compile(r'\{\{((?:[^}"`]|"(?:[^"\\]|\\.)*"|`[^`]*`|\}(?!\}))*)\}\}')
WORD = re.compile(r'"(?:[^"\\]|\\.)*"|`[^`]*`|\||[^\s|"`]+')


@dataclass(frozen=True)
class _Branch:
    """``{{ with PIPELINE }}`` or ``{{ if PIPELINE }}``, its two branches (``else`` optional)."""

    keyword: str
    pipeline: list[str]
    then: list[_Node]
    otherwise: list[_Node]


_Node = str | list[str] | _Branch  # text, an action's words, a branch


def render(template: str, labels: Mapping[str, str], value: float | None, answers: Answers) -> str:
    """``template`` as Prometheus renders it for an alert with ``labels`` and ``$value``,
    its queries answered by ``answers`` (only those of the branches taken are asked)."""
    pieces: list[str | list[str]] = []
    at = 0
    for match in ACTION.finditer(template):
        pieces += [template[at : match.start()], WORD.findall(match.group(1))]
        at = match.end()
    pieces.append(template[at:])
    nodes, closing = _parse(pieces)
    if closing:
        raise ValueError(f"{{{{ {' '.join(closing)} }}}} closes nothing in {template!r}")
    return _Renderer(labels, value, answers).nodes(nodes, None)


def _parse(pieces: list[str | list[str]]) -> tuple[list[_Node], list[str]]:
    """Nodes from the front of ``pieces`` (consumed) up to an ``else`` or ``end`` that
    closes none of them: that action's words, or none at the template's end."""
    nodes: list[_Node] = []
    while pieces:
        piece = pieces.pop(0)
        if isinstance(piece, str) or piece[0] not in ("with", "if", "else", "end"):
            nodes.append(piece)
        elif piece[0] in ("else", "end"):
            return nodes, piece
        else:
            then, closing = _parse(pieces)
            otherwise, closing = _parse(pieces) if closing == ["else"] else ([], closing)
            if closing != ["end"]:
                raise ValueError(f"{{{{ {' '.join(piece)} }}}} has no end")
            nodes.append(_Branch(piece[0], piece[1:], then, otherwise))
    return nodes, []


@dataclass(frozen=True)
class _Renderer:
    labels: Mapping[str, str]
    value: float | None
    answers: Answers

    def nodes(self, nodes: list[_Node], dot: Any) -> str:
        out = []
        for node in nodes:
            if isinstance(node, str):
                out.append(node)
            elif isinstance(node, _Branch):
                chosen = self.pipeline(node.pipeline, dot)
                inner = chosen if node.keyword == "with" else dot
                out.append(
                    self.nodes(node.then, inner) if chosen else self.nodes(node.otherwise, dot)
                )
            else:
                out.append(str(self.pipeline(node, dot)))
        return "".join(out)

    def pipeline(self, words: list[str], dot: Any) -> Any:
        """Each command's value passed on as the next one's last argument."""
        result: Any = None
        commands: list[list[str]] = [[]]
        for word in words:
            commands.append([]) if word == "|" else commands[-1].append(word)
        for number, (name, *rest) in enumerate(commands):
            if name not in (*FUNCTIONS, "query"):
                result = self.operand(name, dot)
                continue
            args = [self.operand(word, dot) for word in rest] + ([result] if number else [])
            result = self.answers.of(*args) if name == "query" else FUNCTIONS[name](*args)
        return result

    def operand(self, word: str, dot: Any) -> Any:
        if word == ".":
            return dot
        if word == "$value":
            if self.value is None:
                raise ValueError("the template reads $value: give the alert's value")
            return self.value
        if word.startswith("$labels."):
            return self.labels.get(word.removeprefix("$labels."), "")
        if word.startswith("`"):
            return word[1:-1]
        if word.startswith('"'):
            return word[1:-1].replace('\\"', '"')
        raise ValueError(f"a word this renderer does not know: {word}")
