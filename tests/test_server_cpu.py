"""The CPU under the server, read from /proc of real processes on this machine.

A real server (a Python process listening on a loopback port, with a busy worker child)
and a noisy neighbour (a busy process pinned to the same core): the server's threads wait
for the CPU, and the collector says how long. Nothing of /proc is faked.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferwatch.collect import processes
from inferwatch.collect.backends import VLLM
from inferwatch.collect.poller import Poller, PollSettings
from inferwatch.collect.server_cpu import MIN_INTERVAL, REDISCOVER, ServerCpu
from inferwatch.collect.upstream import Upstream
from inferwatch.serve.exposition import render

from conftest import page_value

SPIN = "while True: pass"
# A listening server: a busy thread, a busy worker child, and (for argv[1] seconds, if any)
# a second busy thread that then ends.
SERVER = """
import socket, subprocess, sys, threading, time
def spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
worker = subprocess.Popen(
    [sys.executable, "-c", "while True: pass"],
    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
)
threading.Thread(target=spin, args=(1e9,), daemon=True).start()
if float(sys.argv[1]):
    threading.Thread(target=spin, args=(float(sys.argv[1]),)).start()
print(s.getsockname()[1], worker.pid, flush=True)
sys.stdin.read()
worker.kill()
"""


def pinned(*argv: str) -> subprocess.Popen:
    """A Python process on core 0 only."""
    return subprocess.Popen(
        ["taskset", "-c", "0", sys.executable, "-c", *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.communicate()


@contextlib.contextmanager
def running_server(thread_seconds: float) -> Iterator[str]:
    """The backend URL of a :data:`SERVER` on core 0."""
    proc = pinned(SERVER, str(thread_seconds))
    port, worker = map(int, proc.stdout.readline().split())
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)
        stop(proc)


def read(cpu: ServerCpu, at: float):
    return cpu.sample(at, None)


@pytest.mark.alone  # the wait it measures is the core's: tests beside it would add theirs
def test_a_noisy_neighbour_shows_as_run_queue_wait() -> None:
    with running_server(0) as url:
        measure_a_neighbour(ServerCpu(url))


def measure_a_neighbour(cpu: ServerCpu) -> None:
    first = read(cpu, 0.0)
    assert first.threads is not None and first.threads >= 3  # main, busy thread, worker
    time.sleep(1.0)
    alone = read(cpu, 10.0)
    neighbour = pinned(SPIN)
    try:
        time.sleep(2.0)
        crowded = read(cpu, 20.0)
    finally:
        stop(neighbour)
    # Two busy server threads on one core: each waits about half the time; with the
    # neighbour, about two thirds. Waiting grew by a large share of the wall time.
    waited_alone = alone.wait_seconds - first.wait_seconds
    waited_crowded = crowded.wait_seconds - alone.wait_seconds
    assert waited_alone > 0.3
    assert waited_crowded / 2.0 > waited_alone / 1.0
    assert crowded.cpu_seconds > alone.cpu_seconds > first.cpu_seconds
    assert crowded.pressure_seconds is not None
    assert crowded.pressure_seconds > alone.pressure_seconds


def test_reads_at_most_once_a_second_and_a_thread_that_ends_keeps_its_count() -> None:
    with running_server(1.0) as url:
        cpu = ServerCpu(url)
        first = read(cpu, 0.0)
        assert read(cpu, MIN_INTERVAL / 2) is first
        time.sleep(0.5)
        before = read(cpu, 5.0)
        time.sleep(1.0)  # the second busy thread has ended
        after = read(cpu, 10.0)
    assert after.threads == before.threads - 1
    assert after.cpu_seconds > before.cpu_seconds
    assert after.wait_seconds >= before.wait_seconds


def open_files() -> int:
    """The threads' schedstat files this process holds open (no other file it opens or
    closes meanwhile, a garbage-collected connection's say, counts)."""
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since listed
            held += os.readlink(f"/proc/self/fd/{fd}").endswith("/schedstat")
    return held


def test_the_threads_files_stay_open_between_reads_and_close_when_they_end() -> None:
    with running_server(1.0) as url:
        before = open_files()
        cpu = ServerCpu(url)
        first = read(cpu, 0.0)
        assert first.threads is not None
        assert open_files() == before + first.threads  # one schedstat a thread, kept
        time.sleep(1.5)  # the second busy thread has ended
        after = read(cpu, 10.0)
        assert after.threads == first.threads - 1
        assert open_files() == before + after.threads  # the ended thread's is closed
        assert after.cpu_seconds > first.cpu_seconds  # a kept file is read afresh
        del cpu
        gc.collect()
        assert open_files() == before


def test_past_the_kept_files_a_threads_file_is_opened_at_each_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(processes, "KEPT_FILES", 1)
    with running_server(0) as url:
        before = open_files()
        cpu = ServerCpu(url)
        first = read(cpu, 0.0)
        assert open_files() == before + 1
        time.sleep(0.5)
        again = read(cpu, 10.0)
        assert open_files() == before + 1
    assert again.threads == first.threads
    assert again.cpu_seconds > first.cpu_seconds


def test_a_server_not_found_is_looked_for_again_only_every_rediscover_seconds() -> None:
    # Looking for a listener scans every process's open files: not at every read.
    port = free_port()
    cpu = ServerCpu(f"http://127.0.0.1:{port}")
    assert read(cpu, 0.0).threads is None
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        assert read(cpu, REDISCOVER - 1).threads is None  # not looked for again yet
        assert read(cpu, REDISCOVER).threads is not None  # this test's own process


def test_the_cgroups_throttling_counts_are_looked_for_once_then_read_where_found(
    tmp_path: Path,
) -> None:
    """The counts come from the server cgroup's cpu.stat, under a cgroup root of this test's
    (v1's cpu controller or v2's unified tree, as the server's /proc/PID/cgroup says)."""

    def write(throttled_us: int, periods: int) -> None:
        for line in Path(f"/proc/{os.getpid()}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            rel = path.lstrip("/")
            for folder in (
                tmp_path / controllers / rel,
                tmp_path / rel,
                tmp_path / "unified" / rel,
            ):
                folder.mkdir(parents=True, exist_ok=True)
                # v1 counts nanoseconds (throttled_time), v2 microseconds (throttled_usec)
                (folder / "cpu.stat").write_text(
                    f"nr_periods 90\nnr_throttled {periods}\n"
                    f"throttled_time {throttled_us * 1000}\nthrottled_usec {throttled_us}\n"
                )

    port = free_port()
    with socket.socket() as listener:  # this test's own process is the server
        listener.bind(("127.0.0.1", port))
        listener.listen()
        cpu = ServerCpu(f"http://127.0.0.1:{port}", cgroup_root=tmp_path)
        write(2_000_000, 4)
        first = read(cpu, 0.0)
        assert (first.throttled_seconds, first.throttled_periods) == (2.0, 4)
        write(3_500_000, 7)
        later = read(cpu, MIN_INTERVAL)
        assert (later.throttled_seconds, later.throttled_periods) == (3.5, 7)
        for stat in tmp_path.rglob("cpu.stat"):
            stat.unlink()
        gone = read(cpu, 2 * MIN_INTERVAL)
    assert gone.throttled_seconds is None and "no readable cpu.stat" in gone.problem


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_server_this_sidecar_cannot_see_is_said_once_and_its_series_are_absent(
    backend_url, caplog
) -> None:
    # The page comes from this test's own loopback server; the server_cpu source looks for a
    # process on a port nobody listens on.
    upstream = Upstream(backend_url, timeout=2.0, max_bytes=1 << 24)
    poller = Poller(upstream, VLLM, None, PollSettings())
    poller.register("server_cpu", ServerCpu(f"http://127.0.0.1:{free_port()}"))
    try:
        for _ in range(3):
            snapshot = await poller.poll_once()
    finally:
        await upstream.close()
    status = snapshot.collectors["server_cpu"]
    assert not status.success and "no process listens on 127.0.0.1 port" in status.error
    assert snapshot.sources["server_cpu"].cpu_seconds is None
    assert snapshot.sources["server_cpu"].pressure_seconds is not None  # the node's PSI still reads
    text = render(snapshot).decode()
    assert "inferwatch_server_cpu_seconds_total" not in text
    assert page_value(text, "inferwatch_collector_success", collector="server_cpu") == 0.0
    assert page_value(text, "inferwatch_node_cpu_pressure_seconds_total") > 0
    said = [r for r in caplog.records if "server_cpu" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]


def test_a_collector_name_is_registered_once() -> None:
    poller = Poller(
        Upstream("http://127.0.0.1:1", timeout=1.0, max_bytes=1 << 10), VLLM, None, PollSettings()
    )
    poller.register("server_cpu", ServerCpu("http://127.0.0.1:1"))
    for name in ("server_cpu", "backend", "gpu"):
        with pytest.raises(ValueError, match=f"a collector named '{name}' is registered already"):
            poller.register(name, ServerCpu("http://127.0.0.1:1"))
