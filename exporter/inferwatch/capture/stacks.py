"""The server's stacks, for a capture: py-spy of the process behind the backend URL.

:func:`server_pid` finds the process listening on the backend's address and port (this
sidecar must see it: the same host, or the same pod with ``shareProcessNamespace``);
:func:`stacks` takes one ``py-spy dump`` of every thread's stack and ``py-spy record``
samples over the capture's seconds, as the parts ``stacks dump`` (``stacks-dump.txt``)
and ``stacks sampled`` (``stacks.speedscope.json``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import shutil
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from inferwatch.capture.evidence import FAILED, NOT_POSSIBLE, OK, Part, write
from inferwatch.capture.store import Workdir


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
