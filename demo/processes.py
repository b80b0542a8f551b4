"""Child processes on loopback, each in its own session (process group) and stopped by pid
with SIGTERM then SIGKILL, and the HTTP their readiness is checked over: never assumed after
a sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inferwatch.collect.processes import parents


class StackError(RuntimeError):
    """A component failed to start or answer; the message carries its log tail."""


def free_port() -> int:
    """A loopback port free at the time of asking."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of a GET; an HTTP error status is an answer, not an exception."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_json(url: str, timeout: float = 5.0) -> Any:
    """The JSON body of a GET that must answer 200 (StackError otherwise)."""
    status, body = http_get(url, timeout)
    if status != 200:
        raise StackError(f"GET {url}: HTTP {status}")
    return json.loads(body)


def metric_value(page: str, name: str, labels: str = "") -> float:
    """Sum of the samples named ``name`` whose label text contains ``labels``."""
    total = 0.0
    found = False
    for line in page.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            if labels and labels not in line:
                continue
            total += float(line.rsplit(" ", 1)[1])
            found = True
    if not found:
        raise KeyError(f"{name}{{{labels}}} not on the page")
    return total


class Process:
    """A child process in its own process group, logging to a file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log: Path,
        env: dict[str, str] | None = None,
        niceness: int = 0,
    ):
        self.name = name
        self.argv = list(argv)
        self.log = log
        self.env = env
        self.niceness = niceness
        self.popen: subprocess.Popen | None = None

    def start(self) -> Process:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        nice = ["nice", "-n", str(self.niceness)] if self.niceness else []  # execs: same pid
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                [*nice, *self.argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(self.env or {})},
                start_new_session=True,
            )
        if self.niceness:
            # Where the kernel groups a session's processes (autogroup, on by default), a
            # process's nice weighs only against its own session's, and each session is
            # weighed as one against the others: the new session's group gets it too.
            with contextlib.suppress(OSError):  # no autogroup in this kernel
                Path(f"/proc/{self.pid}/autogroup").write_text(str(self.niceness))
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the whole group, SIGKILL whatever is left after ``timeout``."""
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # children that ignored SIGTERM
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_http(self, url: str, timeout: float, ok: tuple[int, ...] = (200,)) -> None:
        """Block until ``url`` answers with one of ``ok``, failing fast if the process dies."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise StackError(f"{self.name} exited ({self.popen.returncode}):\n{self.tail()}")
            with contextlib.suppress(OSError, urllib.error.URLError):
                if http_get(url, timeout=2.0)[0] in ok:
                    return
            time.sleep(0.2)
        raise StackError(f"{self.name} not ready at {url} after {timeout:g} s:\n{self.tail()}")


def children_of(pid: int) -> list[tuple[int, str]]:
    """(pid, command name) of the direct children of ``pid``, from /proc."""
    return [(child, comm) for child, (parent, comm) in parents().items() if parent == pid]
