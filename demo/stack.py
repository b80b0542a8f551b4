"""The real local stack, as plain processes on loopback: vLLM (CPU), inferwatch, Prometheus,
Alertmanager and a webhook receiver. Used by ``make demo`` and by the tests that need real
components.

Every process runs in its own session (process group) and is stopped by pid, with SIGTERM
then SIGKILL; readiness is checked over HTTP, never assumed after a sleep.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache"
VLLM_PYTHON = Path(os.environ.get("INFERWATCH_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
MODEL_NAME = "tiny"

# A KV cache of 160 blocks of 32 tokens (5120: a full 4096-token context and a little): a
# batch of 16 requests of a few hundred tokens each overflows it and the scheduler preempts.
VLLM_ARGS = (
    "--num-gpu-blocks-override", "160",
    "--block-size", "32",
    "--max-model-len", "4096",
    "--max-num-seqs", "16",
)  # fmt: skip
# The server runs at this niceness. On one machine its threads hold every core under load
# (measured on 2 cores: the worker ~1 core, the engine core ~0.7, busy polling), and the
# sidecar, Prometheus and Alertmanager beside it waited for CPU: a 10 ms sleep overslept by
# up to 0.6 s, scrapes ran past their 1 s timeout (InferenceBackendDown) and up to 22 rule
# evaluations were skipped in one scenario; at nice 10, at most 3.4 ms, scrapes within 66 ms
# and none skipped over the e2e scenarios. In a pod the sidecar has a CPU request of its own;
# a lower priority for the server is that on a shared machine. The server still gets every
# cycle the others leave.
VLLM_NICENESS = 10


class StackError(RuntimeError):
    """A component failed to start or answer; the message carries its log tail."""


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    """Headless Chromium (Debian's ``chromium``, installed by ``make debs``) with ``args``:
    ``--dump-dom URL`` prints the page as rendered, ``--screenshot=FILE URL`` saves it."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise StackError("no chromium on PATH (make debs installs it)")
    return subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,  # a guard against a hung browser
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_json(url: str, timeout: float = 5.0) -> Any:
    status, body = http_get(url, timeout)
    if status != 200:
        raise StackError(f"GET {url}: HTTP {status}")
    return json.loads(body)


class Process:
    """A child process in its own process group, logging to a file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log: Path,
        env: dict[str, str] | None = None,
        niceness: int = 0,
    ):
        self.name = name
        self.argv = list(argv)
        self.log = log
        self.env = env
        self.niceness = niceness
        self.popen: subprocess.Popen | None = None

    def start(self) -> Process:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        nice = ["nice", "-n", str(self.niceness)] if self.niceness else []  # execs: same pid
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                [*nice, *self.argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(self.env or {})},
                start_new_session=True,
            )
        if self.niceness:
            # Where the kernel groups a session's processes (autogroup, on by default), a
            # process's nice weighs only against its own session's, and each session is
            # weighed as one against the others: the new session's group gets it too.
            with contextlib.suppress(OSError):  # no autogroup in this kernel
                Path(f"/proc/{self.pid}/autogroup").write_text(str(self.niceness))
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the whole group, SIGKILL whatever is left after ``timeout``."""
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # children that ignored SIGTERM
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_http(self, url: str, timeout: float, ok: tuple[int, ...] = (200,)) -> None:
        """Block until ``url`` answers with one of ``ok``, failing fast if the process dies."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise StackError(f"{self.name} exited ({self.popen.returncode}):\n{self.tail()}")
            with contextlib.suppress(OSError, urllib.error.URLError):
                if http_get(url, timeout=2.0)[0] in ok:
                    return
            time.sleep(0.2)
        raise StackError(f"{self.name} not ready at {url} after {timeout:g} s:\n{self.tail()}")


def children_of(pid: int) -> list[tuple[int, str]]:
    """(pid, command name) of the direct children of ``pid``, from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # comm may contain spaces and parentheses; the fields after the last ')' are fixed.
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if ppid == pid:
            out.append((int(entry.name), comm))
    return out


def tiny_model(cache: Path = CACHE) -> Path:
    """The tiny model folder, built on first use with the vLLM environment's Python."""
    out = cache / "tiny-model"
    done = out / ".complete"
    # Rebuilt whenever the recipe changes: the marker holds a digest of the script.
    recipe = hashlib.sha256((REPO / "demo" / "tiny_model.py").read_bytes()).hexdigest()
    if not done.exists() or done.read_text().strip() != recipe:
        if not VLLM_PYTHON.exists():
            raise StackError(f"{VLLM_PYTHON} missing: run `make .venv-vllm` first")
        subprocess.run(
            [str(VLLM_PYTHON), str(REPO / "demo" / "tiny_model.py"), str(out)],
            check=True,
            capture_output=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            timeout=600,
        )
        done.write_text(recipe + "\n")
    return out


class VllmServer:
    """The real vLLM OpenAI server on CPU, serving the tiny model as ``tiny``."""

    def __init__(self, workdir: Path, extra_args: Sequence[str] = (), port: int | None = None):
        self.workdir = workdir
        self.extra_args = list(extra_args)
        self.port = port or free_port()
        self.process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 420.0) -> VllmServer:
        model = tiny_model()
        argv = [
            str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model),
            "--served-model-name", MODEL_NAME,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            *VLLM_ARGS,
            *self.extra_args,
        ]  # fmt: skip
        env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1"}
        log = self.workdir / "vllm.log"
        self.process = Process("vllm", argv, log, env, niceness=VLLM_NICENESS).start()
        self.process.wait_http(f"{self.url}/v1/models", timeout)
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def ensure_running(self) -> VllmServer:
        """Start the server unless it runs (a test may have stopped it on purpose)."""
        return self if self.alive() else self.start()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def engine_core_pid(self) -> int:
        """The ``VLLM::EngineCore`` child of the API server (the process to stall)."""
        assert self.process is not None
        for pid, comm in children_of(self.process.pid):
            if comm.startswith("VLLM::EngineCor"):
                return pid
        raise StackError("no VLLM::EngineCore child process found")

    def metric(self, name: str) -> float:
        """A value straight from vLLM's own /metrics (summed over its series)."""
        return metric_value(http_get(f"{self.url}/metrics")[1].decode(), name)


def metric_value(page: str, name: str, labels: str = "") -> float:
    """Sum of the samples named ``name`` whose label text contains ``labels``."""
    total = 0.0
    found = False
    for line in page.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            if labels and labels not in line:
                continue
            total += float(line.rsplit(" ", 1)[1])
            found = True
    if not found:
        raise KeyError(f"{name}{{{labels}}} not on the page")
    return total


class Inferwatch:
    """``inferwatch serve`` as a separate process, like the sidecar it is."""

    def __init__(
        self, workdir: Path, backend_url: str, args: Sequence[str] = (), port: int | None = None
    ):
        self.workdir = workdir
        self.backend_url = backend_url
        self.args = list(args)
        self.port = port or free_port()
        self.process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> Inferwatch:
        argv = [
            sys.executable, "-m", "inferwatch", "serve",
            "--backend-url", self.backend_url,
            "--web.listen-address", f"127.0.0.1:{self.port}",
            *self.args,
        ]  # fmt: skip
        self.process = Process("inferwatch", argv, self.workdir / "inferwatch.log").start()
        self.process.wait_http(f"{self.url}/healthz", timeout)
        return self

    def page(self) -> str:
        status, body = http_get(f"{self.url}/metrics")
        if status != 200:
            raise StackError(f"inferwatch /metrics: HTTP {status}")
        return body.decode()

    def metric(self, name: str, labels: str = "") -> float:
        return metric_value(self.page(), name, labels)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


class Proxy:
    """``demo/proxy.py`` in front of ``upstream``: the users' path, with a fault switch."""

    def __init__(self, workdir: Path, upstream: str, port: int | None = None):
        self.workdir = workdir
        self.upstream = upstream
        self.port = port or free_port()
        self.process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> Proxy:
        argv = [sys.executable, "-m", "demo.proxy", "--upstream", self.upstream]
        argv += ["--port", str(self.port)]
        env = {
            "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
        }
        self.process = Process("proxy", argv, self.workdir / "proxy.log", env).start()
        self.process.wait_http(f"{self.url}/_fault", timeout)
        return self

    def set_fault(self, delay: float = 0.0, status: int | None = None) -> None:
        """Hold each request ``delay`` s, or answer each with ``status``; none: pass through."""
        body = json.dumps({"delay": delay, "status": status}).encode()
        request = urllib.request.Request(f"{self.url}/_fault", data=body, method="PUT")
        with urllib.request.urlopen(request, timeout=5) as resp:
            resp.read()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


class WebhookReceiver:
    """Records Alertmanager webhook notifications (payload version 4) with arrival times."""

    def __init__(self) -> None:
        self.notifications: list[tuple[float, dict]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                with receiver._lock:
                    receiver.notifications.append((time.monotonic(), body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/alerts"

    def start(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def firing(self, since: int = 0) -> list[tuple[float, dict]]:
        """(arrival time, alert) for every firing alert received (from notification
        number ``since`` on)."""
        with self._lock:
            return [
                (t, alert)
                for t, body in self.notifications[since:]
                for alert in body.get("alerts", [])
                if alert.get("status") == "firing"
            ]


class Prometheus:
    """A real Prometheus (Debian package) scraping inferwatch, with the generated rules."""

    def __init__(
        self,
        workdir: Path,
        targets: Sequence[str],
        rule_files: Sequence[Path] = (),
        alertmanager: str | None = None,
        interval: str = "1s",
        port: int | None = None,
    ):
        self.workdir = workdir
        self.targets = list(targets)
        self.rule_files = list(rule_files)
        self.alertmanager = alertmanager
        self.interval = interval
        self.port = port or free_port()
        self.process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict:
        config: dict[str, Any] = {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [
                {"job_name": "inferwatch", "static_configs": [{"targets": self.targets}]}
            ],
        }
        if self.alertmanager:
            config["alerting"] = {
                "alertmanagers": [{"static_configs": [{"targets": [self.alertmanager]}]}]
            }
        return config

    def start(self, timeout: float = 60.0) -> Prometheus:
        config_file = self.workdir / "prometheus.yml"
        config_file.parent.mkdir(parents=True, exist_ok=True)
        config_file.write_text(json.dumps(self.config(), indent=2))  # JSON is valid YAML
        argv = [
            "prometheus",
            f"--config.file={config_file}",
            f"--storage.tsdb.path={self.workdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        self.process = Process("prometheus", argv, self.workdir / "prometheus.log").start()
        self.process.wait_http(f"{self.url}/-/ready", timeout)
        return self

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """Instant query; raises StackError with Prometheus' message on a bad expression."""
        params = {"query": expr}
        if at is not None:
            params["time"] = str(at)
        return self._api("query", params)

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict]:
        """Range query over [start, end] (Unix time); StackError as for :meth:`query`."""
        return self._api(
            "query_range", {"query": expr, "start": str(start), "end": str(end), "step": str(step)}
        )

    def _api(self, endpoint: str, params: dict[str, str]) -> list[dict]:
        url = f"{self.url}/api/v1/{endpoint}?{urllib.parse.urlencode(params)}"
        status, body = http_get(url, timeout=30.0)
        doc = json.loads(body)
        if status != 200 or doc.get("status") != "success":
            raise StackError(f"query {params['query']!r} failed: {doc.get('error', status)}")
        return doc["data"]["result"]

    def alerts(self) -> list[dict]:
        """Pending and firing alerts. Generous timeout: on two cores shared with vLLM under
        load, an answer can take seconds."""
        return http_json(f"{self.url}/api/v1/alerts", timeout=30.0)["data"]["alerts"]

    def missed_evaluations(self) -> dict[str, float]:
        """Per rule group, the evaluations skipped so far because the one before overran its
        interval (an overloaded machine): each delays that group's results by an interval."""
        page = http_get(f"{self.url}/metrics", timeout=30.0)[1].decode()
        name = "prometheus_rule_group_iterations_missed_total"
        return {
            sample.labels["rule_group"]: sample.value
            for family in text_string_to_metric_families(page)
            for sample in family.samples
            if sample.name == name
        }

    def reload(self, timeout: float = 30.0) -> None:
        """Re-read the config and rule files (SIGHUP); returns once the reload succeeded."""
        assert self.process is not None
        name = "prometheus_config_last_reload_success_timestamp_seconds"
        before = metric_value(http_get(f"{self.url}/metrics")[1].decode(), name)
        os.kill(self.process.pid, signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while metric_value(http_get(f"{self.url}/metrics")[1].decode(), name) <= before:
            if time.monotonic() > deadline:
                raise StackError(
                    f"prometheus did not reload within {timeout:g} s:\n{self.process.tail()}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


class Alertmanager:
    """A real Alertmanager (Debian package) on loopback, no gossip port."""

    def __init__(self, workdir: Path, config_file: Path, port: int | None = None):
        self.workdir = workdir
        self.config_file = config_file
        self.port = port or free_port()
        self.process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> Alertmanager:
        argv = [
            "prometheus-alertmanager",
            f"--config.file={self.config_file}",
            f"--storage.path={self.workdir / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",
        ]
        self.process = Process("alertmanager", argv, self.workdir / "alertmanager.log").start()
        self.process.wait_http(f"{self.url}/-/ready", timeout)
        return self

    def alerts(self) -> list[dict]:
        """Alerts not resolved yet (active, inhibited); a generous timeout, as Prometheus'."""
        return http_json(f"{self.url}/api/v2/alerts", timeout=30.0)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
