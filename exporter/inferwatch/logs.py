"""Log lines that say a cause once, not once per poll, and text that is safe to show: for
every module to import.

A failing poll, probe or request repeats its cause many times a second; these let one line
of each kind through, then at most one every ``repeat`` seconds saying how many were held
back. Text from outside (a server's label values, version or error message, an exporter's
answer) may hold control characters: :func:`printable` escapes them wherever text reaches a
terminal, a log line or a one-line comment (:class:`LogfmtFormatter` for every log line).
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Hashable

# C0 and C1 control characters (ESC and CSI start terminal sequences), DEL, and the line
# and paragraph separators YAML and some terminals break lines at.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(text: str, lines: bool = False) -> str:
    """``text`` with every control character escaped as Python writes it (``\\x1b``), so
    that it can neither drive a terminal nor start a line of its own; with ``lines``, its
    line breaks (``\\n``) are kept."""
    if lines:
        return "\n".join(_CONTROL.sub(_escape, line) for line in text.split("\n"))
    return _CONTROL.sub(_escape, text)


class LogfmtFormatter(logging.Formatter):
    """``ts=... level=... source=... msg="..."``, one line whatever the message holds; a
    traceback follows on lines of its own, escaped alike."""

    def format(self, record: logging.LogRecord) -> str:
        ts = self.formatTime(record, "%Y-%m-%dT%H:%M:%S")
        msg = printable(record.getMessage()).replace('"', "'")
        line = f'ts={ts} level={record.levelname.lower()} source={record.name} msg="{msg}"'
        if record.exc_info:
            line += "\n" + printable(self.formatException(record.exc_info), lines=True)
        return line


class LogLimiter:
    """Lets one log line of each kind through every ``repeat`` seconds and counts the rest."""

    def __init__(self, repeat: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self._repeat = repeat
        self._clock = clock
        self._logged_at: dict[Hashable, float] = {}
        self._held: dict[Hashable, int] = {}

    def allow(self, kind: Hashable) -> int | None:
        """None when a line of this kind is held back, else how many were held back since
        the last one of its kind went through."""
        now = self._clock()
        if now - self._logged_at.get(kind, -math.inf) < self._repeat:
            self._held[kind] = self._held.get(kind, 0) + 1
            return None
        self._logged_at[kind] = now
        return self._held.pop(kind, 0)

    def reset(self) -> None:
        self._logged_at.clear()
        self._held.clear()


class CauseLog:
    """Logs a failure once per cause kind (a 500 and a 503 are one kind: ``exc.kind``), then
    at most every ``repeat`` s per kind, saying how many lines it held back meanwhile.
    Lines go to ``logger`` (the poll's when not given)."""

    def __init__(
        self,
        what: str,
        logger: logging.Logger | None = None,
        repeat: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        unit: str = "polls",
    ):
        self._what = what
        self._log = logger or logging.getLogger("inferwatch.poller")
        self._unit = unit
        self._limiter = LogLimiter(repeat, clock)
        self._kinds: set[str] = set()
        self.failures = 0

    def failed(self, kind: str, cause: str) -> None:
        self.failures += 1
        held = self._limiter.allow(kind)
        if held is None:
            return
        if kind in self._kinds:
            self._log.warning(
                "%s still failing (%d %s, %d lines like this held back): %s",
                self._what,
                self.failures,
                self._unit,
                held,
                cause,
            )
        else:
            self._log.warning("%s failing: %s", self._what, cause)
            self._kinds.add(kind)

    def ok(self) -> None:
        if self.failures:
            self._log.info("%s recovered after %d failed %s", self._what, self.failures, self._unit)
        self._limiter.reset()
        self._kinds.clear()
        self.failures = 0
