"""The real local stack, as plain processes on loopback: vLLM (CPU), inferwatch, Prometheus,
Alertmanager and a webhook receiver. Used by ``make demo`` and by the tests that need real
components.

This module holds the serving side: the tiny model, vLLM serving it, ``inferwatch serve``
beside it and the proxy in front. The rest is imported from here too:
:mod:`demo.processes` (child processes and loopback HTTP), :mod:`demo.alerting`
(Prometheus, Alertmanager, the webhook receiver), :mod:`demo.browser` (headless Chromium).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from demo.alerting import Alertmanager, Prometheus, WebhookReceiver
from demo.browser import chromium
from demo.processes import (
    Process,
    StackError,
    children_of,
    free_port,
    http_get,
    http_json,
    metric_value,
)

__all__ = [
    "CACHE",
    "MODEL_NAME",
    "REPO",
    "VLLM_ARGS",
    "VLLM_NICENESS",
    "VLLM_PYTHON",
    "Alertmanager",
    "Inferwatch",
    "Process",
    "Prometheus",
    "Proxy",
    "StackError",
    "VllmServer",
    "WebhookReceiver",
    "children_of",
    "chromium",
    "free_port",
    "http_get",
    "http_json",
    "metric_value",
    "tiny_model",
]

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
# (busy polling), and the sidecar, Prometheus and Alertmanager beside it wait for CPU: their
# sleeps overrun, scrapes run past their timeout (InferenceBackendDown) and rule evaluations
# are skipped; at a lower priority for the server, they get the CPU when they need it. In a
# pod the sidecar has a CPU request of its own; a lower priority for the server is that on a
# shared machine. The server still gets every cycle the others leave.
VLLM_NICENESS = 10


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


def tiny_lora(name: str, seed: int, cache: Path = CACHE) -> Path:
    """A random-weight LoRA adapter for the tiny model (``demo/tiny_lora.py``), built on
    first use with the vLLM environment's Python."""
    out = cache / "tiny-lora" / name
    done = out / ".complete"
    recipe = hashlib.sha256((REPO / "demo" / "tiny_lora.py").read_bytes()).hexdigest()
    if not done.exists() or done.read_text().strip() != f"{recipe} {seed}":
        subprocess.run(
            [str(VLLM_PYTHON), str(REPO / "demo" / "tiny_lora.py"), str(out), str(seed)],
            check=True,
            capture_output=True,
            cwd=REPO / "demo",
            timeout=600,
        )
        done.write_text(f"{recipe} {seed}\n")
    return out


class VllmServer:
    """The real vLLM OpenAI server on CPU, serving the tiny model as ``tiny``."""

    def __init__(
        self,
        workdir: Path,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        *,
        traced: bool = False,
    ):
        self.workdir = workdir
        self.extra_args = list(extra_args)
        self.port = port or free_port()
        # With ``traced``, vLLM sends each request's span over OTLP/HTTP to the sidecar that
        # listens on this port (demo/local_stack.py), reserved now: vLLM takes its trace
        # endpoint at start, before any sidecar.
        self.spans_port = free_port() if traced else None
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
        if self.spans_port is not None:  # as docs/exporter.md tells users (gRPC by default)
            argv += ["--otlp-traces-endpoint", f"http://127.0.0.1:{self.spans_port}/v1/traces"]
            env |= {
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                "OTEL_SERVICE_NAME": "vllm",
            }
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

    def set_fault(
        self, delay: float = 0.0, status: int | None = None, path: str | None = None
    ) -> None:
        """Hold each request ``delay`` s, or answer each with ``status`` (with ``path``, only
        the requests for it); none: pass through."""
        body = json.dumps({"delay": delay, "status": status, "path": path}).encode()
        request = urllib.request.Request(f"{self.url}/_fault", data=body, method="PUT")
        with urllib.request.urlopen(request, timeout=5) as resp:
            resp.read()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
