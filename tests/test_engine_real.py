"""An engine that dies or hangs behind vLLM's API server, on the real vLLM (CPU).

Killed (SIGKILL), vLLM 0.32's engine core takes its API server down with it: the server
fails the requests in flight and exits, the sidecar reads it as down, and a real Prometheus
with the generated rules fires InferenceBackendDown. Paused (SIGSTOP)
with requests running and none waiting, the engine hangs while the API server keeps
answering, ``/health`` included: the sidecar's verdict finds InferenceEngineHung, and
``inferwatch diagnose`` ranks it first. The times from the fault to each are printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from demo.alerting import Prometheus
from demo.calibration import kv_cache
from demo.processes import http_get, http_json
from demo.stack import Inferwatch, VllmServer
from demo.traffic import complete_many
from inferwatch.method.spec import spec_from_config
from inferwatch.settings import load_config_file
from inferwatch.tools.generate import write

pytestmark = pytest.mark.vllm

GIVE_UP = 120.0  # a guard against a hang, not a bound on how fast anything must be
WINDOW = 10.0  # the sidecar's rate window: a hung engine shows after one of them
# The rules' timing for this test (the demo's: 1 s scrapes and evaluations, short `for`s).
CONFIG = f"""\
alerting:
  rate_window: {WINDOW:g}s
  evaluation_interval: 1s
  exporter_selector: 'job="inferwatch"'
  for:
    InferenceEngineHung: 3s
    InferenceBackendDown: 5s
"""


def sidecar(tmp_path: Path, server: VllmServer) -> Inferwatch:
    config = tmp_path / "inferwatch.yaml"
    config.write_text(CONFIG)
    args = ["--backend", "vllm", "--gpu", "off", "--poll-interval", "0.25", "--config", str(config)]
    return Inferwatch(tmp_path, server.url, args).start()


def findings(iw: Inferwatch) -> list[str]:
    return [f["alert"] for f in http_json(f"{iw.url}/verdict.json")["findings"]]


def wait_until(check, what: str, context=lambda: "") -> float:
    """Seconds until ``check()`` holds."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < GIVE_UP, f"{what} never came {context()}"
        time.sleep(0.25)
    return time.monotonic() - started


def running(iw: Inferwatch) -> float:
    try:
        return iw.metric("inferwatch_requests_running")
    except KeyError:  # not polled yet
        return 0.0


def ranked_first(iw: Inferwatch) -> str | None:
    """What ``inferwatch diagnose --exporter`` ranks first, run as a user runs it."""
    out = subprocess.run(
        [sys.executable, "-m", "inferwatch", "diagnose", "--exporter", iw.url,
         "--interval", "2", "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    findings = json.loads(out.stdout)["findings"]
    return findings[0]["alert"] if findings else None


def answering(url: str) -> bool:
    try:
        return http_get(url, 2)[0] == 200
    except OSError:
        return False


async def faulted(
    server: VllmServer, iw: Inferwatch, sig: int, until, then=lambda: None
) -> tuple[float, object]:
    """Four clients in long generations, then ``sig`` to the engine core; (seconds from the
    signal until ``until()`` holds, and what ``then()`` gives, called while the fault still
    holds). The batch holds 16 and the four fit the KV cache, so none waits (no preemption
    puts one back in the queue)."""
    blocks, block_size = kv_cache(server.url)
    stop = asyncio.Event()
    load = asyncio.create_task(
        complete_many(
            server.url, stop, clients=4, prompt_words=2, max_tokens=blocks * block_size // 8
        )
    )
    try:
        await asyncio.to_thread(wait_until, lambda: running(iw) >= 4, "the load")
        await asyncio.sleep(WINDOW)  # a window of healthy work first
        engine = server.engine_core_pid()
        os.kill(engine, sig)
        try:
            context = lambda: f"(verdict: {http_json(f'{iw.url}/verdict.json')})"  # noqa: E731
            seconds = await asyncio.to_thread(wait_until, until, "the finding", context)
            return seconds, await asyncio.to_thread(then)
        finally:
            if sig == signal.SIGSTOP:
                os.kill(engine, signal.SIGCONT)
    finally:
        stop.set()
        await load


def test_a_hung_engine_behind_an_answering_api_server_is_found_and_ranked_first(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    server = vllm_server.ensure_running()
    iw = sidecar(tmp_path, server)
    health: list[bool] = []
    try:

        def found() -> bool:
            health.append(answering(f"{server.url}/health"))
            return "InferenceEngineHung" in findings(iw)

        seconds, first = asyncio.run(
            faulted(server, iw, signal.SIGSTOP, found, lambda: ranked_first(iw))
        )
    finally:
        iw.stop()
    # The API server answered /health all along: only the engine was stuck.
    assert health and all(health), health
    print(
        f"\nengine paused with 4 requests running: InferenceEngineHung in the verdict after "
        f"{seconds:.1f} s (the verdict judges a {WINDOW:g} s window); /health answered 200 "
        f"{len(health)} times of {len(health)}; diagnose --exporter ranks first: {first}"
    )
    # Two scrapes 2 s apart of the paused engine: no token, the requests still "running".
    assert first == "InferenceEngineHung"


def test_a_killed_engine_core_takes_vllm_down_and_reads_as_backend_down(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    server = vllm_server.ensure_running()
    iw = sidecar(tmp_path, server)
    write(tmp_path, spec_from_config(load_config_file(tmp_path / "inferwatch.yaml")))
    prometheus = Prometheus(
        tmp_path / "prometheus",
        [f"127.0.0.1:{iw.port}"],
        rule_files=[tmp_path / "alerts" / "inferwatch-rules.yaml"],
    ).start()
    seen: dict[str, float] = {}  # seconds after the kill of what was seen ("kill": its time)

    def alerted() -> bool:
        started = seen.setdefault("kill", time.monotonic())
        if "down" not in seen and iw.metric("inferwatch_backend_up") == 0:
            seen["down"] = time.monotonic() - started
        if "exit" not in seen and not server.alive():
            seen["exit"] = time.monotonic() - started
        firing = 'ALERTS{alertname="InferenceBackendDown",alertstate="firing"}'
        return bool(prometheus.query(firing))

    try:
        seconds, first = asyncio.run(
            faulted(server, iw, signal.SIGKILL, alerted, lambda: ranked_first(iw))
        )
        exited = seen.get("exit") or wait_until(lambda: not server.alive(), "vLLM's exit")
    finally:
        prometheus.stop()
        iw.stop()
        server.stop()  # the session's next user starts it again
    print(
        f"\nengine core killed: the sidecar read inferwatch_backend_up 0 after "
        f"{seen['down']:.1f} s, vLLM's API server had exited after {exited:.1f} s, and "
        f"Prometheus (1 s scrapes and evaluations, `for: 5s`) fired InferenceBackendDown "
        f"after {seconds:.1f} s; diagnose --exporter ranks first: {first}"
    )
    assert seen["down"] <= seconds
    assert first == "InferenceBackendDown"
