"""What one capture gathers: each kind of evidence, and why a kind could not be had.

Every function returns :class:`Part` records (one per file or attempt) and never raises for
the outside world's failures: a server without profiler endpoints, a process this sidecar
cannot see, a missing py-spy are each a ``not_possible`` part with the reason, a timeout or
an error answer a ``failed`` one. A capture then says exactly what it holds.

Every file is masked (:mod:`.redact`) on its way in, and joins only if the store's bound
allows (:meth:`.store.Workdir.room`); each part says what was masked in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import os
import shutil
import socket
import stat
import struct
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from inferwatch.capture import redact
from inferwatch.capture.store import Workdir
from inferwatch.collect.backends.base import Profiler
from inferwatch.collect.upstream import Upstream, UpstreamError

OK, FAILED, NOT_POSSIBLE = "ok", "failed", "not_possible"
_OVER_BOUND = "it would not fit --capture-max-bytes beside the archives kept"


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
        return Part(name, FAILED, f"{len(body)} bytes: {_OVER_BOUND}")
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


# --- the server's profiler ----------------------------------------------------------------


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
    owners = _trace_owners(trace_dir, server_pid)
    part = await asyncio.to_thread(_take, trace_dir, files, work, name, owners)
    part.seconds = time.monotonic() - started
    if not files:
        part.detail = f"the server wrote no trace file to {trace_dir}"
    if stop_problem or not part.files:
        part.result = FAILED
    part.detail = "; ".join(x for x in (stop_problem, late, part.detail) if x)
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


def _take(
    directory: Path, wanted: Iterable[str], work: Workdir, name: str, owners: frozenset[int]
) -> Part:
    """Move the ``wanted`` entries of ``directory`` into the capture's ``trace/``, masked
    (copy and delete: another volume), as the bound allows. Each is opened without following
    a link, and taken only if it is a regular file of one of ``owners`` with no other name:
    whoever can write the folder must not make this sidecar read its other files. What is
    left out stays and is named, with why, in the detail."""
    wanted = set(wanted)
    into = work.path / "trace"
    into.mkdir(exist_ok=True)
    part, left_out = Part(name, OK), []
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
                return f"{st.st_size} bytes: {_OVER_BOUND}"
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


# --- the server's stacks (py-spy) ----------------------------------------------------------


def py_spy() -> str | None:
    """py-spy next to this Python (a wheel's script) or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def server_pid(backend_url: str) -> tuple[int | None, str]:
    """The process listening on the backend URL's address and port, when this sidecar can
    see it (the same host or pod with a shared process namespace); else None and why."""
    parts = urlsplit(backend_url)
    host = parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return None, f"cannot resolve {host}: {exc.strerror or exc}"
    addresses = {ipaddress.ip_address(info[4][0]) for info in found}
    try:
        inodes = _listening_inodes(addresses, port)
    except OSError as exc:
        return None, f"cannot read /proc/net/tcp: {exc.strerror}"
    if not inodes:
        return None, (
            f"no process listens on {host} port {port} in this network namespace (the server "
            f"is on another host or pod: py-spy needs the same pod with shareProcessNamespace)"
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


Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _listening_inodes(addresses: set[Address], port: int) -> set[str]:
    """The sockets listening on ``port`` that a connection to one of ``addresses`` reaches:
    bound to it, or to every address of its family (``::`` takes IPv4 too)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            next(f, None)
            for line in f:
                cols = line.split()
                (local, local_port), state, inode = cols[1].split(":"), cols[3], cols[9]
                if (
                    state == "0A"
                    and int(local_port, 16) == port
                    and _reaches(_address(local), addresses)
                ):
                    inodes.add(f"socket:[{inode}]")
    return inodes


def _address(hex_words: str) -> Address:
    """An address as /proc/net/tcp writes it: 32-bit words in this host's byte order."""
    words = (int(hex_words[i : i + 8], 16) for i in range(0, len(hex_words), 8))
    return ipaddress.ip_address(b"".join(struct.pack("=I", w) for w in words))


def _reaches(local: Address, addresses: set[Address]) -> bool:
    """Whether a socket bound to ``local`` takes connections to one of ``addresses``."""
    if isinstance(local, ipaddress.IPv6Address) and local.ipv4_mapped is not None:
        local = local.ipv4_mapped
    if local.is_unspecified:
        return local.version == 6 or any(a.version == 4 for a in addresses)
    return local in addresses


async def stacks(pid: int | None, why_not: str, seconds: float, work: Workdir) -> list[Part]:
    """py-spy of the server's process and its children (the engine): one dump of every
    thread's stack at the start, and samples over ``seconds`` (speedscope JSON, idle
    threads included, without pausing the server). py-spy writes its samples outside the
    capture folder: they join the capture only if they fit its bound."""
    names = ("stacks dump", "stacks sampled")
    tool = py_spy()
    if pid is None or tool is None:
        reason = why_not if pid is None else "py-spy is not installed (pip install py-spy)"
        return [Part(n, NOT_POSSIBLE, reason) for n in names]
    common = ["--pid", str(pid), "--subprocesses", "--nonblocking"]
    with tempfile.TemporaryDirectory(prefix="inferwatch-py-spy-") as scratch:
        samples = Path(scratch) / "stacks.speedscope.json"
        record = _run(
            [tool, "record", *common, "--idle", "--rate", "50", "--duration", f"{max(1, round(seconds))}",
             "--format", "speedscope", "--output", str(samples)],
            names[1], samples.name, work, timeout=seconds + 30, output=samples,
        )  # fmt: skip
        dump = _run([tool, "dump", *common], names[0], "stacks-dump.txt", work, timeout=30)
        return list(await asyncio.gather(dump, record))


async def _run(
    argv: list[str],
    name: str,
    file: str,
    work: Workdir,
    *,
    timeout: float,
    output: Path | None = None,
) -> Part:
    """Run py-spy; what it wrote to ``output`` (or else its standard output) becomes the
    capture's ``file``."""
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
    problem = ""
    if process.returncode != 0:
        # py-spy's message, not the backtrace after it.
        lines = [x.strip() for x in (err or out).decode(errors="replace").splitlines()]
        problem = next((x for x in lines if x.startswith("Error:")), lines[-1] if lines else "")
        problem = problem or f"py-spy exited {process.returncode}"
    if output is not None:
        out = output.read_bytes() if output.exists() else b""
    if not out:
        return Part(name, FAILED, problem or "py-spy wrote nothing", seconds=elapsed)
    part = await asyncio.to_thread(write, work, file, out)
    part.name, part.seconds = name, elapsed
    # A process py-spy could not read (a child that is not Python) does not void the rest.
    if part.result == OK:
        part.detail = problem
    return part
