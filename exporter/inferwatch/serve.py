"""``inferwatch serve``: its options and how they assemble the exporter."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from inferwatch.backends import BACKENDS
from inferwatch.baseline import load as load_baseline
from inferwatch.derive import weights_bytes_in
from inferwatch.gpu import GpuSource, GpuUnavailable
from inferwatch.poller import Poller, PollSettings
from inferwatch.settings import (
    ConfigError,
    Option,
    bounded_float,
    existing_dir,
    existing_file,
    http_url,
    listen_address,
    positive_float,
    positive_int,
    ratio,
)
from inferwatch.upstream import Upstream, redact_url
from inferwatch.web import make_app

log = logging.getLogger("inferwatch")

DEFAULT_PORT = 9477

OPTIONS = (
    Option(
        "--backend",
        str,
        "auto",
        "inference server kind; auto recognises it from its /metrics page",
        choices=("auto", *BACKENDS),
    ),
    Option(
        "--backend-url",
        http_url,
        "http://127.0.0.1:8000",
        "base URL of the server (or its full metrics URL)",
        metavar="URL",
    ),
    Option(
        "--backend-timeout",
        positive_float,
        2.0,
        "seconds to wait for the backend's /metrics",
        metavar="S",
    ),
    Option(
        "--backend-max-bytes",
        positive_int,
        16 * 1024 * 1024,
        "largest /metrics body accepted",
        metavar="N",
    ),
    Option(
        "--web.listen-address",
        listen_address,
        f":{DEFAULT_PORT}",
        "address to serve /metrics on",
        metavar="HOST:PORT",
    ),
    Option(
        "--poll-interval",
        bounded_float(0.05, 60),
        0.5,
        "seconds between polls of backend and GPUs",
        metavar="S",
    ),
    Option(
        "--gpu",
        str,
        "auto",
        "NVML: auto = use if present; on = required (exit if absent); off",
        choices=("auto", "on", "off"),
    ),
    Option(
        "--idle-threshold",
        ratio,
        0.1,
        "GPU busy share below which a GPU counts as idle",
        metavar="RATIO",
    ),
    Option(
        "--model-weights-bytes",
        positive_int,
        None,
        "model weight bytes, for the decode floor",
        metavar="N",
    ),
    Option(
        "--model-path",
        existing_dir,
        None,
        "model directory; its *.safetensors sizes give the weight bytes",
        metavar="DIR",
    ),
    Option(
        "--peak-memory-bandwidth",
        positive_float,
        None,
        "aggregate peak memory bandwidth in bytes/s (default: from NVML)",
        metavar="B_PER_S",
    ),
    Option(
        "--baseline",
        existing_file,
        None,
        "baseline file from `inferwatch baseline`",
        metavar="FILE",
    ),
    Option("--log.level", str, "info", "log level", choices=("debug", "info", "warning", "error")),
)


@dataclass(frozen=True)
class ServeConfig:
    backend: str
    backend_url: str
    backend_timeout: float
    backend_max_bytes: int
    web_listen_address: tuple[str, int]
    poll_interval: float
    gpu: str
    idle_threshold: float
    model_weights_bytes: int | None
    model_path: Path | None
    peak_memory_bandwidth: float | None
    baseline: Path | None
    log_level: str

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> ServeConfig:
        config = cls(**values)
        if config.model_weights_bytes and config.model_path:
            raise ConfigError("give --model-weights-bytes or --model-path, not both")
        return config

    def weight_bytes(self) -> int | None:
        if self.model_path is not None:
            try:
                return weights_bytes_in(self.model_path)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        return self.model_weights_bytes


def build_poller(config: ServeConfig) -> Poller:
    """Wire backend, GPU source and poller from the settings; ConfigError on bad input."""
    upstream = Upstream(
        config.backend_url, timeout=config.backend_timeout, max_bytes=config.backend_max_bytes
    )
    gpu = None
    if config.gpu != "off":
        gpu = GpuSource()
        try:
            gpu.start()
        except GpuUnavailable as exc:
            if config.gpu == "on":
                raise ConfigError(f"--gpu on: {exc}") from None
            log.info("no GPU metrics (%s); idle is judged from engine progress", exc)
    backend = None if config.backend == "auto" else BACKENDS[config.backend]
    settings = PollSettings(
        interval=config.poll_interval,
        idle_threshold=config.idle_threshold,
        model_weights_bytes=config.weight_bytes(),
        peak_memory_bandwidth=config.peak_memory_bandwidth,
        baseline=load_baseline(config.baseline) if config.baseline is not None else None,
    )
    return Poller(upstream, backend, gpu, settings)


def run(config: ServeConfig) -> None:
    poller = build_poller(config)
    host, port = config.web_listen_address
    log.info(
        "serving on %s:%d, polling %s backend at %s every %g s",
        host or "*",
        port,
        config.backend,
        redact_url(config.backend_url),
        config.poll_interval,
    )
    web.run_app(
        make_app(poller),
        host=host or None,
        port=port,
        print=None,
        access_log=None,
        handle_signals=True,
    )
