"""Backends: one module per inference server in ``servers/``, found there.

To add a server, write ``servers/<name>.py`` declaring its :class:`Backend` as ``BACKEND``
(a table of feeds, see ``table.py``; ``mapping.py`` maps a page with it) and drop real
``/metrics`` captures into ``tests/fixtures/`` (docs/development.md: "Add a backend").
Everything else, tests included, asks ``BACKENDS``.
"""

from __future__ import annotations

import importlib
import pkgutil

from inferwatch.collect.backends import servers
from inferwatch.collect.backends.mapping import Backend, Mapper
from inferwatch.collect.backends.table import Feed, Source, feed
from inferwatch.collect.textparse import ExpositionError


def module_name(backend: str) -> str:
    """The name of a backend's module in ``servers/`` (and of its test): ``vllm-router`` is
    ``vllm_router``."""
    return backend.replace("-", "_")


def _found() -> dict[str, Backend]:
    """Every server module's ``BACKEND``, by name in alphabetical order (``--backend``'s
    choices and the backends matrix's columns)."""
    backends = [
        importlib.import_module(f"{servers.__name__}.{module.name}").BACKEND
        for module in pkgutil.iter_modules(servers.__path__)
    ]
    return {b.name: b for b in sorted(backends, key=lambda b: b.name)}


BACKENDS: dict[str, Backend] = _found()
# The servers tests and tools name most (a new server is BACKENDS["<name>"]).
VLLM, TGI, SGLANG, LLAMACPP, TRITON = (
    BACKENDS[name] for name in ("vllm", "tgi", "sglang", "llamacpp", "triton")
)

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
    "module_name",
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
