"""Derived signals over sequences of polls, and through the poller on a data-parallel pod."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from inferwatch.collect.backends import SGLANG, VLLM
from inferwatch.collect.derive import EngineLayout, QueuedWhileIdle, decode_floor, weights_bytes_in
from inferwatch.collect.gpu import GpuSource
from inferwatch.collect.poller import Poller, PollSettings
from inferwatch.collect.steps import RECURRENCE, STEP_FLOOR, STEP_MEMORY, StepRecord
from inferwatch.collect.upstream import Upstream
from inferwatch.model import BackendSample, GpuSample
from inferwatch.serve.exposition import render

from conftest import page_value
from fake_nvml import FakeGpu, FakeNvml

KEY = (("backend", "vllm"), ("model", "m"), ("engine", "0"))
ENGINE_1 = (("backend", "vllm"), ("model", "m"), ("engine", "1"))


def page(waiting: float, steps: float, engine: str = "0") -> BackendSample:
    return VLLM.normalize(
        f'vllm:num_requests_waiting{{engine="{engine}",model_name="m"}} {waiting}\n'
        f'vllm:iteration_tokens_total_count{{engine="{engine}",model_name="m"}} {steps}\n'
    )


def gpu(busy_ratio: float) -> GpuSample:
    return GpuSample(
        index=0, uuid="GPU-0", name="H100", utilization_ratio=busy_ratio, busy_ratio=busy_ratio
    )


def run(qwi: QueuedWhileIdle, polls: list) -> list[float]:
    """Feed (time, sample, gpus) polls; return the integrated seconds after each."""
    out = []
    for t, sample, gpus in polls:
        _, seconds = qwi.update(t, sample, gpus)
        out.append(seconds.get(KEY, 0.0))
    return out


def test_engine_stall_with_queue_is_counted_within_one_poll() -> None:
    # Polls every 0.5 s; the engine stops stepping after t=1.0 and resumes before t=3.5.
    # Judged from engine progress, the stall counts once it has lasted over 1 s (at t=2.5),
    # from its start; then by each poll.
    steps = [10, 20, 30, 30, 30, 30, 30, 40]
    polls = [(i * 0.5, page(waiting=5, steps=s), None) for i, s in enumerate(steps)]
    totals = run(QueuedWhileIdle(), polls)
    assert totals == [0.0, 0.0, 0.0, 0.0, 0.0, 1.5, 2.0, 2.0]


def test_one_long_engine_step_is_not_a_stall() -> None:
    # No step between two polls 0.5 s apart, then progress: a step longer than a poll.
    steps = [10, 20, 20, 30, 40]
    polls = [(i * 0.5, page(waiting=5, steps=s), None) for i, s in enumerate(steps)]
    assert run(QueuedWhileIdle(), polls)[-1] == 0.0


def long_steps(start: float, count: int, seconds: float, steps: float) -> tuple[list, float]:
    """Polls every 0.1 s of ``count`` steps of ``seconds`` each with requests waiting (the
    recompute of preempted requests, as measured on vLLM on CPU); the steps count after."""
    polls, t = [], start
    for _ in range(count):
        for _ in range(round(seconds / 0.1)):
            polls.append((t, page(waiting=16, steps=steps), None))
            t += 0.1
        steps += 1
    polls.append((t, page(waiting=16, steps=steps), None))
    return polls, steps


def test_a_loads_recurring_long_steps_stop_counting_once_they_recur() -> None:
    # Ten steps of 1.8 s: the first RECURRENCE outlast the floor and count; from then on the
    # engine's own record says such a step is no stall.
    qwi = QueuedWhileIdle()
    polls, _ = long_steps(0.0, 10, 1.8, 10)
    totals = run(qwi, polls)
    per_step = round(1.8 / 0.1)
    counted = [totals[(i + 1) * per_step] - totals[i * per_step] for i in range(10)]
    assert all(c > STEP_FLOOR for c in counted[:RECURRENCE])
    assert counted[RECURRENCE:] == [0.0] * (10 - RECURRENCE)


def test_steps_as_long_as_the_operator_says_never_count() -> None:
    # --engine-step-seconds 1.9: the first 1.8 s steps are known for what they are.
    qwi = QueuedWhileIdle(steps=StepRecord(known_step=1.9))
    polls, steps = long_steps(0.0, 5, 1.8, 10)
    assert run(qwi, polls)[-1] == 0.0
    stall, _ = long_steps(polls[-1][0] + 0.1, 1, 6.0, steps + 5)  # over twice the step
    totals = run(qwi, stall)
    assert totals[-1] - totals[0] == pytest.approx(5.9, abs=0.25)


def test_one_stall_does_not_raise_the_bar_for_the_next() -> None:
    # A 20 s stall, resumed, then another: the second counts from its start as the first did.
    qwi = QueuedWhileIdle()
    first, steps = long_steps(0.0, 1, 20.0, 10)
    second, _ = long_steps(first[-1][0] + 0.1, 1, 20.0, steps + 5)
    totals = run(qwi, [*first, *second])
    assert totals[len(first) - 1] == pytest.approx(20.0, abs=0.15)
    assert totals[-1] - totals[len(first)] == pytest.approx(19.9, abs=0.25)


def test_long_steps_are_forgotten_after_the_memory() -> None:
    qwi = QueuedWhileIdle()
    polls, steps = long_steps(0.0, RECURRENCE, 1.8, 10)
    run(qwi, polls)
    later, _ = long_steps(polls[-1][0] + STEP_MEMORY + 1, 1, 1.8, steps + 1)
    totals = run(qwi, later)
    assert totals[-1] - totals[0] > STEP_FLOOR


def test_a_stretch_without_work_is_not_a_step() -> None:
    # Nothing running or waiting for 5 s, then a burst: an idle engine takes no long step.
    qwi = QueuedWhileIdle()
    for i in range(4 * RECURRENCE):
        base = i * 6.0
        run(qwi, [(base + j * 0.5, page(waiting=0, steps=10 + i), None) for j in range(10)])
    polls, _ = long_steps(4 * RECURRENCE * 6.0, 1, 1.8, 100)
    totals = run(qwi, polls)
    assert totals[-1] - totals[0] > STEP_FLOOR


def test_busy_engine_with_queue_is_not_counted() -> None:
    polls = [(i * 0.5, page(waiting=20, steps=10 * i), None) for i in range(8)]
    assert run(QueuedWhileIdle(), polls)[-1] == 0.0


def test_idle_engine_without_queue_is_not_counted() -> None:
    polls = [(i * 0.5, page(waiting=0, steps=7), None) for i in range(8)]
    state, _ = QueuedWhileIdle().update(0.0, page(0, 7), None)
    assert run(QueuedWhileIdle(), polls)[-1] == 0.0
    assert state == {KEY: False}


def test_state_flag_follows_the_stall() -> None:
    qwi = QueuedWhileIdle()
    qwi.update(0.0, page(3, 5), None)
    for t in (0.5, 1.0):
        state, _ = qwi.update(t, page(3, 5), None)
        assert state == {KEY: False}  # not yet over a second without a step
    state, _ = qwi.update(1.5, page(3, 5), None)
    assert state == {KEY: True}
    state, _ = qwi.update(2.0, page(3, 9), None)
    assert state == {KEY: False}


def test_one_stalled_engine_of_two_counts() -> None:
    def two(w0: float, s0: float, w1: float, s1: float) -> BackendSample:
        return VLLM.normalize(
            f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {w0}\n'
            f'vllm:num_requests_waiting{{engine="1",model_name="m"}} {w1}\n'
            f'vllm:iteration_tokens_total_count{{engine="0",model_name="m"}} {s0}\n'
            f'vllm:iteration_tokens_total_count{{engine="1",model_name="m"}} {s1}\n'
        )

    qwi = QueuedWhileIdle()
    polls = [(t, two(0, 10 + 20 * t, 4, 10), None) for t in (0.0, 0.5, 1.0, 1.5)]
    assert run(qwi, polls) == [0.0] * 4  # engine 0 steps on: its own series stays at 0
    state, seconds = qwi.update(2.0, two(0, 60, 4, 10), None)
    assert state == {KEY: False, ENGINE_1: True}
    assert seconds == {KEY: 0.0, ENGINE_1: 2.0}


def test_with_nvml_an_idle_gpu_decides_not_engine_progress() -> None:
    qwi = QueuedWhileIdle(idle_threshold=0.1)
    # Steps advance (the engine loop spins) but the GPU is 2 % busy: queued while idle.
    polls = [(i * 0.5, page(waiting=8, steps=10 * i), [gpu(0.02)]) for i in range(3)]
    assert run(qwi, polls) == [0.0, 0.5, 1.0]


def test_with_nvml_a_busy_gpu_is_never_idle() -> None:
    qwi = QueuedWhileIdle(idle_threshold=0.1)
    polls = [(i * 0.5, page(waiting=8, steps=5), [gpu(0.95), gpu(0.5)]) for i in range(4)]
    assert run(qwi, polls)[-1] == 0.0


def test_backend_gap_is_not_counted_and_totals_survive_it() -> None:
    qwi = QueuedWhileIdle()
    polls = [
        (0.0, page(5, 1), None),
        (0.5, page(5, 1), None),
        (1.0, page(5, 1), None),
        (1.5, page(5, 1), None),  # over a second without a step: +1.5
        (2.0, None, None),  # backend down: unknown, nothing counted
        (5.0, page(5, 1), None),  # first poll after the gap only re-primes
        (5.5, page(5, 1), None),
        (6.0, page(5, 1), None),
        (6.5, page(5, 1), None),  # over a second again: +1.5
    ]
    assert run(qwi, polls) == [0.0, 0.0, 0.0, 1.5, 1.5, 1.5, 1.5, 1.5, 3.0]


H100_BANDWIDTH = 5120 / 8 * 2619e6 * 2  # the fake NVML's GPU: 3.352 TB/s


def h100(index: int, busy: float = 0.0) -> GpuSample:
    return GpuSample(
        index,
        f"GPU-{index}",
        "H100",
        utilization_ratio=busy,
        busy_ratio=busy,
        memory_bandwidth_peak_bytes_per_second=H100_BANDWIDTH,
    )


def test_decode_floor_is_weights_over_the_bandwidth_of_one_engines_gpus() -> None:
    one_engine = page(0, 0)
    floor = decode_floor(one_engine, [h100(0)], EngineLayout(), 16e9, None)
    assert floor == {KEY: pytest.approx(16e9 / H100_BANDWIDTH)}
    # One engine over two GPUs (tensor parallel): its weights are read from both.
    floor = decode_floor(one_engine, [h100(0), h100(1)], EngineLayout(), 16e9, None)
    assert floor == {KEY: pytest.approx(16e9 / (2 * H100_BANDWIDTH))}
    # ... unless it is stated to run on one of them.
    floor = decode_floor(one_engine, [h100(0), h100(1)], EngineLayout(1), 16e9, None)
    assert floor == {KEY: pytest.approx(16e9 / H100_BANDWIDTH)}
    assert decode_floor(one_engine, [h100(0)], EngineLayout(), 16e9, 1e11) == {KEY: 0.16}
    assert decode_floor(one_engine, [], EngineLayout(), 16e9, 1e11) == {KEY: 0.16}
    assert decode_floor(one_engine, [], EngineLayout(), 16e9, None) == {}
    assert decode_floor(one_engine, [h100(0)], EngineLayout(), None, None) == {}
    assert decode_floor(None, [h100(0)], EngineLayout(), 16e9, None) == {}


def dp_page(engines: int, waiting: list[float], steps: list[float], model: str = "m") -> str:
    """A vLLM page of ``engines`` data-parallel engines."""
    lines = []
    for engine in range(engines):
        labels = f'engine="{engine}",model_name="{model}"'
        lines.append(f"vllm:num_requests_waiting{{{labels}}} {waiting[engine]}")
        lines.append(f"vllm:iteration_tokens_total_count{{{labels}}} {steps[engine]}")
    return "\n".join(lines) + "\n"


def test_engine_layout_places_data_parallel_ranks_on_consecutive_gpus() -> None:
    units = [(("model", "m"), ("engine", e)) for e in ("0", "1", "10", "2")]
    gpus = [h100(i) for i in range(8)]
    groups = EngineLayout().gpus_of(units, gpus)  # 8 GPUs / 4 engines: TP 2, numeric order
    assert {dict(u)["engine"]: (g.start, g.stop) for u, g in groups.items()} == {
        "0": (0, 2),
        "1": (2, 4),
        "2": (4, 6),
        "10": (6, 8),
    }
    # TP 4 stated: two engines fit on the eight GPUs; the others are not placed.
    groups = EngineLayout(4).gpus_of(units, gpus)
    assert {dict(u)["engine"]: (g.start, g.stop) for u, g in groups.items()} == {
        "0": (0, 4),
        "1": (4, 8),
    }
    assert EngineLayout().gpus_of(units, gpus[:6]) == {}  # 6 GPUs do not divide among 4
    # A GPU missing from one poll does not shift the others: GPUs are remembered.
    layout = EngineLayout()
    layout.gpus_of(units, gpus)
    assert len(layout.gpus_of(units, gpus[1:])) == 4


def test_engine_without_a_known_gpu_is_judged_by_its_progress() -> None:
    # 3 GPUs, 2 engines: which GPU is whose cannot be told. Engine 1 stops stepping.
    qwi = QueuedWhileIdle()
    gpus = [h100(0, 0.9), h100(1, 0.9), h100(2, 0.9)]
    totals = []
    for i in range(4):
        sample = VLLM.normalize(dp_page(2, [0, 9], [10 * i, 100]))
        totals.append(qwi.update(i * 0.5, sample, gpus)[1][ENGINE_1])
    assert totals == [0.0, 0.0, 0.0, 1.5]  # over a second without a step, from its start
    assert decode_floor(sample, gpus, EngineLayout(), 16e9, None) == {}


def test_series_of_a_model_that_is_gone_are_dropped() -> None:
    qwi = QueuedWhileIdle()
    for i in range(100):
        sample = VLLM.normalize(dp_page(2, [0, 9], [i, 5], model=f"m{i}"))
        state, seconds = qwi.update(i * 0.5, sample, None)
        assert len(state) == len(seconds) == 2
    assert set(seconds) == {(("backend", "vllm"), ("model", "m99"), ("engine", e)) for e in "01"}
    # One engine fewer: its series go too.
    state, seconds = qwi.update(50.0, VLLM.normalize(dp_page(1, [0], [7], model="m99")), None)
    assert set(state) == set(seconds) == {(("backend", "vllm"), ("model", "m99"), ("engine", "0"))}


def test_weight_bytes_sum_safetensors(tmp_path: Path) -> None:
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"x" * 234)
    (tmp_path / "config.json").write_text("{}")
    assert weights_bytes_in(tmp_path) == 1234
    with pytest.raises(ValueError, match=r"no \*\.safetensors"):
        weights_bytes_in(tmp_path / "..")


SGLANG_KEY = (("backend", "sglang"), ("model", "m"))


def sglang_page(waiting: float, passes: float, idle: float | None) -> BackendSample:
    """An SGLang page: queue gauge, forward-pass counter and (0.5.20+) the idle counter."""
    labels = 'engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"'
    text = (
        f"sglang:num_queue_reqs{{{labels}}} {waiting}\n"
        f'sglang:cuda_graph_passes_total{{{labels},mode="decode_cuda_graph"}} {passes}\n'
    )
    if idle is not None:
        text += f"sglang:scheduler_idle_seconds_total{{{labels}}} {idle}\n"
    return SGLANG.normalize(text)


def run_sglang(polls: list, gpus=None) -> list[float]:
    qwi = QueuedWhileIdle()
    return [qwi.update(t, sample, gpus)[1].get(SGLANG_KEY, 0.0) for t, sample in polls]


def test_sglang_stale_queue_gauge_after_a_burst_is_not_queued_while_idle() -> None:
    # The burst is over: no forward pass, but the queue gauge still reads its last value
    # (SGLang republishes it only every 30 s when idle). The scheduler's idle counter,
    # which SGLang adds to about once a second, says the queue was empty meanwhile.
    idle = [100.0, 100.0, 101.0, 101.0, 102.0, 102.0, 103.0]
    polls = [(i * 0.5, sglang_page(3, 500, s)) for i, s in enumerate(idle)]
    assert run_sglang(polls) == [0.0] * 7
    assert run_sglang(polls, gpus=[gpu(0.0)]) == [0.0] * 7  # with NVML too


def test_sglang_engine_that_stops_with_a_queue_and_reports_no_idle_time_is_counted() -> None:
    # No idle report within 2 s of the stall's start: it counts, from its start (t=0.0).
    polls = [(i * 0.5, sglang_page(3, 500, 100.0)) for i in range(8)]
    totals = run_sglang(polls)
    assert totals == [0.0, 0.0, 0.0, 0.0, 0.0, 2.5, 3.0, 3.5]
    qwi = QueuedWhileIdle()
    states = [qwi.update(t, sample, None)[0][SGLANG_KEY] for t, sample in polls]
    assert states == [False] * 5 + [True] * 3  # the flag lags the stall by the window


def test_sglang_stall_right_after_idle_time_is_counted_once_the_idle_report_is_old() -> None:
    # Idle time reported at t=0.5; the engine then sits with a queue and no forward pass.
    # The queue is believed from t=3.0 (report > 2 s old), the stall confirmed at t=5.0.
    idle = [100.0] + [101.0] * 11
    polls = [(i * 0.5, sglang_page(2, 40, s)) for i, s in enumerate(idle)]
    assert run_sglang(polls) == [0.0] * 10 + [2.5, 3.0]


def test_sglang_busy_engine_with_a_queue_is_not_counted() -> None:
    polls = [(i * 0.5, sglang_page(20, 40 * i, 100.0)) for i in range(5)]
    assert run_sglang(polls)[-1] == 0.0


def test_sglang_build_without_the_idle_counter_uses_engine_progress_alone() -> None:
    # Like any engine-progress verdict: counted once over a second, from the stall's start.
    polls = [(i * 0.5, sglang_page(3, 500, None)) for i in range(5)]
    assert run_sglang(polls) == [0.0, 0.0, 0.0, 1.5, 2.0]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_data_parallel_pod_judges_each_engine_on_its_own_gpu(aiohttp_server) -> None:
    """DP=2 on two GPUs: engine 1 hangs (9 waiting, 0 running, its GPU idle) while engine 0
    keeps GPU 0 90 % busy. Engine 1 alone is queued while idle, and each engine's decode
    floor is the weights over one GPU's bandwidth (4.79 ms), not over both (2.40 ms)."""
    steps = {"0": 0}

    async def metrics(request: web.Request) -> web.Response:
        steps["0"] += 7
        lines = []
        for engine, waiting, running, step in (("0", 0, 4, steps["0"]), ("1", 9, 0, 300)):
            labels = f'engine="{engine}",model_name="llama-3-8b"'
            lines += [
                f"vllm:num_requests_waiting{{{labels}}} {waiting}",
                f"vllm:num_requests_running{{{labels}}} {running}",
                f"vllm:iteration_tokens_total_count{{{labels}}} {step}",
            ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app)
    clock = Clock()
    nvml = FakeNvml([FakeGpu(0, util=90), FakeGpu(1, util=0)])
    gpu = GpuSource(nvml=nvml, clock=clock)
    gpu.start()
    upstream = Upstream(str(server.make_url("")), timeout=2.0, max_bytes=1 << 20)
    weights = 16.06e9  # Llama-3-8B in bf16
    settings = PollSettings(interval=0.5, model_weights_bytes=weights)
    poller = Poller(upstream, VLLM, gpu, settings, clock=clock)
    try:
        for _ in range(3):
            snapshot = await poller.poll_once()
            clock.now += 0.5
    finally:
        await upstream.close()
    page = render(snapshot).decode()
    one = {"backend": "vllm", "model": "llama-3-8b"}
    assert page_value(page, "inferwatch_queued_while_idle", **one, engine="1") == 1.0
    assert page_value(page, "inferwatch_queued_while_idle_seconds_total", **one, engine="1") == 1.0
    assert page_value(page, "inferwatch_queued_while_idle", **one, engine="0") == 0.0
    for engine in "01":
        floor = page_value(page, "inferwatch_decode_floor_seconds", **one, engine=engine)
        assert floor == pytest.approx(weights / H100_BANDWIDTH)
        assert round(floor * 1e3, 2) == 4.79
