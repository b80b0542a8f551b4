"""A server's label names onto the contract's: ``{engine="0",model_name="tiny",pid="7"}``
becomes ``(("model", "tiny"), ("engine", "0"))`` (the server's own labels are kept beside,
for ``where`` tests and to tell processes apart).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from inferwatch.collect.textparse import ExpositionError, parse_labels
from inferwatch.model import Labels
from inferwatch.urls import without_any_userinfo

# Contract labels in the order they are exposed; a backend maps its own label names onto them.
LABEL_ORDER = ("model", "engine", "kind", "reason", "stage", "status", "worker", "policy")

# The contract's ``status`` is an HTTP status class: a server's "2xx" is kept and its code
# "200" becomes "2xx"; any other value makes the family malformed (left out).
_STATUS = re.compile(r"([1-5])(?:xx|[0-9][0-9])")


class Relabeler:
    """Maps a sample's label text onto contract labels.

    Label texts repeat verbatim from poll to poll, so results are kept from one page to the
    next (:meth:`next_page` starts one): those of this page, and those of the last page that
    this one has not read yet, forgotten at the next page. A page of any size (the budget
    raised) is held whole, not parsed again at every poll; a page whose label texts were
    mostly new although the last page's were kept (a churning server's) is not kept for the
    next. A label pair that the series read before it holds too
    (the model of every series, a process's own label also a contract one) is that series'
    pair object: the cache of a page raised to 100,000 series holds one pair per series and
    label that differs, not one per label.
    """

    def __init__(
        self,
        mapping: Mapping[str, str],
        values: Mapping[str, Mapping[str, str]] | None = None,
        constant: Mapping[str, str] | None = None,
    ) -> None:
        self._mapping = mapping
        self._values = values or {}  # contract label -> {server value: contract value}
        self._constant = constant or {}
        # Label text -> result: this page's, and the last page's not read on this one yet.
        self._series: dict[str, tuple[Labels, Labels]] = {}
        self._buckets: dict[str, tuple[Labels, Labels, str, float]] = {}
        self._last_page: tuple[dict, dict] = ({}, {})
        self._kept = False  # whether the last page's are (a page to compare this one with)
        self._parsed = 0  # label texts of this page not known from the last one
        self._last: tuple[Labels, Labels] = ((), ())  # the series read last: (own, contract)

    def next_page(self) -> None:
        """A new page: what the last one read and this one does not is forgotten after it."""
        churning = self._kept and 2 * self._parsed > len(self._series)
        self._last_page = ({}, {}) if churning else (self._series, self._buckets)
        self._kept = not churning
        self._series, self._buckets, self._parsed = {}, {}, 0

    def held(self) -> int:
        """How many label texts are held."""
        return sum(map(len, (self._series, self._buckets, *self._last_page)))

    def series(self, text: str) -> tuple[Labels, Labels]:
        """Label text -> (the server's own labels, sorted; contract labels)."""
        out = self._series.get(text)
        if out is None:
            out = self._last_page[0].pop(text, None)
            if out is None:
                self._parsed += 1
                last_own, last_contract = self._last
                own = _reusing(tuple(sorted(parse_labels(text))), last_own)
                out = (own, _reusing(self._contract(own), last_contract, own))
                self._last = out
            self._series[text] = out
        return out

    def bucket(self, text: str) -> tuple[Labels, Labels, str, float]:
        """A bucket line's label text -> (contract labels, own labels without le, le, bound)."""
        out = self._buckets.get(text) or self._last_page[1].pop(text, None)
        if out is None:
            own, _ = self.series(text)
            le = next((v for k, v in own if k == "le"), "+Inf")
            try:
                bound = float(le)
            except ValueError:
                bound = math.nan
            if math.isnan(bound):
                raise ExpositionError(f"bucket bound le={le[:20]!r} is not a number")
            if bound == math.inf:
                le = "+Inf"  # as the format writes it ("+inf" and "Inf" parse the same)
            without_le = tuple((k, v) for k, v in own if k != "le")
            out = (self._contract(without_le), without_le, le, bound)
        self._buckets[text] = out
        return out

    def _contract(self, own: Labels) -> Labels:
        renamed = {self._mapping[k]: v for k, v in own if k in self._mapping}
        for label, values in self._values.items():
            if label in renamed:
                renamed[label] = values.get(renamed[label], renamed[label])
        return _contract_labels({**renamed, **self._constant})


def _reusing(labels: Labels, *known: Labels) -> Labels:
    """``labels``: a ``known`` tuple equal to it, else a tuple whose pairs that a ``known``
    one holds as well are its objects."""
    for same in known:
        if labels == same:
            return same
    pairs = {pair: pair for labels_known in known for pair in labels_known}
    return tuple([pairs.get(pair, pair) for pair in labels])


def _contract_labels(renamed: Mapping[str, str]) -> Labels:
    """Contract labels in exposition order; a status code becomes its class (200 -> 2xx), a
    worker's URL loses its credentials."""
    if "worker" in renamed:
        renamed = {**renamed, "worker": without_any_userinfo(renamed["worker"])}
    if "status" in renamed:
        match = _STATUS.fullmatch(renamed["status"])
        if match is None:
            raise ExpositionError(f"status={renamed['status'][:20]!r} is not an HTTP status")
        renamed = {**renamed, "status": f"{match.group(1)}xx"}
    return tuple((k, renamed[k]) for k in LABEL_ORDER if k in renamed)
