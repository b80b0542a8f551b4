"""What the sweep shows: progress on stderr, the table of cells, regressions against an
earlier baseline.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import TextIO

from inferwatch.baseline import Baseline
from inferwatch.logs import printable
from inferwatch.method.quantile import sample_quantile
from inferwatch.tools.sweep.cells import CellResult
from inferwatch.tools.sweep.plan import Plan


def _ms(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 1000:.1f}"


class Progress:
    """Progress on stderr: a bar redrawn in place on a terminal, a line per cell otherwise."""

    def __init__(self, stream: TextIO, plan: Plan) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        keys = plan.keys()
        self.cells = len(keys)
        self.total = sum(plan.requests_in(concurrency) for concurrency, _, _ in keys)
        self.done = 0
        self.cell = ""
        self._drawn = 0.0

    def start_cell(self, index: int, key: tuple[int, int, int], requests: int) -> None:
        c, p, o = key
        self.cell = (
            f"cell {index + 1}/{self.cells}: concurrency {c}, prompt {p or 'file'}, output {o}"
        )
        self._draw(force=True)

    def request_done(self) -> None:
        self.done += 1
        self._draw()

    def end_cell(self, result: CellResult) -> None:
        if not self.tty:
            ttft = _ms(sample_quantile(0.5, [s.ttft for s in result.ok]))
            self.stream.write(
                f"{self.cell}: {len(result.ok)}/{len(result.samples)} ok, TTFT p50 {ttft} ms, "
                f"{result.seconds:.1f} s\n"
            )
            self.stream.flush()
        if result.errors:
            self.note(f"{len(result.errors)} errors, the first: {result.errors[0].error}")
        target, mean = result.prompt_tokens, result.mean_prompt_tokens()
        if target and mean is not None and abs(mean - target) > max(8, 0.1 * target):
            self.note(f"prompts averaged {mean:.0f} tokens for a target of {target}")

    def note(self, message: str) -> None:
        if self.tty and self._drawn:
            self.stream.write("\r\x1b[K")
        self.stream.write(f"inferwatch: {printable(message)}\n")  # it may quote the server
        if self.tty and self._drawn:
            self._draw(force=True)
        self.stream.flush()

    def _draw(self, force: bool = False) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if not force and now - self._drawn < 0.1:
            return
        self._drawn = now
        filled = int(24 * self.done / max(self.total, 1))
        bar = "#" * filled + "." * (24 - filled)
        self.stream.write(f"\r\x1b[K[{bar}] {self.done}/{self.total} requests  {self.cell}")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()


def regressions(
    results: Sequence[CellResult], previous: Baseline, factor: float, replicas: int = 1
) -> dict[tuple[int, int, int], str]:
    """Per cell measured before: what regressed ("" when nothing did). Through a router in
    front of ``replicas``, a cell is compared with the previous file's at its share."""
    before = {c.key: c for c in previous.cells}
    marks = {}
    for result in results:
        concurrency, *shape = result.key
        old = before.get((concurrency // replicas, *shape))
        if old is None:
            continue
        new = result.cell()
        if new is None:
            marks[result.key] = "every request failed"
            continue
        worse = [
            f"{name} p95 x{now.p95 / then.p95:.2f}"
            for name, now, then in (
                ("TTFT", new.ttft_seconds, old.ttft_seconds),
                ("ITL", new.itl_seconds, old.itl_seconds),
            )
            if then.p95 > 0 and now.p95 > factor * then.p95
        ]
        marks[result.key] = ", ".join(worse)
    return marks


LEGEND = (
    "(latencies in ms; server p50: the server's TTFT histogram over the cell's window; "
    "gap = TTFT p50 - server p50; good: the requests that met every objective jointly, "
    "goodput their rate"
)


def table(results: Sequence[CellResult], marks: Mapping[tuple[int, int, int], str] | None) -> str:
    """The readable table: one row per cell, latencies in ms (its columns in :mod:`.command`)."""
    header = [
        "conc", "prompt", "output", "TTFT p50", "TTFT p95", "server p50", "gap",
        "ITL p50", "ITL p95", "e2e p95", "req/s", "tok/s", "good", "goodput req/s",
        "errors",
    ]  # fmt: skip
    if marks is not None:
        header.append("vs previous")
    rows = []
    for r in results:
        cell = r.cell()
        server = cell.server_ttft_seconds if cell else None
        mean = r.mean_prompt_tokens()
        prompt = str(r.prompt_tokens) if r.prompt_tokens else f"~{mean:.0f}" if mean else "file"
        row = [str(r.concurrency), prompt, str(r.output_tokens)]
        goodput = r.goodput
        if cell is None:
            row += ["-"] * 9
        else:
            gap = cell.ttft_seconds.p50 - server.p50 if server else None
            row += [
                _ms(cell.ttft_seconds.p50),
                _ms(cell.ttft_seconds.p95),
                _ms(server.p50 if server else None),
                _ms(gap),
                _ms(cell.itl_seconds.p50),
                _ms(cell.itl_seconds.p95),
                _ms(cell.e2e_seconds.p95),
                f"{cell.requests_per_second:.1f}",
                f"{cell.output_tokens_per_second:.1f}",
            ]
        row += [f"{goodput.share * 100:.0f} %", f"{goodput.requests_per_second:.1f}"]
        row.append(str(len(r.errors)))
        if marks is not None:
            mark = marks.get(r.key)
            row.append("new" if mark is None else f"REGRESSED {mark}" if mark else "ok")
        rows.append(row)
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)
