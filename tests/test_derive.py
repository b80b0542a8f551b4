"""Derived signals over sequences of polls."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferwatch.backends import VLLM
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
    # Polls every 0.5 s; the engine stops stepping after t=1.0 and resumes at t=3.0.
    steps = [10, 20, 30, 30, 30, 30, 40]
    polls = [(i * 0.5, page(waiting=5, steps=s), None) for i, s in enumerate(steps)]
    totals = run(QueuedWhileIdle(), polls)
    assert totals == [0.0, 0.0, 0.0, 0.5, 1.0, 1.5, 1.5]


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
    state, _ = qwi.update(0.5, page(3, 5), None)
    assert state == {KEY: True}
    state, _ = qwi.update(1.0, page(3, 9), None)
    assert state == {KEY: False}


def test_one_stalled_engine_of_two_counts() -> None:
    def two(w0: float, s0: float, w1: float, s1: float) -> BackendSample:
        return VLLM.normalize(
            f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {w0}\n'
            f'vllm:num_requests_waiting{{engine="1",model_name="m"}} {w1}\n'
            f'vllm:iteration_tokens_total_count{{engine="0",model_name="m"}} {s0}\n'
            f'vllm:iteration_tokens_total_count{{engine="1",model_name="m"}} {s1}\n'
        )

    polls = [(0.0, two(0, 10, 4, 10), None), (0.5, two(0, 20, 4, 10), None)]
    assert run(QueuedWhileIdle(), polls) == [0.0, 0.5]


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
        (0.5, page(5, 1), None),  # +0.5
        (1.0, None, None),  # backend down: unknown, nothing counted
        (5.0, page(5, 1), None),  # first poll after the gap only re-primes
        (5.5, page(5, 1), None),  # +0.5
    ]
    assert run(qwi, polls) == [0.0, 0.5, 0.5, 0.5, 1.0]


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
