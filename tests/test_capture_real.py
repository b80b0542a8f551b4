"""Evidence capture on the real stack: vLLM on CPU with its torch profiler on, an injected
engine stall, and the capture the sidecar takes when InferenceQueuedWhileIdle has held.

The test opens what a user would open: the engine's trace (Perfetto's JSON) must hold
engine steps from the fault's time with the stall's gaps between them, and py-spy's samples
must name the API server's and the engine's own functions.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import os
import signal
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from demo.stack import VLLM_ARGS, Inferwatch, VllmServer, http_json
from demo.traffic import complete, complete_many
from inferwatch.collect.steps import STEP_FLOOR

pytestmark = pytest.mark.vllm

GIVE_UP = 300.0  # a guard against a hang, not a bound on how fast anything must be
CAPTURE_SECONDS = 4.0


@pytest.fixture(scope="module")
def profiled_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[VllmServer, Path]]:
    workdir = tmp_path_factory.mktemp("vllm-profiled")
    traces = workdir / "traces"
    traces.mkdir()
    # Without Python stacks (on by default): they make the trace ~10x bigger and vLLM's stop
    # call, which writes it, minutes long on a busy 2-core host.
    config = {
        "profiler": "torch",
        "torch_profiler_dir": str(traces),
        "torch_profiler_with_stack": False,
    }
    server = VllmServer(workdir, extra_args=["--profiler-config", json.dumps(config)]).start()
    yield server, traces
    server.stop()


def sidecar_config(path: Path) -> Path:
    """Short windows, as the demo's: the verdict judges 10 s of polls, the stall's cause
    must hold 3 s."""
    path.write_text("alerting:\n  rate_window: 10s\n  for:\n    InferenceQueuedWhileIdle: 3s\n")
    return path


def max_num_seqs() -> int:
    return int(VLLM_ARGS[VLLM_ARGS.index("--max-num-seqs") + 1])


async def step_seconds(url: str) -> float:
    """An 8-token completion alone, the fastest of three after a warm-up: a measure of how
    long a few engine steps take here. A cold server's first request can take many times
    that, and a pause sized on it would stretch each of the fault's cycles as much."""
    async with aiohttp.ClientSession() as session:
        assert await complete(session, url, "hello", 8) == 200
        times = []
        for _ in range(3):
            started = time.monotonic()
            assert await complete(session, url, "hello", 8) == 200
            times.append(time.monotonic() - started)
        return min(times)


def test_a_stall_triggers_a_capture_with_the_trace_and_the_stacks(
    profiled_vllm: tuple[VllmServer, Path], tmp_path: Path
) -> None:
    server, traces = profiled_vllm
    captures = tmp_path / "captures"
    sidecar = Inferwatch(
        tmp_path,
        server.url,
        [
            "--backend", "vllm", "--gpu", "off", "--poll-interval", "0.25",
            "--config", str(sidecar_config(tmp_path / "inferwatch.yaml")),
            "--capture-dir", str(captures),
            "--capture-on", "InferenceQueuedWhileIdle",
            "--capture-seconds", f"{CAPTURE_SECONDS:g}",
            "--capture-min-interval", "3600",
            "--capture-profiler-dir", str(traces),
            # Bounded by time only: the tiny model's 100 steps (the default bound) fit in
            # one of the fault's run windows, and the gaps between windows are the point.
            "--capture-profiler-steps", "100000",
        ],
    ).start()  # fmt: skip
    try:
        fault = asyncio.run(stall_until_captured(server, sidecar))
        listing = wait_for_capture(sidecar)
        # One capture per --capture-min-interval, whoever asks.
        refused = urllib.request.Request(
            f"{sidecar.url}/capture", b"{}", {"Content-Type": "application/json"}, method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(refused, timeout=10)
        assert answer.value.code == 429 and int(answer.value.headers["Retry-After"]) > 3000
    finally:
        sidecar.stop()
    last = listing["last"]
    assert last["trigger"] == "InferenceQueuedWhileIdle" and last["result"] == "ok", last
    archive = captures / last["archive"]
    assert [c["name"] for c in listing["captures"]] == [archive.name]
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "opened", filter="data")
    opened = tmp_path / "opened" / archive.name.removesuffix(".tar.gz")
    manifest = json.loads((opened / "manifest.json").read_text())
    assert {p["name"]: p["result"] for p in manifest["parts"]} == {
        "verdict.json": "ok",
        "server-metrics-before.txt": "ok",
        "inferwatch-metrics-before.txt": "ok",
        "profiler trace": "ok",
        "stacks dump": "ok",
        "stacks sampled": "ok",
        "server-metrics-after.txt": "ok",
        "inferwatch-metrics-after.txt": "ok",
    }
    verdict = json.loads((opened / "verdict.json").read_text())
    assert "InferenceQueuedWhileIdle" in [f["alert"] for f in verdict["findings"]]
    assert "vllm:num_requests_waiting" in (opened / "server-metrics-before.txt").read_text()

    profiled, steps = engine_steps(opened / "trace")
    during = [start for start, _ in steps if fault.started <= start <= fault.ended]
    assert during, f"no engine step in the fault's {fault.ended - fault.started:.1f} s"
    # The stall shows as profiled time in which the engine started no step: between two steps
    # when a pause fell between them, inside one when it fell mid-step (the step's range then
    # holds it), or up to the profiler's stop when the engine made none after a pause.
    edges = [max(profiled[0], fault.started), *during, min(profiled[1], fault.ended)]
    stall = max(b - a for a, b in itertools.pairwise(edges))
    assert stall >= 0.8 * fault.pause, (stall, fault.pause, len(during))
    print(
        f"\ncapture: {last['archive']} {archive.stat().st_size / 2**20:.2f} MiB, "
        f"{last['finished'] - last['started']:.1f} s from trigger to complete; trace: "
        f"{len(during)} engine steps in the fault over {profiled[1] - profiled[0]:.1f} s "
        f"profiled, longest without a step {stall:.2f} s "
        f"(pauses of {fault.pause:.2f} s)"
    )

    frames = sampled_files(opened / "stacks.speedscope.json")
    assert any("vllm/entrypoints/" in f for f in frames), sorted(frames)[:20]
    assert any("vllm/v1/engine/core.py" in f for f in frames), sorted(frames)[:20]
    assert "vllm/entrypoints/" in (opened / "stacks-dump.txt").read_text()


class Fault:
    def __init__(self, pause: float) -> None:
        self.pause = pause
        self.started = self.ended = 0.0


async def stall_until_captured(server: VllmServer, sidecar: Inferwatch) -> Fault:
    """Twice the batch in clients, and the engine paused most of the time, until the capture
    has sampled its whole duration. It runs for a measured completion's time between pauses
    of three times that, and at least twice what the sidecar counts as a stall."""
    run = max(0.25, await step_seconds(server.url))
    fault = Fault(pause=max(3 * run, 2 * STEP_FLOOR))
    engine = server.engine_core_pid()
    stop = asyncio.Event()
    load = asyncio.create_task(
        complete_many(server.url, stop, clients=2 * max_num_seqs(), prompt_words=2, max_tokens=16)
    )
    fault.started = time.time()
    deadline = time.monotonic() + GIVE_UP
    try:
        while time.monotonic() < deadline:
            os.kill(engine, signal.SIGSTOP)
            await asyncio.sleep(fault.pause)
            os.kill(engine, signal.SIGCONT)
            await asyncio.sleep(run)
            doc = await asyncio.to_thread(http_json, f"{sidecar.url}/captures")
            # On until the capture is complete: a paused engine takes the profiler's start
            # and stop calls only when it runs again.
            if doc["last"] is not None:
                break
        else:
            verdict = await asyncio.to_thread(http_json, f"{sidecar.url}/verdict.json")
            log = (sidecar.workdir / "inferwatch.log").read_text().splitlines()[-30:]
            raise AssertionError(
                f"no capture within the guard time (pauses of {fault.pause:.2f} s, runs of "
                f"{run:.2f} s); captures: {doc}; verdict: {verdict}; the sidecar's log ends:\n"
                + "\n".join(log)
            )
    finally:
        os.kill(engine, signal.SIGCONT)
        fault.ended = time.time()
        stop.set()
        await load
    return fault


def wait_for_capture(sidecar: Inferwatch) -> dict:
    deadline = time.monotonic() + GIVE_UP
    while True:
        doc = http_json(f"{sidecar.url}/captures")
        if doc["last"] is not None and not doc["running"]:
            return doc
        assert time.monotonic() < deadline, "the capture never completed"
        time.sleep(0.5)


def engine_steps(trace_dir: Path) -> tuple[tuple[float, float], list[tuple[float, float]]]:
    """The worker's profiled span and the (start, end) of its engine steps (vLLM's
    ``execute_*`` annotations), as Unix times."""
    workers = [p for p in trace_dir.glob("*.pt.trace.json.gz") if "async_llm" not in p.name]
    assert workers, sorted(p.name for p in trace_dir.iterdir())
    steps, times = [], []
    for path in workers:
        with gzip.open(path, "rt") as f:
            doc = json.load(f)
        base = doc["baseTimeNanoseconds"] / 1e9
        for e in doc["traceEvents"]:
            if "ts" not in e or e.get("ph") == "M":  # metadata events carry no time
                continue
            start = base + e["ts"] / 1e6
            times += [start, start + e.get("dur", 0) / 1e6]
            if e.get("cat") == "user_annotation" and e.get("name", "").startswith("execute_"):
                steps.append((start, start + e.get("dur", 0) / 1e6))
    return (min(times), max(times)), sorted(steps)


def sampled_files(path: Path) -> set[str]:
    doc = json.loads(path.read_text())
    return {f.get("file", "") for f in doc["shared"]["frames"]}
