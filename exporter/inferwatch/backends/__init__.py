"""Backends: one module per inference server, registered here.

To add a server, write ``backends/<name>.py`` declaring a :class:`Backend` (a table of
feeds, see ``base.py``), add it to ``BACKENDS`` below, and drop real ``/metrics`` captures
into ``tests/fixtures/``.
"""

from __future__ import annotations

from inferwatch.backends.base import Backend, Feed, Source, feed
from inferwatch.backends.vllm import VLLM

BACKENDS: dict[str, Backend] = {b.name: b for b in (VLLM,)}

__all__ = ["BACKENDS", "Backend", "Feed", "Source", "detect", "feed"]


class UnknownBackend(ValueError):
    """``--backend auto`` found no known server's metrics on the page."""


def detect(text: str) -> Backend:
    """The backend whose metric names appear on a page (for ``--backend auto``)."""
    counts = {}
    for backend in BACKENDS.values():
        hits = sum(text.count("\n" + prefix) for prefix in backend.signature)
        hits += sum(1 for prefix in backend.signature if text.startswith(prefix))
        if hits:
            counts[backend.name] = hits
    if not counts:
        known = ", ".join(sorted(BACKENDS))
        raise UnknownBackend(
            f"cannot tell the backend from its /metrics page (none of {known} recognised; "
            "is metrics export enabled on the server?); set --backend explicitly"
        )
    return BACKENDS[max(counts, key=counts.__getitem__)]
