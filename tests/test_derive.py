"""Derived signals over sequences of polls."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferwatch.backends import SGLANG, VLLM
from inferwatch.derive import (
    QueuedWhileIdle,
    aggregate_bandwidth,
    decode_floor,
    weights_bytes_in,
)
from inferwatch.model import BackendSample, GpuSample

KEY = (("backend", "vllm"), ("model", "m"))


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

    polls = [(t, two(0, 10 + 20 * t, 4, 10), None) for t in (0.0, 0.5, 1.0, 1.5)]
    assert run(QueuedWhileIdle(), polls) == [0.0, 0.0, 0.0, 1.5]


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


def test_decode_floor_is_weights_over_aggregate_bandwidth() -> None:
    sample = page(0, 0)
    h100 = GpuSample(0, "a", "H100", memory_bandwidth_peak_bytes_per_second=3.35e12)
    one = aggregate_bandwidth([h100], None)
    assert decode_floor(sample, 16e9, one) == {KEY: pytest.approx(16e9 / 3.35e12)}
    two = aggregate_bandwidth([h100, h100], None)
    assert decode_floor(sample, 16e9, two) == {KEY: pytest.approx(16e9 / 6.7e12)}
    assert aggregate_bandwidth([h100], 1e11) == 1e11  # configured bandwidth wins
    assert aggregate_bandwidth([], None) is None
    assert decode_floor(sample, None, one) == {}
    assert decode_floor(None, 16e9, one) == {}


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
