"""The server's own profiler trace, for a capture.

The server's profiler (:class:`~inferwatch.collect.backends.table.Profiler`: vLLM's
``/start_profile``, SGLang's...) writes its trace files to a folder on its side; given that
folder shared with this sidecar (``--capture-profiler-dir``), :func:`profile` starts the
profiler, stops it after the capture's seconds, and moves the files the server wrote into the
capture's ``trace/``, masked, as the store's bound allows. The part it gives::

    {"name": "profiler trace", "result": "ok", "files": ["trace/server.pt.trace.json.gz"],
     "detail": "the server took the start call after 2.3 s", ...}
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from inferwatch.capture import redact
from inferwatch.capture.evidence import FAILED, NOT_POSSIBLE, OK, OVER_BOUND, Part
from inferwatch.capture.store import Workdir
from inferwatch.collect.backends.table import Profiler
from inferwatch.collect.upstream import Upstream, UpstreamError

# The part's name in the manifest.
PART = "profiler trace"


async def profile(
    upstream: Upstream,
    profiler: Profiler | None,
    trace_dir: Path | None,
    seconds: float,
    work: Workdir,
    prefix: str,
    steps: int,
    server_pid: int | None,
) -> Part:
    """The server's profiler over ``seconds`` (and at most ``steps`` engine steps where the
    server can bound them: the server writes the trace in its stop call, minutes for a big
    one): start, wait, stop, then move the trace files it wrote into
    ``trace_dir`` (the folder the server writes to, shared with this sidecar) into the
    capture (:func:`_take`)."""
    if profiler is None:
        return Part(PART, NOT_POSSIBLE, "this server has no profiler endpoints")
    if trace_dir is None:
        return Part(
            PART,
            NOT_POSSIBLE,
            "--capture-profiler-dir not given: the server writes its trace to its own disk "
            f"({profiler.enable})",
        )
    started = time.monotonic()
    try:
        before = await asyncio.to_thread(_listing, trace_dir)
    except OSError as exc:
        return Part(PART, FAILED, f"cannot list --capture-profiler-dir {trace_dir}: {exc.strerror}")
    try:
        late = await _start(upstream, profiler, prefix, steps, started)
    except UpstreamError as exc:
        return Part(
            PART,
            FAILED,
            f"{exc} (is the profiler on? {profiler.enable})",
            seconds=time.monotonic() - started,
        )
    stop_problem = await _stop_after(upstream, profiler, seconds)
    part = await _trace(trace_dir, before, work, server_pid)
    part.seconds = time.monotonic() - started
    if stop_problem or not part.files:
        part.result = FAILED
    part.detail = "; ".join(x for x in (stop_problem, late, part.detail) if x)
    return part


async def _start(
    upstream: Upstream, profiler: Profiler, prefix: str, steps: int, started: float
) -> str:
    """Start the profiler (UpstreamError when the server refuses); a note when the server
    took the call late ('' if not), counted from ``started``."""
    body: dict[str, object] = {profiler.prefix_field: prefix} if profiler.prefix_field else {}
    if profiler.steps_field:
        body[profiler.steps_field] = steps
    await upstream.post_json(profiler.start_path, body)
    # A stalled engine takes the call only when it runs again: say so.
    waited = time.monotonic() - started
    return f"the server took the start call after {waited:.1f} s" if waited > 1 else ""


async def _stop_after(upstream: Upstream, profiler: Profiler, seconds: float) -> str:
    """Stop the profiler after ``seconds``, even when the capture is cancelled (a profiler
    left on slows the server); what went wrong stopping it, or ''."""
    problem = ""
    try:
        await asyncio.sleep(seconds)
    finally:
        try:
            await asyncio.shield(upstream.post_json(profiler.stop_path, {}))
        except UpstreamError as exc:
            problem = f"stopping it: {exc}"
    return problem


async def _trace(
    trace_dir: Path, before: dict[str, int], work: Workdir, server_pid: int | None
) -> Part:
    """The trace files the server wrote to ``trace_dir`` since ``before``, taken into the
    capture (:func:`_take`)."""
    # The server may still be writing (its stop call writes the trace, minutes for a big
    # one): what it wrote by the time the files stop growing is taken.
    files = await _settled(trace_dir, before)
    owners = _trace_owners(trace_dir, server_pid)
    part = await asyncio.to_thread(_take, trace_dir, files, work, owners)
    if not files:
        part.detail = f"the server wrote no trace file to {trace_dir}"
    return part


def _listing(directory: Path) -> dict[str, int]:
    """Every entry under ``directory`` but its folders, links not followed: path relative to
    it -> size."""
    out = {}
    for folder, dirs, files, dirfd in os.fwalk(directory):
        for entry in (*files, *dirs):  # a link to a folder is listed with the folders
            with contextlib.suppress(OSError):
                st = os.stat(entry, dir_fd=dirfd, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    out[os.path.relpath(os.path.join(folder, entry), directory)] = st.st_size
    return out


async def _settled(directory: Path, before: dict[str, int], wait: float = 30.0) -> list[str]:
    """The entries written since ``before``, once their sizes stop changing (a trace is
    flushed after the stop call returns on some servers)."""
    deadline = time.monotonic() + wait
    last: dict[str, int] = {}
    while True:
        now = await asyncio.to_thread(_listing, directory)
        new = {p: size for p, size in now.items() if p not in before}
        if (new and new == last) or time.monotonic() > deadline:
            return sorted(new)
        last = new
        await asyncio.sleep(0.5 if new else 1.0)


def _trace_owners(directory: Path, server_pid: int | None) -> frozenset[int]:
    """The users a trace file may belong to: this sidecar's, the folder's, the server's."""
    owners = {os.geteuid()}
    with contextlib.suppress(OSError):
        owners.add(directory.stat().st_uid)
    if server_pid is not None:
        with contextlib.suppress(OSError):
            owners.add(os.stat(f"/proc/{server_pid}").st_uid)
    return frozenset(owners)


def _take(directory: Path, wanted: Iterable[str], work: Workdir, owners: frozenset[int]) -> Part:
    """Move the ``wanted`` entries of ``directory`` into the capture's ``trace/``, masked
    (copy and delete: another volume), as the bound allows. Each is opened without following
    a link, and taken only if it is a regular file of one of ``owners`` with no other name:
    whoever can write the folder must not make this sidecar read its other files. What is
    left out stays and is named, with why, in the detail."""
    wanted = set(wanted)
    into = work.path / "trace"
    into.mkdir(exist_ok=True)
    part, left_out = Part(PART, OK), []
    hits: Counter[str] = Counter()
    for folder, dirs, files, dirfd in os.fwalk(directory):
        for entry in (*files, *dirs):
            path = os.path.relpath(os.path.join(folder, entry), directory)
            if path not in wanted:
                continue
            why = _take_one(entry, dirfd, into / entry, work, owners, hits)
            if why:
                left_out.append(f"{path} ({why})")
            else:
                part.files.append(f"trace/{entry}")
                part.bytes += (into / entry).stat().st_size
    part.files.sort()
    left_out.sort()
    part.redacted = dict(hits)
    if left_out:
        part.detail = f"left out: {'; '.join(left_out)}"
    return part


def _take_one(
    entry: str,
    dirfd: int,
    target: Path,
    work: Workdir,
    owners: frozenset[int],
    hits: Counter[str],
) -> str:
    """Move one trace file (``entry`` in the folder open as ``dirfd``) to ``target``; why
    not, or "" once moved."""
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dirfd)
    except OSError as exc:
        return "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
    with os.fdopen(fd, "rb") as source:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if st.st_nlink != 1:
            return f"a hard link: {st.st_nlink} names"
        if st.st_uid not in owners:
            return (
                f"owned by uid {st.st_uid}, not by the server's, the folder's or this "
                "sidecar's user"
            )
        # A gzip trace is compressed again once masked: a little room for a worse ratio.
        limit = st.st_size + (st.st_size // 4 + 65536 if redact.is_gzip(source) else 0)
        found: Counter[str] = Counter()
        with work.room(limit) as fits:
            if not fits:
                return f"{st.st_size} bytes: {OVER_BOUND}"
            try:
                with open(target, "xb") as out:
                    redact.copy(source, out, limit, found)
            except redact.TooBig:
                target.unlink(missing_ok=True)
                return "it grew past its room in the bound while it was copied"
            except (ValueError, OSError) as exc:
                target.unlink(missing_ok=True)
                return str(exc)
    hits.update(found)
    with contextlib.suppress(OSError):
        os.unlink(entry, dir_fd=dirfd)
    return ""
