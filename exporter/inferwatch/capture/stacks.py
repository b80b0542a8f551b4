"""The server's stacks, for a capture: py-spy of the process behind the backend URL.

:func:`~inferwatch.collect.processes.server_pid` finds the process listening on the
backend's address and port (this sidecar must see it: the same host, or the same pod with
``shareProcessNamespace``);
:func:`stacks` takes one ``py-spy dump`` of every thread's stack and ``py-spy record``
samples over the capture's seconds, as the parts ``stacks dump`` (``stacks-dump.txt``)
and ``stacks sampled`` (``stacks.speedscope.json``).
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

from inferwatch.capture.evidence import FAILED, NOT_POSSIBLE, OK, Part, write
from inferwatch.capture.store import Workdir


def py_spy() -> str | None:
    """py-spy next to this Python (a wheel's script) or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() else shutil.which("py-spy")


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
