"""The slowest requests of the rate window, from the server's own request spans.

Each finished request the server traces (vLLM's ``llm_request`` span, received by
:mod:`inferwatch.serve.otlp`) is a :class:`Request`: its phases as the server timed them.
:class:`SlowRequests` keeps, for the rules' rate window, the ``most`` slowest by time to first
token and the ``most`` slowest by time per output token. Memory is bounded whatever the span
rate: the window is cut into :data:`SLICES` slices by arrival, each slice keeps its own
``most`` slowest of each kind (a heap), and the window's are the slowest of the slices that
overlap it. The oldest slice may hold requests up to a slice's length older than the window.

A value the span does not carry is absent from the request's document, never zero.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from inferwatch.method.alerts.alert import FIRST_TOKENS, PER_TOKEN, PLACES, Alert

# Slices of the window, each with its own slowest requests: the window's edge is this fine.
SLICES = 10
DEFAULT_MOST = 5
# A phase that took over this share of the time it is a part of is named in the summary.
DOMINANT_SHARE = 0.8


@dataclass(frozen=True)
class Request:
    """One finished request as its span tells it; seconds, None where the span says nothing."""

    trace_id: str | None = None
    request_id: str | None = None
    ttft: float | None = None
    queue: float | None = None
    prefill: float | None = None
    decode: float | None = None
    e2e: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    finished: float | None = None  # the span's end, Unix seconds

    @property
    def per_token(self) -> float | None:
        """(e2e - TTFT) / (output tokens - 1): the time per token after the first."""
        if self.e2e is None or self.ttft is None or self.output_tokens is None:
            return None
        return max(self.e2e - self.ttft, 0.0) / max(self.output_tokens - 1, 1)

    @property
    def ttft_dominated_by(self) -> str | None:
        """The longer of queue and prefill, the two parts of its first token's wait."""
        if self.queue is None or self.prefill is None:
            return None
        return "queue" if self.queue >= self.prefill else "prefill"

    @property
    def dominated_by(self) -> str | None:
        """The longest of queue, prefill and decode, the parts of its whole time."""
        parts = {"queue": self.queue, "prefill": self.prefill, "decode": self.decode}
        if any(v is None for v in parts.values()):
            return None
        return max(parts, key=lambda k: parts[k] or 0.0)

    def document(self) -> dict[str, Any]:
        """As JSON: only what is known."""
        doc = {
            "trace_id": self.trace_id,
            "request_id": self.request_id,
            "ttft_seconds": self.ttft,
            "queue_seconds": self.queue,
            "prefill_seconds": self.prefill,
            "decode_seconds": self.decode,
            "e2e_seconds": self.e2e,
            "per_token_seconds": self.per_token,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "finished": self.finished,
            "ttft_dominated_by": self.ttft_dominated_by,
            "dominated_by": self.dominated_by,
        }
        return {k: v for k, v in doc.items() if v is not None}


KINDS: dict[str, Callable[[Request], float | None]] = {
    "ttft": lambda r: r.ttft,
    "per_token": lambda r: r.per_token,
}


@dataclass
class _Slice:
    start: float
    # Per kind, a min-heap of (value, arrival order, request): the slowest ``most`` seen.
    heaps: dict[str, list[tuple[float, int, Request]]] = field(
        default_factory=lambda: {kind: [] for kind in KINDS}
    )


class SlowRequests:
    """The ``most`` slowest requests of each kind over the last ``window`` seconds."""

    def __init__(
        self,
        window: float,
        most: int = DEFAULT_MOST,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window = window
        self.most = most
        self._slice = window / SLICES
        self._clock = clock
        self._slices: deque[_Slice] = deque()
        self._order = itertools.count()
        self.received = 0  # requests taken in, in all

    def add(self, requests: Iterable[Request]) -> None:
        """Take in finished requests, arrived now."""
        now = self._clock()
        self._expire(now)
        if not self._slices or now - self._slices[-1].start >= self._slice:
            self._slices.append(_Slice(now))
        heaps = self._slices[-1].heaps
        for request in requests:
            self.received += 1
            order = next(self._order)
            for kind, value_of in KINDS.items():
                value = value_of(request)
                if value is None or not math.isfinite(value):
                    continue
                heap = heaps[kind]
                if len(heap) < self.most:
                    heapq.heappush(heap, (value, order, request))
                elif value > heap[0][0]:
                    heapq.heapreplace(heap, (value, order, request))

    def _expire(self, now: float) -> None:
        while self._slices and now - self._slices[0].start > self.window + self._slice:
            self._slices.popleft()

    def slowest(self, kind: str) -> list[Request]:
        """The window's slowest of ``kind``, slowest first."""
        self._expire(self._clock())
        kept = (entry for s in self._slices for entry in s.heaps[kind])
        return [r for _, _, r in heapq.nlargest(self.most, kept, key=lambda e: (e[0], -e[1]))]

    def document(self) -> dict[str, Any]:
        """``/verdict.json``'s ``slow_requests``."""
        lists = {kind: self.slowest(kind) for kind in KINDS}
        return {
            "window_seconds": self.window,
            "most": self.most,
            "received": self.received,
            **{kind: [r.document() for r in requests] for kind, requests in lists.items()},
            "summary": summary(lists["ttft"], lists["per_token"]),
        }


def spans_say(alert: Alert, slow: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the slowest requests' own spans (``slow``: :meth:`SlowRequests.document`) say of
    where a finding says they spent their time: where its slow first tokens waited
    (``Alert.first_token_waits_in``, against each one's ``ttft_dominated_by``) and where the
    requests slowest per output token spent it (``Alert.slow_tokens_spent_in``, against
    ``dominated_by``). ``{"agree": ..., "text": ...}`` by the majority of those whose span
    tells; None where the finding names no place, no span tells, or none is received."""
    said = [
        s
        for s in (
            _said(alert.first_token_waits_in, slow, "ttft", "ttft_dominated_by", FIRST_TOKENS),
            _said(alert.slow_tokens_spent_in, slow, "per_token", "dominated_by", PER_TOKEN),
        )
        if s is not None
    ]
    if not said:
        return None
    return {"agree": all(s["agree"] for s in said), "text": "; ".join(s["text"] for s in said)}


def _said(
    place: str, slow: dict[str, Any] | None, kind: str, key: str, did: str
) -> dict[str, Any] | None:
    told = [r[key] for r in (slow[kind] if slow is not None else []) if key in r]
    if place not in PLACES or not told:
        return None
    agree = told.count(place)
    if 2 * agree > len(told):
        text = f"the spans agree: {agree} of the {len(told)} slowest {did} {PLACES[place]}"
        return {"agree": True, "text": text}
    elsewhere = max((p for p in told if p != place), key=told.count)
    return {
        "agree": False,
        "text": f"the spans disagree: {told.count(elsewhere)} of the {len(told)} slowest "
        f"{did} {PLACES[elsewhere]}, not {PLACES[place]}",
    }


def _share(part: float | None, whole: float | None) -> float | None:
    if part is None or whole is None or whole <= 0:
        return None
    return part / whole


def summary(ttft: list[Request], per_token: list[Request]) -> list[str]:
    """One line per list: where the slowest spent their time."""
    lines = []
    if ttft:
        for phase in ("queue", "prefill"):
            over = sum(
                1 for r in ttft if (_share(getattr(r, phase), r.ttft) or 0.0) > DOMINANT_SHARE
            )
            if over:
                lines.append(
                    f"{over} of the {len(ttft)} slowest first tokens spent over "
                    f"{DOMINANT_SHARE:.0%} of their TTFT {PLACES[phase]}".replace("%", " %")
                )
        if not lines:
            lines.append(
                f"none of the {len(ttft)} slowest first tokens spent over "
                f"{DOMINANT_SHARE:.0%} of their TTFT in the queue or in prefill".replace("%", " %")
            )
    if per_token:
        counts: dict[str, int] = {}
        for r in per_token:
            phase = r.dominated_by or "unknown"
            counts[phase] = counts.get(phase, 0) + 1
        parts = ", ".join(
            f"{n} {phase}" for phase, n in sorted(counts.items(), key=lambda x: -x[1])
        )
        lines.append(
            f"the {len(per_token)} slowest per output token spent most of their time in: {parts}"
        )
    return lines
