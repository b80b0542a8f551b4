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

# Contract labels in the order they are exposed; a backend maps its own label names onto them.
LABEL_ORDER = ("model", "engine", "reason", "status")

# The contract's ``status`` is an HTTP status class: a server's "2xx" is kept and its code
# "200" becomes "2xx"; any other value makes the family malformed (left out).
_STATUS = re.compile(r"([1-5])(?:xx|[0-9][0-9])")


class Relabeler:
    """Maps a sample's label text onto contract labels.

    Label texts repeat verbatim from poll to poll, so results are cached for the backend's
    lifetime (bounded: cleared when a churning server makes it large).
    """

    _MAX_ENTRIES = 50_000

    def __init__(self, mapping: Mapping[str, str]) -> None:
        self._mapping = mapping
        self._series: dict[str, tuple[Labels, Labels]] = {}
        self._buckets: dict[str, tuple[Labels, Labels, str, float]] = {}

    def series(self, text: str) -> tuple[Labels, Labels]:
        """Label text -> (the server's own labels, sorted; contract labels)."""
        out = self._series.get(text)
        if out is None:
            own = tuple(sorted(parse_labels(text)))
            renamed = {self._mapping[k]: v for k, v in own if k in self._mapping}
            out = (own, _contract_labels(renamed))
            if len(self._series) >= self._MAX_ENTRIES:
                self._series.clear()
            self._series[text] = out
        return out

    def bucket(self, text: str) -> tuple[Labels, Labels, str, float]:
        """A bucket line's label text -> (contract labels, own labels without le, le, bound)."""
        out = self._buckets.get(text)
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
            renamed = {self._mapping[k]: v for k, v in without_le if k in self._mapping}
            out = (_contract_labels(renamed), without_le, le, bound)
            if len(self._buckets) >= self._MAX_ENTRIES:
                self._buckets.clear()
            self._buckets[text] = out
        return out


def _contract_labels(renamed: Mapping[str, str]) -> Labels:
    """Contract labels in exposition order; a status code becomes its class (200 -> 2xx)."""
    if "status" in renamed:
        match = _STATUS.fullmatch(renamed["status"])
        if match is None:
            raise ExpositionError(f"status={renamed['status'][:20]!r} is not an HTTP status")
        renamed = {**renamed, "status": f"{match.group(1)}xx"}
    return tuple((k, renamed[k]) for k in LABEL_ORDER if k in renamed)
