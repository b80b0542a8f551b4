"""What one capture gathers: each kind of evidence, and why a kind could not be had.

Every function returns :class:`Part` records (one per file or attempt) and never raises for
the outside world's failures: a server without profiler endpoints, a process this sidecar
cannot see, a missing py-spy are each a ``not_possible`` part with the reason, a timeout or
an error answer a ``failed`` one. A capture then says exactly what it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from inferwatch.collect.backends.base import Profiler
from inferwatch.collect.upstream import Upstream, UpstreamError

OK, FAILED, NOT_POSSIBLE = "ok", "failed", "not_possible"


@dataclass
class Part:
    """One kind of evidence in a capture: what came of it, and its files."""

    name: str
    result: str  # ok, failed, not_possible
    detail: str = ""
    files: list[str] = field(default_factory=list)
    bytes: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def write(workdir: Path, name: str, body: bytes) -> Part:
    (workdir / name).write_bytes(body)
    return Part(name, OK, files=[name], bytes=len(body))


async def server_page(upstream: Upstream, path: str, workdir: Path, name: str) -> Part:
    """The server's own ``/metrics`` page as it was read (bounded like a poll)."""
    started = time.monotonic()
    try:
        text = await upstream.get_exposition(path)
    except UpstreamError as exc:
        return Part(name, FAILED, str(exc), seconds=time.monotonic() - started)
    part = await asyncio.to_thread(write, workdir, name, text.encode())
    part.seconds = time.monotonic() - started
    return part


# --- the server's profiler ----------------------------------------------------------------


async def profile(
    upstream: Upstream,
    profiler: Profiler | None,
    trace_dir: Path | None,
    seconds: float,
    workdir: Path,
    max_bytes: int,
    prefix: str,
    steps: int,
) -> Part:
    """The server's profiler over ``seconds`` (and at most ``steps`` engine steps where the
    server can bound them: the server writes the trace in its stop call, minutes for a big
    one): start, wait, stop, then move the trace files it wrote into
    ``trace_dir`` (the folder the server writes to, shared with this sidecar) into the
    capture, up to ``max_bytes``."""
    name = "profiler trace"
    if profiler is None:
        return Part(name, NOT_POSSIBLE, "this server has no profiler endpoints")
    if trace_dir is None:
        return Part(
            name,
            NOT_POSSIBLE,
            "--capture-profiler-dir not given: the server writes its trace to its own disk "
            f"({profiler.enable})",
        )
    started = time.monotonic()
    try:
        before = await asyncio.to_thread(_listing, trace_dir)
    except OSError as exc:
        return Part(name, FAILED, f"cannot list --capture-profiler-dir {trace_dir}: {exc.strerror}")
    body: dict[str, object] = {profiler.prefix_field: prefix} if profiler.prefix_field else {}
    if profiler.steps_field:
        body[profiler.steps_field] = steps
    try:
        await upstream.post_json(profiler.start_path, body)
        # A stalled engine takes the call only when it runs again: say so.
        waited = time.monotonic() - started
        late = f"the server took the start call after {waited:.1f} s" if waited > 1 else ""
    except UpstreamError as exc:
        return Part(
            name,
            FAILED,
            f"{exc} (is the profiler on? {profiler.enable})",
            seconds=time.monotonic() - started,
        )
    stop_problem = ""
    try:
        await asyncio.sleep(seconds)
    finally:
        # Stopped even when the capture is cancelled: a profiler left on slows the server.
        try:
            await asyncio.shield(upstream.post_json(profiler.stop_path, {}))
        except UpstreamError as exc:
            stop_problem = f"stopping it: {exc}"
    # The server may still be writing (its stop call writes the trace, minutes for a big
    # one): what it wrote by the time the files stop growing is taken.
    files = await _settled(trace_dir, before)
    part = await asyncio.to_thread(_take, files, workdir / "trace", max_bytes, name)
    part.seconds = time.monotonic() - started
    part.detail = "; ".join(x for x in (late, part.detail) if x)
    if stop_problem:
        part.result = FAILED
        part.detail = "; ".join(x for x in (stop_problem, part.detail) if x)
    elif not part.files:
        part.result, part.detail = FAILED, f"the server wrote no trace file to {trace_dir}"
    return part


def _listing(directory: Path) -> dict[Path, int]:
    return {p: p.stat().st_size for p in directory.rglob("*") if p.is_file()}


async def _settled(directory: Path, before: dict[Path, int], wait: float = 30.0) -> list[Path]:
    """The files written since ``before``, once their sizes stop changing (a trace is
    flushed after the stop call returns on some servers)."""
    deadline = time.monotonic() + wait
    last: dict[Path, int] = {}
    while True:
        now = await asyncio.to_thread(_listing, directory)
        new = {p: size for p, size in now.items() if p not in before}
        if (new and new == last) or time.monotonic() > deadline:
            return sorted(new)
        last = new
        await asyncio.sleep(0.5 if new else 1.0)


def _take(files: Iterable[Path], into: Path, max_bytes: int, name: str) -> Part:
    """Move ``files`` into the capture (copy and delete: another volume), within a bound."""
    into.mkdir(exist_ok=True)
    part, skipped = Part(name, OK), []
    for path in files:
        size = path.stat().st_size
        if part.bytes + size > max_bytes:
            skipped.append(path.name)
            continue
        shutil.copyfile(path, into / path.name)
        with contextlib.suppress(OSError):
            path.unlink()
        part.files.append(f"trace/{path.name}")
        part.bytes += size
    if skipped:
        part.detail = f"left out over the disk bound (--capture-max-bytes): {', '.join(skipped)}"
    return part


# --- the server's stacks (py-spy) ----------------------------------------------------------


def py_spy() -> str | None:
    """py-spy next to this Python (a wheel's script) or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def server_pid(backend_url: str) -> tuple[int | None, str]:
    """The process listening on the backend URL's port, when this sidecar can see it (the
    same host or pod with a shared process namespace); else None and why."""
    parts = urlsplit(backend_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        inodes = _listening_inodes(port)
    except OSError as exc:
        return None, f"cannot read /proc/net/tcp: {exc.strerror}"
    if not inodes:
        return None, (
            f"no process listens on port {port} in this network namespace (the server is on "
            f"another host or pod: py-spy needs the same pod with shareProcessNamespace)"
        )
    denied = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return int(proc.name), ""
        except PermissionError:
            denied += 1
        except OSError:
            continue
    return None, (
        f"port {port} is open but its process is not visible"
        + (f" ({denied} processes unreadable: run as the server's user or with CAP_SYS_PTRACE)"
           if denied else " (a shared process namespace is needed)")
    )  # fmt: skip


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            next(f, None)
            for line in f:
                cols = line.split()
                local, state, inode = cols[1], cols[3], cols[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{inode}]")
    return inodes


async def stacks(pid: int | None, why_not: str, seconds: float, workdir: Path) -> list[Part]:
    """py-spy of the server's process and its children (the engine): one dump of every
    thread's stack at the start, and samples over ``seconds`` (speedscope JSON, idle
    threads included, without pausing the server)."""
    names = ("stacks dump", "stacks sampled")
    tool = py_spy()
    if pid is None or tool is None:
        reason = why_not if pid is None else "py-spy is not installed (pip install py-spy)"
        return [Part(n, NOT_POSSIBLE, reason) for n in names]
    common = ["--pid", str(pid), "--subprocesses", "--nonblocking"]
    record = _run(
        [tool, "record", *common, "--idle", "--rate", "50", "--duration", f"{max(1, round(seconds))}",
         "--format", "speedscope", "--output", str(workdir / "stacks.speedscope.json")],
        names[1], "stacks.speedscope.json", workdir, timeout=seconds + 30,
    )  # fmt: skip
    dump = _run(
        [tool, "dump", *common], names[0], "stacks-dump.txt", workdir, timeout=30, stdout=True
    )
    return list(await asyncio.gather(dump, record))


async def _run(
    argv: list[str], name: str, file: str, workdir: Path, *, timeout: float, stdout: bool = False
) -> Part:
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()
        return Part(name, FAILED, f"py-spy took over {timeout:g} s", seconds=timeout)
    finally:
        if process.returncode is None:
            process.kill()
    elapsed = time.monotonic() - started
    if stdout and out:
        (workdir / file).write_bytes(out)
    path = workdir / file
    size = path.stat().st_size if path.exists() else 0
    problem = ""
    if process.returncode != 0:
        # py-spy's message, not the backtrace after it.
        lines = [x.strip() for x in (err or out).decode(errors="replace").splitlines()]
        problem = next((x for x in lines if x.startswith("Error:")), lines[-1] if lines else "")
        problem = problem or f"py-spy exited {process.returncode}"
    if not size:
        return Part(name, FAILED, problem or "py-spy wrote nothing", seconds=elapsed)
    # A process py-spy could not read (a child that is not Python) does not void the rest.
    return Part(name, OK, problem, files=[file], bytes=size, seconds=elapsed)
