"""The faults the scenarios start on a :class:`~demo.local_stack.LocalStack`, each run until
``stop`` is set and undone as it ends, and the normal traffic some of them run under.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable

from demo.calibration import (
    LONG_PROMPT_OUTPUT,
    NORMAL_OUTPUT,
    NORMAL_WORDS,
    OVERLOAD_OUTPUT,
    OVERLOAD_WORDS,
    normal_load,
)
from demo.local_stack import LocalStack
from demo.traffic import Burst, Request, burst, complete_many, open_loop

Fault = Callable[[LocalStack, asyncio.Event], Awaitable[None]]

# The load ramp's first stair, as a share of the measured capacity (the second is set by the
# capacity ticket's threshold), and how many rate windows the second holds.
RAMP_LOW = 0.6
RAMP_HOLD = 2


async def normal_traffic(
    stack: LocalStack, stop: asyncio.Event, log: list[Request] | None = None
) -> None:
    """Two clients back to back, short prompts, short answers: the load calibrated for, at
    most the load ramp's first stair (:data:`RAMP_LOW` of the measured capacity). Where two
    clients back to back come near what the server carries with its first tokens in time
    (a slow machine: bursts of open-loop arrivals queue where two clients never do), the
    normal traffic is not the capacity ticket's case. Each request is added to ``log``."""
    await normal_load(stack.vllm.url, stop, RAMP_LOW * stack.faults.capacity, log)


async def overload(stack: LocalStack, stop: asyncio.Event) -> None:
    """Four times as many concurrent clients as the engine's batch admits."""
    await complete_many(
        stack.vllm.url, stop, clients=stack.faults.overload_clients, prompt_words=OVERLOAD_WORDS,
        max_tokens=OVERLOAD_OUTPUT,
    )  # fmt: skip


async def long_prompts(stack: LocalStack, stop: asyncio.Event) -> None:
    """One client whose prompts' prefill alone is a multiple of the TTFT threshold."""
    await complete_many(
        stack.vllm.url,
        stop,
        clients=1,
        prompt_words=stack.faults.long_prompt_words,
        max_tokens=LONG_PROMPT_OUTPUT,
    )


async def prompts_into_streams(stack: LocalStack, stop: asyncio.Event) -> None:
    """Long prompts, one after another, into streams that decode: each long prompt's
    prefill runs in the streams' steps, and their next token waits for it."""
    f = stack.faults
    streams = asyncio.create_task(
        complete_many(
            stack.vllm.url,
            stop,
            clients=f.streams,
            prompt_words=NORMAL_WORDS,
            max_tokens=f.stream_tokens,
        )
    )
    try:
        await long_prompts(stack, stop)
    finally:
        await streams


async def kv_pressure(stack: LocalStack, stop: asyncio.Event) -> None:
    """Bursts of long generations whose batch needs twice the KV cache: preemptions."""
    f = stack.faults
    spec = Burst(
        requests=f.kv_requests, prompt_words=f.kv_prompt_words, max_tokens=f.kv_output_tokens
    )
    salt = 0
    while not stop.is_set():
        salt += 1
        await burst(stack.vllm.url, spec, salt=salt)


async def engine_stall(stack: LocalStack, stop: asyncio.Event) -> None:
    """Pause the engine process (SIGSTOP) the moment requests wait: queued while idle.

    Twice the batch in short requests: requests queue, and the backlog released when the
    engine resumes fits in the KV cache.
    """
    engine = stack.vllm.engine_core_pid()
    load = asyncio.create_task(
        complete_many(
            stack.vllm.url, stop, clients=stack.faults.stall_clients, prompt_words=2, max_tokens=12
        )
    )
    waiting = functools.partial(stack.vllm.metric, "vllm:num_requests_waiting")
    try:
        while not stop.is_set():
            while await asyncio.to_thread(waiting) <= 0 and not stop.is_set():
                await asyncio.sleep(0.005)
            os.kill(engine, signal.SIGSTOP)
            # The gauges freeze at the engine's last published stats, which may postdate the
            # queue just seen: hold the stall while they show requests waiting, else resume
            # and catch the next queue.
            while await asyncio.to_thread(waiting) > 0 and not stop.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.2)
            if not stop.is_set():
                os.kill(engine, signal.SIGCONT)
    finally:
        os.kill(engine, signal.SIGCONT)
        await load


async def slow_path(stack: LocalStack, stop: asyncio.Event) -> None:
    """The path in front of the server holds each request twice the client-gap threshold
    before passing it on; the users' traffic goes on as normal."""
    assert stack.proxy is not None
    await asyncio.to_thread(stack.proxy.set_fault, stack.faults.path_delay)
    try:
        await normal_traffic(stack, stop)
    finally:
        await asyncio.to_thread(stack.proxy.set_fault)


# The noisy neighbour's priority: above the server's (demo/stack.py runs it niced), below
# the stack that watches it, so that the fault takes the server's cores and not Prometheus'.
NEIGHBOUR_NICENESS = 5


async def noisy_neighbour(stack: LocalStack, stop: asyncio.Event) -> None:
    """Busy loops beside the server, one per CPU it may run on: its threads wait for the
    cores they are ready to run on; the users' traffic goes on as normal."""
    loop = f"import os; os.nice({NEIGHBOUR_NICENESS})\nwhile True: pass"
    loops = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(stack.faults.neighbours)]
    try:
        await normal_traffic(stack, stop)
    finally:
        for busy in loops:
            busy.kill()
            busy.wait()


async def broken_route(stack: LocalStack, stop: asyncio.Event) -> None:
    """The path in front of the server answers 503 to every request; the server is fine."""
    assert stack.proxy is not None
    await asyncio.to_thread(stack.proxy.set_fault, 0.0, 503)
    try:
        await normal_traffic(stack, stop)
    finally:
        await asyncio.to_thread(stack.proxy.set_fault)


async def backend_crash(stack: LocalStack, stop: asyncio.Event) -> None:
    """Kill the server outright; it is started again when the scenario ends (recovery)."""
    process = stack.vllm.process
    assert process is not None and process.popen is not None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    await asyncio.to_thread(process.popen.wait)  # reap it
    await stop.wait()
    await asyncio.to_thread(stack.vllm.start)


async def load_ramp(stack: LocalStack, stop: asyncio.Event) -> None:
    """Traffic of the normal shape stepping up through the measured capacity, open loop: a
    rate window at :data:`RAMP_LOW` of it, then :data:`RAMP_HOLD` windows midway between the
    capacity ticket's threshold and the capacity (the ticket's case: requests still meet
    their objectives); then the overload fault until the scenario ends (the queue forms, the
    TTFT objective burns: clients that wait for their answers overload the server however
    fast this process sends)."""
    capacity, window = stack.faults.capacity, stack.spec.window_seconds
    near = (stack.spec.threshold("capacity_use_high") + 1) / 2
    stairs = ((RAMP_LOW * capacity, window), (near * capacity, RAMP_HOLD * window))
    ramping = asyncio.create_task(
        open_loop(stack.vllm.url, stop, stairs, prompt_words=NORMAL_WORDS, max_tokens=NORMAL_OUTPUT)
    )
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), sum(seconds for _, seconds in stairs))
    if not stop.is_set():
        await overload(stack, stop)
    await ramping
