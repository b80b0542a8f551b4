"""Backends: one module per inference server, registered here.

To add a server, write ``backends/<name>.py`` declaring a :class:`Backend` named ``<name>``
(a table of feeds, see ``table.py``; ``mapping.py`` maps a page with it), import it and add
it to ``BACKENDS`` below (the order of ``--backend``'s choices and of the backends matrix),
and drop real ``/metrics`` captures into ``tests/fixtures/`` (docs/development.md: "Add a
backend"). Everything else, tests included, asks ``BACKENDS``.
"""

from __future__ import annotations

from inferwatch.collect.backends.llamacpp import LLAMACPP
from inferwatch.collect.backends.mapping import Backend, Mapper
from inferwatch.collect.backends.sglang import SGLANG
from inferwatch.collect.backends.table import Feed, Source, feed
from inferwatch.collect.backends.tgi import TGI
from inferwatch.collect.backends.triton import TRITON
from inferwatch.collect.backends.vllm import VLLM
from inferwatch.collect.textparse import ExpositionError

BACKENDS: dict[str, Backend] = {b.name: b for b in (VLLM, TGI, SGLANG, LLAMACPP, TRITON)}

__all__ = [
    "BACKENDS",
    "LLAMACPP",
    "SGLANG",
    "TGI",
    "TRITON",
    "VLLM",
    "Backend",
    "Feed",
    "Mapper",
    "Source",
    "detect",
    "feed",
]


class UnknownBackend(ValueError):
    """``--backend auto`` cannot tell from the page which server it is."""

    kind = "unknown backend"


def detect(text: str) -> Backend:
    """The backend whose metric names appear on a page (for ``--backend auto``).

    Each backend looks at the page as its mapper would read it (:meth:`Backend.readable`:
    llama.cpp first decodes a body some builds send JSON-escaped); the one with the most
    samples of its names (:meth:`Backend.signature_lines`) wins.
    """
    counts = {}
    for backend in BACKENDS.values():
        try:
            hits = backend.signature_lines(backend.readable(text))
        except ExpositionError:
            continue
        if hits:
            counts[backend.name] = hits
    ranked = sorted(counts, key=counts.__getitem__, reverse=True)
    if not ranked:
        known = ", ".join(BACKENDS)
        raise UnknownBackend(
            f"cannot tell the backend from its /metrics page (none of {known} recognised; "
            "is metrics export enabled on the server?); set --backend explicitly"
        )
    if len(ranked) > 1 and counts[ranked[0]] == counts[ranked[1]]:
        raise UnknownBackend(
            f"the /metrics page holds as many {ranked[0]} as {ranked[1]} metric lines "
            f"({counts[ranked[0]]} each); set --backend explicitly"
        )
    return BACKENDS[ranked[0]]
