"""A fleet on loopback: two real vLLM (CPU) replicas behind the real ``vllm-router``, a sidecar
next to each replica and one next to the router, one Prometheus scraping the three with the
generated rules, Alertmanager with the generated example config, its webhooks at a local
receiver. ``make demo-fleet`` runs its faults; ``tests/test_e2e_fleet.py`` judges them.

The router runs round robin (:data:`POLICY`): its default, ``cache_aware``, sends prompts
that share most of their text (the faults' clients' do) to the replica that served the
first of them, an imbalance of its own. Its circuit breaker is off
(``--disable-circuit-breaker``), as in a router that has none: with it on, the router sends a
dead worker nothing after its tenth failure in a row, a second after the kill under load, and
those ten failures weigh against every request the worker answered in the window before it,
more on a faster machine. Its metrics are on their own port (``--prometheus-port``):
``/metrics`` on the main port passes through to a replica's page. Replica ``b`` is reached,
by the router and by its sidecar alike, through ``demo/proxy.py`` (the pod's own proxy, as a
service mesh puts one in front of it), whose fault switch fails its health check alone.

The sidecars judge with ``demo/inferwatch.yaml`` (its windows and ``for`` durations, on a
1 s scrape) and the canary off. The faults' sizes come from the replicas' own settings (their
batch, ``--max-num-seqs``), not from this machine's speed: the fleet's alerts compare the
replicas with each other and the router's view with its health check, never with a time.
The one alert that compares the load with a measurement, the capacity ticket, judges with
the fleet's own: ``inferwatch calibrate`` through the router (:meth:`Fleet.calibrate`), as a
user of like replicas runs it, whose baseline holds one replica's share of what the fleet
carried; the replicas' sidecars take it for that fault (:meth:`Fleet.judged_against`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import yaml

from demo.calibration import (
    OVERLOAD_OUTPUT,
    OVERLOAD_PER_BATCH,
    OVERLOAD_WORDS,
    run_calibrate,
    tokens_per_word,
)
from demo.local_stack import CONFIG, INTERVAL, alertmanager_config
from demo.stack import (
    REPO,
    VLLM_ARGS,
    Alertmanager,
    Inferwatch,
    Process,
    Prometheus,
    Proxy,
    StackError,
    VllmServer,
    WebhookReceiver,
    free_port,
    http_get,
    metric_value,
)
from demo.traffic import complete_many
from inferwatch.method.spec import seconds, spec_from_config
from inferwatch.settings import load_config_file
from inferwatch.tools.generate import write

ROUTER = Path(os.environ.get("INFERWATCH_VLLM_ROUTER", REPO / ".venv-vllm" / "bin" / "vllm-router"))
POLICY = "round_robin"
# The severities the fleet's alerts page or ticket with: the alerts on a replica's speed
# judge with uncalibrated defaults here (severity info), never with this machine's speed.
JUDGED = ("warning", "critical")
# Tokens each fault client's request generates: long enough that its request is in flight
# most of the time (its own turnaround does not empty the batch).
CLIENT_OUTPUT = 64

Fault = Callable[["Fleet", asyncio.Event], Awaitable[None]]


class Router:
    """``vllm-router`` in front of ``workers``, its metrics on a port of their own (both
    picked free as it starts: a replica started before it does not take them meanwhile)."""

    def __init__(self, workdir: Path, workers: list[str]) -> None:
        self.workdir, self.workers = workdir, workers
        self.port = self.metrics_port = 0
        self.process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def start(self, timeout: float = 120.0) -> Router:
        self.port, self.metrics_port = free_port(), free_port()
        argv = [
            str(ROUTER), "--host", "127.0.0.1", "--port", str(self.port),
            "--worker-urls", *self.workers, "--policy", POLICY, "--disable-circuit-breaker",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
        ]  # fmt: skip
        self.process = Process("vllm-router", argv, self.workdir / "router.log").start()
        self.process.wait_http(f"{self.metrics_url}/metrics", timeout)
        self.process.wait_http(f"{self.url}/health", timeout)
        return self

    def _read(self, name: str, worker: str, more: str = "") -> float:
        page = http_get(f"{self.metrics_url}/metrics")[1].decode()
        try:
            return metric_value(page, name, f'worker="{worker}"{more}')
        except KeyError:
            return 0.0

    def health(self, worker: str) -> float:
        """The router's own health check of ``worker`` (1 passes, 0 failed)."""
        return self._read("vllm_router_worker_health", worker)

    def successes(self, worker: str) -> float:
        """The requests ``worker`` has answered the router."""
        return self._read("vllm_router_cb_outcomes_total", worker, ',outcome="success"')

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


class Fleet:
    """Replicas ``a`` (given: the session's vLLM) and ``b`` (started here), the router,
    three sidecars, Prometheus, Alertmanager and the webhook receiver."""

    def __init__(self, workdir: Path, a: VllmServer) -> None:
        self.workdir = workdir
        config = load_config_file(CONFIG)
        config["canary"] = "off"  # a replica's clients come through the router
        self.config = workdir / "inferwatch.yaml"
        workdir.mkdir(parents=True, exist_ok=True)
        self.config.write_text(yaml.safe_dump(config))
        self.spec = spec_from_config(config)
        self.replicas = {"a": a, "b": VllmServer(workdir / "b")}
        self.proxy = Proxy(workdir / "b-proxy", self.replicas["b"].url)
        # Each replica as the router and its sidecar reach it.
        self.workers = {"a": a.url, "b": self.proxy.url}
        self.router = Router(workdir / "router", list(self.workers.values()))
        self.receiver = WebhookReceiver()
        self.sidecars: dict[str, Inferwatch] = {}
        self.prometheus: Prometheus | None = None
        self.alertmanager: Alertmanager | None = None
        self.killed_at: float | None = None  # when replica_killed killed b (monotonic)

    def start(self) -> Fleet:
        # The proxy first: its port, picked free when the fleet was made, is not left for a
        # replica's own sockets to take meanwhile.
        self.proxy.start()
        for replica in self.replicas.values():
            replica.ensure_running()
        self.router.start()
        for name, url in self.workers.items():
            self.sidecars[name] = self._sidecar(name, url, "vllm")
        self.sidecars["router"] = self._sidecar("router", self.router.metrics_url, "vllm-router")
        write(self.workdir, self.spec)
        self.receiver.start()
        am_config = self.workdir / "alertmanager.yml"
        example = self.workdir / "alerts" / "alertmanager.example.yml"
        am_config.write_text(yaml.safe_dump(alertmanager_config(example, self.receiver.url)))
        self.alertmanager = Alertmanager(self.workdir, am_config).start()
        self.prometheus = Prometheus(
            self.workdir,
            [f"127.0.0.1:{s.port}" for s in self.sidecars.values()],
            rule_files=[self.workdir / "alerts" / "inferwatch-rules.yaml"],
            alertmanager=f"127.0.0.1:{self.alertmanager.port}",
            interval=INTERVAL,
        ).start()
        return self

    def _sidecar(
        self, name: str, url: str, backend: str, more: tuple[str, ...] = (), port: int | None = None
    ) -> Inferwatch:
        args = ["--backend", backend, "--config", str(self.config), *more]
        return Inferwatch(self.workdir / f"sidecar-{name}", url, args, port).start()

    def calibrate(self) -> Path:
        """``inferwatch calibrate`` of the fleet through its router, as a user of like
        replicas runs it: the traffic through the router, replica ``a`` watched past it
        (``--replica-url``); returns the baseline file it wrote, one replica's share of what
        the fleet carried, for every replica's sidecar."""
        workdir = self.workdir / "calibrated"
        workdir.mkdir(exist_ok=True)
        replicas = len(self.replicas)
        flags = ["--replicas", str(replicas), "--replica-url", self.workers["a"]]
        per_word = asyncio.run(tokens_per_word(self.router.url))
        out = run_calibrate(self.router.url, self.config, workdir, per_word, flags, replicas)
        return Path(load_config_file(out)["baseline"])

    @contextlib.contextmanager
    def judged_against(self, baseline: Path) -> Iterator[None]:
        """The replicas' sidecars restarted on their ports with ``--baseline`` (the capacity
        ticket judges with it), and without it again after."""
        self._restart_replicas_sidecars(("--baseline", str(baseline)))
        try:
            yield
        finally:
            self._restart_replicas_sidecars(())

    def _restart_replicas_sidecars(self, more: tuple[str, ...]) -> None:
        for name, url in self.workers.items():
            port = self.sidecars[name].port
            self.sidecars[name].stop()
            self.sidecars[name] = self._sidecar(name, url, "vllm", more, port)

    def settle(self, timeout: float = 300) -> None:
        """Until Prometheus has held no alert above info for a rate window: the last fault's
        requests have left the windows the next one is judged over, and the router has put
        back a replica it took out (its health check passing twice, a minute apart)."""
        assert self.prometheus is not None
        deadline, since = time.monotonic() + timeout, time.monotonic()
        while time.monotonic() - since < self.spec.window_seconds + 1:
            held = [a for a in self.prometheus.alerts() if a["labels"]["severity"] in JUDGED]
            if held:
                since = time.monotonic()
            if time.monotonic() > deadline:
                names = sorted({a["labels"]["alertname"] for a in held})
                raise StackError(f"alerts still held after {timeout:g} s: {', '.join(names)}")
            time.sleep(1)

    def instance(self, name: str) -> str:
        """The ``instance`` label Prometheus gives the sidecar of replica ``name``."""
        return f"127.0.0.1:{self.sidecars[name].port}"

    def stop(self) -> None:
        """Stop what this fleet started; the session's replica ``a`` stays up."""
        for component in (
            self.prometheus,
            self.alertmanager,
            *self.sidecars.values(),
            self.router,
            self.proxy,
            self.replicas["b"],
        ):
            if component is not None:
                with contextlib.suppress(Exception):
                    component.stop()
        self.receiver.stop()


def batch() -> int:
    """The replicas' batch: ``--max-num-seqs`` of the arguments they run with."""
    return int(VLLM_ARGS[VLLM_ARGS.index("--max-num-seqs") + 1])


async def pinned_clients(fleet: Fleet, stop: asyncio.Event) -> None:
    """Twice the replicas' batch in clients that all hold replica ``a``'s address rather
    than the router's (an endpoint list cached before the router came, a sticky route): a
    queue on ``a`` while ``b`` has room, whatever the router's policy."""
    await complete_many(
        fleet.replicas["a"].url,
        stop,
        clients=2 * batch(),
        prompt_words=8,
        max_tokens=CLIENT_OUTPUT,
    )


async def replica_killed(fleet: Fleet, stop: asyncio.Event) -> None:
    """Replica ``b`` killed (its whole process group) under traffic through the router:
    prompts of their own, which the policy spreads over both replicas."""
    traffic = asyncio.create_task(
        complete_many(fleet.router.url, stop, clients=4, prompt_words=8, max_tokens=16)
    )
    # Until b has answered the router and Prometheus has scraped that: a replica's tries
    # and successes are counted from its first request and its first answer.
    b = fleet.workers["b"]
    while fleet.router.successes(b) < 1 and not stop.is_set():
        await asyncio.sleep(0.5)
    await asyncio.sleep(2 * seconds(INTERVAL))
    process = fleet.replicas["b"].process
    assert process is not None and process.popen is not None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    fleet.killed_at = time.monotonic()
    await asyncio.to_thread(process.popen.wait)  # reap it
    await stop.wait()
    await traffic


async def health_check_failed(fleet: Fleet, stop: asyncio.Event) -> None:
    """Replica ``b``'s health endpoint fails (503 from its proxy: a probe path that is wrong,
    a health route that times out under load) while its server serves everything else: the
    router's health check takes out a replica that answers. Two clients through the router
    meanwhile. The router puts ``b`` back after its health check passes again."""
    traffic = asyncio.create_task(
        complete_many(fleet.router.url, stop, clients=2, prompt_words=8, max_tokens=16)
    )
    await asyncio.to_thread(fleet.proxy.set_fault, 0.0, 503, "/health")
    try:
        await stop.wait()
    finally:
        await asyncio.to_thread(fleet.proxy.set_fault)
        await traffic


async def fleet_overloaded(fleet: Fleet, stop: asyncio.Event) -> None:
    """Four times the batch of every replica in clients through the router (the single
    server's overload, once per replica): the policy spreads them, and every replica is
    past its share of the capacity at once."""
    await complete_many(
        fleet.router.url, stop, clients=OVERLOAD_PER_BATCH * batch() * len(fleet.replicas),
        prompt_words=OVERLOAD_WORDS, max_tokens=OVERLOAD_OUTPUT,
    )  # fmt: skip


FAULTS: tuple[tuple[str, Fault, str], ...] = (
    ("clients pinned to replica a", pinned_clients, "InferenceReplicaImbalance"),
    ("replica b's health check failing", health_check_failed, "InferenceRouterExcludesLiveWorker"),
    ("the whole fleet overloaded", fleet_overloaded, "InferenceNearCapacity"),
    ("replica b killed under traffic", replica_killed, "InferenceRouterFailingWorker"),
)
# The faults judged against the fleet's calibrated baseline.
CALIBRATED = (fleet_overloaded,)


async def _run(fleet: Fleet, fault: Fault, expect: str, timeout: float = 300) -> float | None:
    """The fault until ``expect`` reaches the webhook; then ``diagnose --prometheus``, as
    on-call would run it, with the fault still on. Seconds from onset, None if it never came."""
    assert fleet.prometheus is not None
    already, stop, began = len(fleet.receiver.notifications), asyncio.Event(), time.monotonic()
    task = asyncio.create_task(fault(fleet, stop))
    try:
        while time.monotonic() - began < timeout and not task.done():
            names = {a["labels"]["alertname"] for _, a in fleet.receiver.firing(since=already)}
            if expect in names:
                took = time.monotonic() - began
                print(f"{expect} reached Alertmanager {took:.1f} s after the fault began\n")
                argv = [sys.executable, "-m", "inferwatch", "diagnose"]
                argv += ["--prometheus", fleet.prometheus.url, "--config", str(fleet.config)]
                diagnose = await asyncio.create_subprocess_exec(*argv)
                await diagnose.wait()
                return took
            await asyncio.sleep(0.5)
        return None
    finally:
        stop.set()
        await task


def main() -> int:
    """``make demo-fleet``: the fleet started, each fault run until its alert arrives, and
    what ``inferwatch diagnose --prometheus`` says then."""
    workdir = Path(tempfile.mkdtemp(prefix="inferwatch-fleet-"))
    print(f"starting two vLLM replicas, vllm-router, three sidecars, Prometheus and "
          f"Alertmanager; logs in {workdir} ...")  # fmt: skip
    fleet = Fleet(workdir, VllmServer(workdir / "a"))
    took: dict[str, float | None] = {}
    try:
        fleet.start()
        assert fleet.prometheus is not None
        print(f"  Prometheus {fleet.prometheus.url}/alerts   router {fleet.router.url}")
        for name, fault, expect in FAULTS:
            fleet.settle()
            judged = contextlib.nullcontext()
            if fault in CALIBRATED:
                print("\ncalibrating the fleet through its router (`inferwatch calibrate`) ...")
                judged = fleet.judged_against(fleet.calibrate())
            with judged:
                fleet.settle()
                print(f"\n== {name}: expect {expect}")
                took[name] = asyncio.run(_run(fleet, fault, expect))
    except KeyboardInterrupt:
        print("\ninterrupted: stopping everything the demo started")
        return 130
    except StackError as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    finally:
        fleet.stop()
        fleet.replicas["a"].stop()
    print("\nfault -> alert received at Alertmanager's webhook:")
    for (name, _, expect), after in zip(FAULTS, took.values(), strict=False):
        print(f"  {name:32} {expect:30} " + ("never" if after is None else f"{after:.1f} s"))
    return 0 if len(took) == len(FAULTS) and None not in took.values() else 1


if __name__ == "__main__":
    raise SystemExit(main())
