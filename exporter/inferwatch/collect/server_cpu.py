"""The CPU under the server: is it starved? (the method's system layer).

A noisy neighbour, a CPU limit or too few cores slow every request while no GPU metric moves.
Read from ``/proc`` and the cgroup filesystem at most once per :data:`MIN_INTERVAL`: the
server's threads' on-CPU time and run-queue wait (its processes:
:mod:`inferwatch.collect.processes`; in Kubernetes ``shareProcessNamespace: true``), the
node's CPU pressure (PSI ``some``) and the server cgroup's throttling. What cannot be read is
left out, with ``inferwatch_collector_success{collector="server_cpu"} 0`` and why. Sample::

    inferwatch_server_cpu_seconds_total 1834.2
    inferwatch_server_cpu_wait_seconds_total 97.4
    inferwatch_server_threads 131
    inferwatch_node_cpu_pressure_seconds_total 412.9
    inferwatch_server_cpu_throttled_seconds_total 3.2
    inferwatch_server_cpu_throttled_periods_total 41
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from inferwatch.collect.processes import (
    PROC,
    ThreadTimes,
    process_tree,
    read_small,
    server_pid,
)
from inferwatch.model import BackendSample, Sink

MIN_INTERVAL = 1.0
REDISCOVER = 30.0
CGROUP = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class ServerCpuSample:
    """The CPU under the server at one read (None: not readable); ``problem``: what could
    not be read, and why (empty when everything could)."""

    cpu_seconds: float | None  # its threads' on-CPU time, summed
    wait_seconds: float | None  # their run-queue wait, summed
    threads: int | None
    pressure_seconds: float | None  # the node's PSI "some" total
    throttled_seconds: float | None  # its cgroup's
    throttled_periods: float | None
    problem: str = ""

    def write(self, sink: Sink, backend: str) -> None:
        """``inferwatch_server_cpu_wait_seconds_total 97.4`` and the others it could read."""
        for key, value in (
            ("server_cpu_seconds", self.cpu_seconds),
            ("server_cpu_wait_seconds", self.wait_seconds),
            ("server_threads", self.threads),
            ("node_cpu_pressure_seconds", self.pressure_seconds),
            ("server_cpu_throttled_seconds", self.throttled_seconds),
            ("server_cpu_throttled_periods", self.throttled_periods),
        ):
            if value is not None:
                sink.scalars(key, {(): float(value)})


@dataclass
class ServerCpu:
    """The :class:`~inferwatch.collect.poller.Source` of the server-CPU series."""

    backend_url: str
    proc: Path = PROC
    cgroup_root: Path = CGROUP
    _last: ServerCpuSample | None = None
    _read_at: float = float("-inf")
    _found_at: float = float("-inf")
    _pids: list[int] = field(default_factory=list)
    _why_not: str = ""
    _threads: dict[int, tuple[float, float]] = field(default_factory=dict)
    _times: ThreadTimes = field(init=False)  # the threads' schedstat files, kept open
    _ended: tuple[float, float] = (0.0, 0.0)  # what the threads that ended counted
    # Where the server's throttling counts were found: (its cpu.stat, key, scale); looked
    # for again when the server is (every REDISCOVER s, or once that file fails).
    _cpu_stat: tuple[Path, str, float] | None = None

    def __post_init__(self) -> None:
        self._times = ThreadTimes(self.proc)

    def sample(self, now: float, server: BackendSample | None) -> ServerCpuSample:
        if self._last is not None and now - self._read_at < MIN_INTERVAL:
            return self._last
        self._read_at = now
        problems = []
        pids = self._server(now)
        cpu = wait = threads = throttled = periods = None
        if pids:
            cpu, wait, threads = self._thread_totals(pids)
            throttled, periods, why = self._throttling(pids[0])
            if why:
                problems.append(why)
        else:
            problems.append(self._why_not)
        pressure, why = self._pressure()
        if why:
            problems.append(why)
        self._last = ServerCpuSample(
            cpu, wait, threads, pressure, throttled, periods, "; ".join(problems)
        )
        return self._last

    def _server(self, now: float) -> list[int]:
        """The server's process tree: its listener looked up once it is gone (or was never
        found) and at most every REDISCOVER s; the tree under a live one refreshed as often
        (a restarted worker)."""
        alive = bool(self._pids) and os.path.exists(f"{os.fspath(self.proc)}/{self._pids[0]}")
        due = now - self._found_at >= REDISCOVER
        if (self._pids and not alive) or due:
            self._found_at = now
            self._cpu_stat = None
            pid = self._pids[0] if alive else None
            if pid is None:
                pid, self._why_not = server_pid(self.backend_url)
            self._pids = process_tree(pid, self.proc) if pid is not None else []
        return self._pids

    def _thread_totals(self, pids: list[int]) -> tuple[float, float, int]:
        now = self._times.read(pids)
        ended = [t for t in self._threads if t not in now]
        self._ended = (
            self._ended[0] + sum(self._threads[t][0] for t in ended),
            self._ended[1] + sum(self._threads[t][1] for t in ended),
        )
        self._threads = now
        run = self._ended[0] + sum(r for r, _ in now.values())
        wait = self._ended[1] + sum(w for _, w in now.values())
        return run, wait, len(now)

    def _pressure(self) -> tuple[float | None, str]:
        try:
            text = read_small(f"{os.fspath(self.proc)}/pressure/cpu")
        except OSError as exc:
            return None, f"no CPU pressure (/proc/pressure/cpu: {exc.strerror})"
        for line in text.splitlines():
            if line.startswith("some "):
                fields = dict(f.split("=", 1) for f in line.split()[1:])
                with contextlib.suppress(KeyError, ValueError):
                    return int(fields["total"]) / 1e6, ""
        return None, "no CPU pressure (/proc/pressure/cpu has no 'some' line)"

    def _throttling(self, pid: int) -> tuple[float | None, float | None, str]:
        """The server cgroup's throttled seconds and periods: cgroup v2's ``cpu.stat``
        (``throttled_usec``), or v1's cpu controller (``throttled_time``, ns)."""
        if self._cpu_stat is not None:
            with contextlib.suppress(OSError, KeyError, ValueError):
                return (*_throttled(*self._cpu_stat), "")
        self._cpu_stat = None
        try:
            lines = (self.proc / str(pid) / "cgroup").read_text().splitlines()
        except OSError as exc:
            return None, None, f"no cgroup of the server ({exc.strerror})"
        candidates = []
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if ".." in Path(path).parts:
                continue  # outside this sidecar's cgroup namespace
            rel = path.lstrip("/")
            if controllers == "":
                for mount in ("", "unified"):
                    candidates.append((self.cgroup_root / mount / rel, "throttled_usec", 1e6))
            elif "cpu" in controllers.split(","):
                mount = controllers  # e.g. cpu,cpuacct
                candidates.append((self.cgroup_root / mount / rel, "throttled_time", 1e9))
                candidates.append((self.cgroup_root / "cpu" / rel, "throttled_time", 1e9))
        for folder, key, scale in candidates:
            with contextlib.suppress(OSError, KeyError, ValueError):
                counts = _throttled(folder / "cpu.stat", key, scale)
                self._cpu_stat = (folder / "cpu.stat", key, scale)
                return (*counts, "")
        return None, None, "no readable cpu.stat with throttling counts for the server's cgroup"


def _throttled(cpu_stat: Path, key: str, scale: float) -> tuple[float, float]:
    """A cgroup's throttled seconds and periods from its ``cpu.stat`` (``key``: the
    throttled time, in 1/``scale`` s); OSError, KeyError or ValueError where it has none."""
    stat = read_small(os.fspath(cpu_stat))
    values = dict(line.split(" ", 1) for line in stat.splitlines() if " " in line)
    return int(values[key]) / scale, float(values["nr_throttled"])
