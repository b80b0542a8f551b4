"""The server's processes as this sidecar sees them in ``/proc``.

:func:`server_pid` finds the process listening on the backend URL's address and port (the
same host, or the same pod with ``shareProcessNamespace``); :func:`process_tree` adds its
descendants (vLLM's engine core, tokenizer workers); :class:`ThreadTimes` reads each of
their threads' on-CPU and run-queue times (``/proc/<pid>/task/<tid>/schedstat``). Used by
the server-CPU collector (:mod:`inferwatch.collect.server_cpu`) and the capture's stacks.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import struct
import weakref
from pathlib import Path
from urllib.parse import urlsplit

PROC = Path("/proc")
# The most per-thread files ThreadTimes keeps open (a process's limit is often 1024).
KEPT_FILES = 256


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
    addresses = {ipaddress.ip_address(info[4][0]) for info in found if _here(info[4][0])}
    if not addresses:  # a listener on every interface here would be another process
        return None, (
            f"{host} is not an address of this host or pod: no local process serves it, so "
            "none can be profiled"
        )
    try:
        inodes = _listening_inodes(addresses, port)
    except OSError as exc:
        return None, f"cannot read /proc/net/tcp: {exc.strerror}"
    if not inodes:
        return None, (
            f"no process listens on {host} port {port} in this network namespace (the server "
            f"is on another host or pod: this sidecar needs the same pod with "
            f"shareProcessNamespace)"
        )
    denied = 0
    for proc in PROC.iterdir():
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


def _here(address: str) -> bool:
    """Whether ``address`` is this host's (or pod's): loopback, or one a socket binds to."""
    local = ipaddress.ip_address(address)
    if local.is_loopback or local.is_unspecified:
        return True
    family = socket.AF_INET6 if local.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
    except OSError:  # EADDRNOTAVAIL: another host's
        return False
    return True


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


def parents(proc: Path = PROC) -> dict[int, tuple[int, str]]:
    """Every visible process: its parent's pid and its command name (from its ``stat``)."""
    out = {}
    root = os.fspath(proc)
    for name in os.listdir(root):
        if not name.isdigit():
            continue
        try:
            stat = read_small(f"{root}/{name}/stat")
        except OSError:
            continue
        # comm may contain spaces and parentheses; the fields after the last ')' are fixed.
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        out[int(name)] = (int(stat[stat.rindex(")") + 2 :].split()[1]), comm)
    return out


def process_tree(pid: int, proc: Path = PROC) -> list[int]:
    """``pid`` and its descendants."""
    children: dict[int, list[int]] = {}
    for child, (parent, _) in parents(proc).items():
        children.setdefault(parent, []).append(child)
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, ()))
    return out


class ThreadTimes:
    """Per thread of a server's processes: (seconds on a CPU, seconds runnable but waiting
    for one), from ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds). Threads that end
    while read are left out.

    A server has a hundred threads and this runs every second: each thread's file is kept
    open between reads and read again from its start (one ``pread`` a thread, where an
    open, a read and a close cost about twice as much), for at most :data:`KEPT_FILES`
    threads; those past them are opened at each read. A file of a thread that is gone is
    closed at the next read; all are when this object is collected."""

    def __init__(self, proc: Path = PROC) -> None:
        self._root = os.fspath(proc)
        self._files: dict[str, int] = {}  # "<pid>/task/<tid>" -> its schedstat, open
        weakref.finalize(self, _close_all, self._files)

    def read(self, pids: list[int]) -> dict[int, tuple[float, float]]:
        out = {}
        files, kept = self._files, {}
        for pid in pids:
            tasks = f"{pid}/task"
            with contextlib.suppress(OSError):
                for name in os.listdir(f"{self._root}/{tasks}"):
                    key = f"{tasks}/{name}"
                    with contextlib.suppress(OSError, ValueError):
                        run, wait, _ = self._read(key, files, kept).split()
                        out[int(name)] = (int(run) / 1e9, int(wait) / 1e9)
        _close_all(files)  # the threads that ended
        files.update(kept)
        return out

    def _read(self, key: str, files: dict[str, int], kept: dict[str, int]) -> bytes:
        """The thread's schedstat, its file kept open in ``kept`` while there is room;
        raises OSError."""
        fd = files.pop(key, None)
        if fd is not None:
            try:
                text = os.pread(fd, 128, 0)
            except OSError:  # that thread ended; another may have its id since
                os.close(fd)
            else:
                kept[key] = fd
                return text
        fd = os.open(f"{self._root}/{key}/schedstat", os.O_RDONLY)
        try:
            text = os.pread(fd, 128, 0)
        except OSError:
            os.close(fd)
            raise
        if len(kept) < KEPT_FILES:
            kept[key] = fd
        else:
            os.close(fd)
        return text


def _close_all(files: dict[str, int]) -> None:
    for fd in files.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    files.clear()


def read_small(path: str) -> str:
    """A small ``/proc`` or ``/sys`` file (at most 64 KiB of it), read with plain ``os``
    calls: these run every second, and ``pathlib``'s objects cost more per file than the
    read itself. Raises OSError."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536).decode("utf-8", errors="replace")
    finally:
        os.close(fd)
