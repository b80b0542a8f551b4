"""Faults the e2e runs and the demo never does, each with what its clients saw of it.

A fault whose condition did not happen proves nothing about the alert that follows, so each
fault here records client-side :class:`Evidence` of its condition, and the test counts the
scenario only where the evidence holds. Sizes come from the server at hand: the CPU limit
from the server's own CPU demand under normal traffic, measured as the fault begins, and the
calibrated CPU-wait threshold.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from demo.faults import normal_traffic
from demo.local_stack import LocalStack
from demo.processes import StackError
from demo.scenarios import CANARY, GAP, REGRESSION, Scenario
from demo.traffic import Request
from inferwatch.collect.processes import ThreadTimes, process_tree

# Where the kernel's CPU controller is: cgroup v1's hierarchy, else the unified one.
CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")
# The limit's period: short, so that the server steps in every period (a long one would
# stop the engine for most of each: the engine-stall fault's case, not this one's).
PERIOD_US = 10_000
# The kernel's least quota in a period: 1 ms.
LEAST_QUOTA_US = 1000
# The limit leaves the server twice the odds of waiting (ready time waited / run) that the
# calibrated threshold names: past it on any machine, and the server still answers its polls.
WAIT_ODDS_FACTOR = 2.0
# A server under a limit is ready to run less than before it (its API threads wait for the
# slowed engine instead), so the limit sized from its demand before can leave it short of
# that target: the fault reads the server's wait share every TIGHTEN_EVERY seconds and
# lowers the limit by TIGHTEN_BY while it is short (down to the kernel's least quota).
TIGHTEN_EVERY = 2.0
TIGHTEN_BY = 0.75
# Normal traffic read before the limit, for the clients' latency to compare with.
BEFORE_REQUESTS = 20
# The clients' median request under the limit, against before it, that shows the server
# slowed for them.
SLOWER = 2.0


@dataclass
class Evidence:
    """What the clients saw of a fault: whether its condition happened, and in figures."""

    held: bool = False
    text: str = "the fault did not run"


def _cpu_times(times: ThreadTimes, pids: list[int]) -> tuple[float, float]:
    """Seconds the processes' threads ran, and waited to run, all together, so far."""
    read = times.read(pids).values()
    return sum(run for run, _ in read), sum(wait for _, wait in read)


class CpuLimit:
    """A CFS bandwidth limit on a cgroup of its own (v1's ``cpu.cfs_quota_us`` or v2's
    ``cpu.max``), as a container's CPU limit is, with processes moved in and back out."""

    def __init__(self, name: str) -> None:
        v1 = CGROUP_V1.is_dir() and (CGROUP_V1 / "cpu.cfs_quota_us").exists()
        if not v1 and "cpu" not in (CGROUP_V2 / "cgroup.subtree_control").read_text().split():
            raise StackError("no writable CPU controller: the CPU-limit fault needs root")
        self.v1 = v1
        self.path = (CGROUP_V1 if v1 else CGROUP_V2) / name
        self.home: dict[int, Path] = {}

    def _origin(self, pid: int) -> Path:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if (self.v1 and "cpu" in controllers.split(",")) or (not self.v1 and not controllers):
                return (CGROUP_V1 if self.v1 else CGROUP_V2) / path.lstrip("/")
        raise StackError(f"process {pid} is in no CPU cgroup")

    def apply(self, pids: list[int], cores: float) -> None:
        self.path.mkdir(exist_ok=True)
        quota = max(LEAST_QUOTA_US, round(cores * PERIOD_US))
        if self.v1:
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        for pid in pids:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                self.home[pid] = self._origin(pid)
                (self.path / "cgroup.procs").write_text(str(pid))

    def throttled(self) -> tuple[int, float]:
        """(periods throttled, seconds throttled) so far."""
        stat = dict(
            line.split() for line in (self.path / "cpu.stat").read_text().splitlines() if line
        )
        if self.v1:
            return int(stat["nr_throttled"]), int(stat["throttled_time"]) / 1e9
        return int(stat["nr_throttled"]), int(stat["throttled_usec"]) / 1e6

    def remove(self) -> None:
        for pid, home in self.home.items():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError, OSError):
                (home / "cgroup.procs").write_text(str(pid))
        if self.path.is_dir():
            for _ in range(50):  # until the kernel has seen the last process leave
                try:
                    self.path.rmdir()
                    return
                except OSError:
                    time.sleep(0.1)


def target_odds(threshold: float) -> float:
    """The odds of waiting (waited / run) the limit aims at: :data:`WAIT_ODDS_FACTOR` x
    those of the CPU-wait ``threshold``."""
    return WAIT_ODDS_FACTOR * threshold / (1 - threshold)


def limited_cores(demand: float, threshold: float) -> float:
    """The CPU limit, in cores, under which a server that demands ``demand`` cores (run or
    ready to run) waits at :func:`target_odds`: it runs a share ``1 / (1 + odds)`` of what
    it is ready for."""
    return demand / (1 + target_odds(threshold))


async def hold_wait(
    limit: CpuLimit, times: ThreadTimes, pids: list[int], cores: float, odds: float, stop
) -> float:
    """Until ``stop``: lower ``limit`` (now ``cores``) by :data:`TIGHTEN_BY` each time the
    server waited at odds under ``odds`` over the last :data:`TIGHTEN_EVERY` seconds.
    Returns the cores of the last limit."""
    while not stop.is_set():
        run, wait = _cpu_times(times, pids)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), TIGHTEN_EVERY)
        ran, waited = (b - a for a, b in zip((run, wait), _cpu_times(times, pids), strict=True))
        if not stop.is_set() and waited < odds * ran and cores > LEAST_QUOTA_US / PERIOD_US:
            cores = max(cores * TIGHTEN_BY, LEAST_QUOTA_US / PERIOD_US)
            limit.apply(pids, cores)
    return cores


def cpu_limit(evidence: Evidence):
    """A CPU limit on the server's processes (a container limit set too low, or a node's
    cgroup squeezed), sized from the server's CPU demand under normal traffic and the
    calibrated CPU-wait threshold; normal traffic goes on."""

    async def fault(stack: LocalStack, stop: asyncio.Event) -> None:
        log: list[Request] = []
        traffic = asyncio.create_task(normal_traffic(stack, stop, log))
        assert stack.vllm.process is not None
        pids = process_tree(stack.vllm.process.pid)
        times = ThreadTimes()
        limit = CpuLimit(f"inferwatch-e2e-{os.getpid()}")
        try:
            began, demand_before = time.monotonic(), sum(_cpu_times(times, pids))
            while len(log) < BEFORE_REQUESTS and not stop.is_set():
                await asyncio.sleep(0.05)
            demand = (sum(_cpu_times(times, pids)) - demand_before) / (time.monotonic() - began)
            before = [r.seconds for r in log if r.status == 200]
            threshold = stack.spec.threshold("server_cpu_wait_share")
            cores = limited_cores(demand, threshold)
            limit.apply(pids, cores)
            limited_at = time.monotonic()
            last = await hold_wait(limit, times, pids, cores, target_odds(threshold), stop)
            periods, seconds = limit.throttled()
        finally:
            limit.remove()
            await traffic
        under = [r.seconds for r in log if r.sent >= limited_at and r.status == 200]
        if not before or not under:
            evidence.text = f"{len(before)} requests before the limit, {len(under)} under it"
            return
        ratio = statistics.median(under) / statistics.median(before)
        evidence.held = ratio >= SLOWER and periods > 0
        evidence.text = (
            f"limit {cores:.2f} cores (at last {last:.2f}) for a demand of {demand:.2f}; the "
            f"clients' median request "
            f"{ratio:.1f}x as long ({statistics.median(under) * 1000:.0f} ms over {len(under)}, "
            f"{statistics.median(before) * 1000:.0f} ms before); throttled in {periods} periods, "
            f"{seconds:.1f} s"
        )

    return fault


def hung_frontend(evidence: Evidence):
    """The API server stops answering (SIGSTOP: a deadlock, a GC pause, a debugger) while
    its port still accepts connections and the engine runs on; resumed as the scenario
    ends. Normal traffic goes on: its requests hang."""

    async def fault(stack: LocalStack, stop: asyncio.Event) -> None:
        assert stack.vllm.process is not None
        api = stack.vllm.process.pid
        log: list[Request] = []
        traffic = asyncio.create_task(normal_traffic(stack, stop, log))
        os.kill(api, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            await stop.wait()
        finally:
            resumed = time.monotonic()
            os.kill(api, signal.SIGCONT)
            await traffic
        # A request in flight at the stop may have been answered from the socket's buffer.
        answered = [r for r in log if stopped + 1 < r.answered < resumed]
        hung = [r for r in log if r.sent < resumed and r.answered >= resumed]
        longest = max((resumed - r.sent for r in hung), default=0.0)
        evidence.held = not answered and bool(hung)
        evidence.text = (
            f"API server stopped {resumed - stopped:.0f} s: {len(answered)} requests answered "
            f"meanwhile, {len(hung)} waited for the resume (the longest {longest:.0f} s)"
        )

    return fault


CPU_LIMIT, HUNG_FRONTEND = Evidence(), Evidence()
EVIDENCE = {"CPU limit": CPU_LIMIT, "hung frontend": HUNG_FRONTEND}

SCENARIOS = (
    Scenario(
        "CPU limit",
        "InferenceServerCPUStarved",
        cpu_limit(CPU_LIMIT),
        # Slow in every phase as for the noisy neighbour: listed under the starvation.
        also_allowed=frozenset(
            {
                "InferencePrefillBottleneck",
                "InferenceDecodeBottleneck",
                "InferencePrefillStallsDecode",
                "InferenceQueueingDelay",
                REGRESSION,
                CANARY,
                GAP,
            }
        ),
        story="A CFS limit on the server's cgroup, a fraction of what it demands under normal "
        "traffic: the kernel throttles it every period.",
    ),
    Scenario(
        "hung frontend",
        "InferenceBackendDown",
        hung_frontend(HUNG_FRONTEND),
        # The hung requests finish late when it resumes.
        also_allowed=frozenset({REGRESSION, CANARY, GAP}),
        story="The API server is stopped (SIGSTOP) with its port open: connections are "
        "accepted, nothing is answered.",
    ),
)
