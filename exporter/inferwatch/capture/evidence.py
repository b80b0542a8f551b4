"""What one capture gathers, kind by kind, and why a kind could not be had.

Every kind returns :class:`Part` records (one per file or attempt) and never raises for
the outside world's failures: a server without profiler endpoints (:mod:`.trace`), a process
this sidecar cannot see, a missing py-spy (:mod:`.stacks`) are each a ``not_possible`` part
with the reason, a timeout or an error answer a ``failed`` one. A capture then says exactly
what it holds; a part as the manifest lists it::

    {"name": "server-metrics-before.txt", "result": "ok", "detail": "",
     "files": ["server-metrics-before.txt"], "bytes": 49152, "seconds": 0.01,
     "redacted": {}}

Every file is masked (:mod:`.redact`) on its way in, and joins only if the store's bound
allows (:meth:`.store.Workdir.room`); each part says what was masked in it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from inferwatch.capture import redact
from inferwatch.capture.store import Workdir
from inferwatch.collect.upstream import Upstream, UpstreamError

OK, FAILED, NOT_POSSIBLE = "ok", "failed", "not_possible"
# Why a file is left out of a capture: the store's bound.
OVER_BOUND = "it would not fit --capture-max-bytes beside the archives kept"


@dataclass
class Part:
    """One kind of evidence in a capture: what came of it, and its files."""

    name: str
    result: str  # ok, failed, not_possible
    detail: str = ""
    files: list[str] = field(default_factory=list)
    bytes: int = 0
    seconds: float = 0.0
    redacted: dict[str, int] = field(default_factory=dict)  # what named a masked value: times

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def write(work: Workdir, name: str, body: bytes) -> Part:
    """``body``, masked, as the capture's file ``name`` if it fits the bound."""
    hits: Counter[str] = Counter()
    body = redact.mask(body, hits)
    with work.room(len(body)) as fits:
        if fits:
            (work.path / name).write_bytes(body)
    if not fits:
        return Part(name, FAILED, f"{len(body)} bytes: {OVER_BOUND}")
    return Part(name, OK, files=[name], bytes=len(body), redacted=dict(hits))


async def server_page(upstream: Upstream, path: str, work: Workdir, name: str) -> Part:
    """The server's own ``/metrics`` page as it was read (bounded like a poll)."""
    started = time.monotonic()
    try:
        text = await upstream.get_exposition(path)
    except UpstreamError as exc:
        return Part(name, FAILED, str(exc), seconds=time.monotonic() - started)
    part = await asyncio.to_thread(write, work, name, text.encode())
    part.seconds = time.monotonic() - started
    return part
