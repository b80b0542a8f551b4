"""``inferwatch serve``: its options and how they assemble the exporter."""

from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from inferwatch.baseline import load as load_baseline
from inferwatch.capture.capturer import CaptureSettings
from inferwatch.capture.store import CaptureStore
from inferwatch.collect.backends import BACKENDS
from inferwatch.collect.canary import CanarySettings
from inferwatch.collect.canary import describe as describe_canary
from inferwatch.collect.derive import weights_bytes_in
from inferwatch.collect.gpu import GpuSource, GpuUnavailable
from inferwatch.collect.poller import DEFAULT_MAX_SERIES, Poller, PollSettings
from inferwatch.collect.upstream import Upstream
from inferwatch.method.alerts import ALERTS
from inferwatch.method.spec import Spec, spec_from_config
from inferwatch.serve.sidecar import make_app
from inferwatch.serve.webconfig import WebConfig, host_names
from inferwatch.serve.webconfig import load as load_web_config
from inferwatch.settings import (
    ConfigError,
    Option,
    bounded_float,
    bounded_int,
    existing_dir,
    existing_file,
    header_line,
    http_url,
    listen_address,
    positive_float,
    positive_int,
    ratio,
    read_secret,
)
from inferwatch.urls import redact_url

log = logging.getLogger("inferwatch")

DEFAULT_PORT = 10177


def alert_list(text: str) -> tuple[str, ...]:
    """Comma-separated alert names of the alert table."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in ALERTS]
    if unknown:
        raise ValueError(f"not an inferwatch alert: {', '.join(unknown)}")
    return names


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
        bounded_float(0.01, 60),
        2.0,
        "seconds to wait for the backend's /metrics",
        metavar="S",
    ),
    Option(
        "--backend-bearer-token-file",
        existing_file,
        None,
        "file with a bearer token sent to the backend as Authorization (read at start)",
        metavar="FILE",
    ),
    Option(
        "--backend-header",
        header_line,
        None,
        "one more header sent to the backend, e.g. 'X-Api-Key: ...' (never logged)",
        metavar="'NAME: VALUE'",
    ),
    Option(
        "--backend-max-bytes",
        positive_int,
        16 * 1024 * 1024,
        "largest /metrics body accepted",
        metavar="N",
    ),
    Option(
        "--backend-max-series",
        positive_int,
        DEFAULT_MAX_SERIES,
        "most samples of mapped families a page may hold; a bigger page marks the backend down",
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
        "--web.config.file",
        existing_file,
        None,
        "TLS, basic auth and response headers, in the Prometheus exporter-toolkit format",
        metavar="FILE",
    ),
    Option(
        "--web.allowed-host",
        host_names,
        None,
        "the only Host names (or addresses) answered, against DNS rebinding; /healthz answers "
        "any (comma-separated, no port; default: any Host)",
        metavar="NAME,...",
        many=True,
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
        "peak bandwidth in bytes/s of the memory one engine's weights are spread over "
        "(default: from NVML, the engine's GPUs)",
        metavar="B_PER_S",
    ),
    Option(
        "--tensor-parallel-size",
        positive_int,
        None,
        "GPUs one engine's weights are spread over; engine k (in engine-label order) uses "
        "GPUs [k*N, (k+1)*N) of those NVML sees (default: visible GPUs / engines)",
        metavar="N",
    ),
    Option(
        "--baseline",
        existing_file,
        None,
        "baseline file from `inferwatch baseline`",
        metavar="FILE",
    ),
    Option(
        "--canary",
        str,
        "off",
        "send small streamed requests of our own and time them client side (the canary_* series)",
        choices=("off", "on"),
    ),
    Option(
        "--canary-url",
        http_url,
        None,
        "OpenAI API base the canary's requests go to: the server's, or any URL the traffic "
        "goes through, e.g. the ingress (default: the backend URL's scheme, host and port)",
        metavar="URL",
    ),
    Option(
        "--canary-interval",
        bounded_float(0.1, 3600),
        15.0,
        "seconds between canary probes (doubling after each failure, up to 120 s, until "
        "the server is seen up again)",
        metavar="S",
    ),
    Option(
        "--canary-model",
        str,
        None,
        "model the canary asks for (default: the model the backend's page names)",
        metavar="NAME",
    ),
    Option(
        "--canary-prompt-tokens",
        bounded_int(1, 100_000),
        8,
        "prompt length of a canary probe, in words (about one token each)",
        metavar="N",
    ),
    Option(
        "--canary-output-tokens",
        bounded_int(1, 10_000),
        8,
        "tokens a canary probe asks for (exactly, where the server allows it)",
        metavar="N",
    ),
    Option(
        "--canary-api",
        str,
        "completions",
        "OpenAI API the canary uses",
        choices=("completions", "chat"),
    ),
    Option(
        "--canary-timeout",
        bounded_float(0.1, 600),
        10.0,
        "seconds a canary probe may take in all before it counts as a timeout",
        metavar="S",
    ),
    Option(
        "--canary-bearer-token-file",
        existing_file,
        None,
        "file with a bearer token the canary sends as Authorization (read at start)",
        metavar="FILE",
    ),
    Option(
        "--capture-dir",
        Path,
        None,
        "folder for evidence captures (profiler trace, stacks, pages): new, empty or one it "
        "made; turns on POST /capture and GET /captures, which need basic auth or client "
        "certificates unless the exporter listens on loopback only (default: captures off)",
        metavar="DIR",
    ),
    Option(
        "--capture-on",
        alert_list,
        None,
        "cause alerts whose condition, held on the verdict for the alert's `for`, starts a "
        "capture (comma-separated; default: none, capture on request only)",
        metavar="ALERT,...",
        many=True,
    ),
    Option(
        "--capture-seconds",
        bounded_float(1, 120),
        10.0,
        "seconds a capture profiles and samples stacks for",
        metavar="S",
    ),
    Option(
        "--capture-min-interval",
        bounded_float(0, 7 * 86400),
        600.0,
        "least seconds between the starts of two captures",
        metavar="S",
    ),
    Option(
        "--capture-max-bytes",
        positive_int,
        1024**3,
        "most bytes the capture folder holds, a capture in flight and its archive included "
        "(the oldest captures deleted first)",
        metavar="N",
    ),
    Option(
        "--capture-profiler-dir",
        existing_dir,
        None,
        "the folder the server's profiler writes its traces to, as mounted here (vLLM: "
        "torch_profiler_dir; SGLang: SGLANG_TORCH_PROFILER_DIR); without it no trace is taken",
        metavar="DIR",
    ),
    Option(
        "--capture-profiler-steps",
        bounded_int(1, 100_000),
        100,
        "engine steps the server's profiler records at most (vLLM: max_iterations); the "
        "server writes the trace in its stop call, minutes for a big one",
        metavar="N",
    ),
    Option(
        "--capture-pid",
        positive_int,
        None,
        "the server's process for py-spy (default: the one listening on the backend URL's port)",
        metavar="PID",
    ),
    Option("--log.level", str, "info", "log level", choices=("debug", "info", "warning", "error")),
)


def _has_credentials(url: str) -> bool:
    """Whether ``url`` carries a ``user:password@`` (sent as basic auth)."""
    return urlsplit(url).username is not None


def _one_authorization(header: str, *sources: tuple[str, bool]) -> None:
    """ConfigError when more than one of the ``(flag, given)`` sources sets ``header``."""
    given = [flag for flag, on in sources if on]
    if len(given) > 1:
        raise ConfigError(f"{header} is set by {' and '.join(given)}; give one")


@dataclass(frozen=True)
class ServeConfig:
    backend: str
    backend_url: str
    backend_timeout: float
    backend_bearer_token_file: Path | None
    backend_header: tuple[str, str] | None = field(repr=False)  # may hold a secret
    backend_max_bytes: int
    backend_max_series: int
    web_listen_address: tuple[str, int]
    web_config_file: Path | None
    poll_interval: float
    gpu: str
    idle_threshold: float
    model_weights_bytes: int | None
    model_path: Path | None
    peak_memory_bandwidth: float | None
    tensor_parallel_size: int | None
    baseline: Path | None
    log_level: str
    canary: str = "off"
    canary_url: str | None = None
    canary_interval: float = 15.0
    canary_model: str | None = None
    canary_prompt_tokens: int = 8
    canary_output_tokens: int = 8
    canary_api: str = "completions"
    canary_timeout: float = 10.0
    canary_bearer_token_file: Path | None = None
    capture_dir: Path | None = None
    capture_on: tuple[str, ...] | None = None
    capture_seconds: float = 10.0
    capture_min_interval: float = 600.0
    capture_max_bytes: int = 1024**3
    capture_profiler_dir: Path | None = None
    capture_profiler_steps: int = 100
    capture_pid: int | None = None
    web_allowed_host: tuple[str, ...] | None = None

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> ServeConfig:
        config = cls(**values)
        if config.model_weights_bytes and config.model_path:
            raise ConfigError("give --model-weights-bytes or --model-path, not both")
        _one_authorization(
            "the Authorization header",
            ("--backend-url user:password@", _has_credentials(config.backend_url)),
            ("--backend-bearer-token-file", config.backend_bearer_token_file is not None),
            (
                "--backend-header Authorization",
                config.backend_header is not None
                and config.backend_header[0].lower() == "authorization",
            ),
        )
        if config.canary == "on":  # its default URL keeps the backend URL's user:password@
            _one_authorization(
                "the canary's Authorization header",
                (
                    f"{'--canary-url' if config.canary_url else '--backend-url'} user:password@",
                    _has_credentials(config.canary_url or config.backend_url),
                ),
                ("--canary-bearer-token-file", config.canary_bearer_token_file is not None),
            )
        if config.capture_dir is None and (config.capture_on or config.capture_profiler_dir):
            raise ConfigError("--capture-on and --capture-profiler-dir need --capture-dir")
        if config.capture_dir is not None:  # the folder must be usable before anything starts
            try:
                CaptureStore(config.capture_dir, config.capture_max_bytes).open()
            except OSError as exc:
                raise ConfigError(f"--capture-dir {config.capture_dir}: {exc.strerror}") from None
            except ValueError as exc:
                raise ConfigError(f"--capture-dir {config.capture_dir}: {exc}") from None
        return config

    def capture_settings(self) -> CaptureSettings | None:
        """The captures' settings (None when off)."""
        if self.capture_dir is None:
            return None
        return CaptureSettings(
            directory=self.capture_dir,
            on=self.capture_on or (),
            seconds=self.capture_seconds,
            min_interval=self.capture_min_interval,
            max_bytes=self.capture_max_bytes,
            profiler_dir=self.capture_profiler_dir,
            profiler_steps=self.capture_profiler_steps,
            pid=self.capture_pid,
        )

    def backend_headers(self) -> dict[str, str]:
        """Extra headers for every backend request; reads the token file (ConfigError)."""
        headers = {}
        if self.backend_bearer_token_file is not None:
            headers["Authorization"] = f"Bearer {read_secret(self.backend_bearer_token_file)}"
        if self.backend_header is not None:
            name, value = self.backend_header
            headers[name] = value
        return headers

    def canary_settings(self, gap_window: float | None = None) -> CanarySettings | None:
        """The canary's settings (None when off); reads its token file (ConfigError).

        ``gap_window``: seconds the TTFT gap is measured over (the rules' rate window)."""
        if self.canary != "on":
            return None
        token = None
        if self.canary_bearer_token_file is not None:
            token = read_secret(self.canary_bearer_token_file)
        url = self.canary_url or Upstream(self.backend_url, timeout=1, max_bytes=1).origin()
        return CanarySettings(
            url=url,
            api=self.canary_api,
            model=self.canary_model or None,
            interval=self.canary_interval,
            timeout=self.canary_timeout,
            prompt_tokens=self.canary_prompt_tokens,
            output_tokens=self.canary_output_tokens,
            api_key=token,
            gap_window=gap_window,
        )

    def weight_bytes(self) -> int | None:
        if self.model_path is not None:
            try:
                return weights_bytes_in(self.model_path)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        return self.model_weights_bytes


def build_poller(config: ServeConfig, latency_window: float = 300.0) -> Poller:
    """Wire backend, GPU source and poller from the settings; ConfigError on bad input.
    ``latency_window`` is the rules' rate window, in seconds.

    Every check comes before the first log line, so bad input is one line on stderr.
    """
    headers = config.backend_headers()
    weight_bytes = config.weight_bytes()
    baseline = load_baseline(config.baseline) if config.baseline is not None else None
    upstream = Upstream(
        config.backend_url,
        timeout=config.backend_timeout,
        max_bytes=config.backend_max_bytes,
        headers=headers,
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
    if headers:
        log.info("sending header(s) %s to the backend", ", ".join(headers))
    backend = None if config.backend == "auto" else BACKENDS[config.backend]
    settings = PollSettings(
        interval=config.poll_interval,
        idle_threshold=config.idle_threshold,
        model_weights_bytes=weight_bytes,
        peak_memory_bandwidth=config.peak_memory_bandwidth,
        tensor_parallel_size=config.tensor_parallel_size,
        baseline=baseline,
        max_series=config.backend_max_series,
        latency_window=latency_window,
    )
    return Poller(upstream, backend, gpu, settings)


def listen(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to ``host:port`` (every interface when ``host`` is empty), like aiohttp's.

    Bound before anything starts, so that a taken or unknown address is a one-line start-up
    error (ConfigError) instead of a failure after the poller has begun.
    """
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        ):
            try:
                sock = socket.socket(family, kind, proto)
            except OSError:
                continue  # an address family this host lacks (e.g. IPv6 off), as asyncio does
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        reason = exc.strerror or str(exc)
        raise ConfigError(f"--web.listen-address {host or '*'}:{port}: {reason}") from None
    return sockets


def require_capture_auth(web_config: WebConfig | None, sockets: list[socket.socket]) -> None:
    """ConfigError unless only an authenticated client (basic auth, or a verified client
    certificate) or this host can reach the listener: whoever reaches ``POST /capture`` can
    take a capture, the server's stacks, pages and trace, and download it."""
    if web_config is not None and (
        web_config.users is not None
        or (web_config.tls is not None and web_config.tls.client_auth == ssl.CERT_REQUIRED)
    ):
        return
    if all(ipaddress.ip_address(s.getsockname()[0]).is_loopback for s in sockets):
        return
    raise ConfigError(
        "--capture-dir needs authentication: a capture holds the server's stacks, pages and "
        "trace; give a --web.config.file with basic_auth_users or client certificates "
        "(client_auth_type: RequireAndVerifyClientCert), or listen on loopback only "
        "(--web.listen-address 127.0.0.1:PORT)"
    )


def warn_if_others_can_write(path: Path, flag: str, changes: str) -> None:
    """A start-up warning when ``path`` is writable by its group or by others, who could
    then change ``changes``."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        log.warning(
            "%s %s is writable by its group or by others (mode %03o): they can change %s; "
            "make it writable by this user only (chmod go-w)",
            flag,
            path,
            stat.S_IMODE(mode),
            changes,
        )


def run(config: ServeConfig, spec: Spec | None = None) -> None:
    """Serve until a signal; ``spec`` (default: the defaults) is the verdict's and sets the
    window of the canary's TTFT gap and of the latency quantiles."""
    spec = spec_from_config({}) if spec is None else spec
    web_config = None
    if config.web_config_file is not None:
        web_config = load_web_config(config.web_config_file)
    ssl_context = web_config.ssl_context() if web_config is not None else None
    host, port = config.web_listen_address
    sockets = listen(host, port)
    if config.capture_dir is not None:
        require_capture_auth(web_config, sockets)
    canary_settings = config.canary_settings(gap_window=spec.window_seconds)
    capture = config.capture_settings()
    poller = build_poller(config, spec.window_seconds)
    log.info(
        "serving on %s:%d (%s), polling %s backend at %s every %g s",
        host or "*",
        port,
        "plain HTTP" if web_config is None else web_config.describe(),
        config.backend,
        redact_url(config.backend_url),
        config.poll_interval,
    )
    app = make_app(
        poller,
        web_config=web_config,
        spec=spec,
        capture=capture,
        canary=canary_settings,
        allowed_hosts=config.web_allowed_host or (),
    )
    if config.web_config_file is not None:
        warn_if_others_can_write(config.web_config_file, "--web.config.file", "who is let in")
    if capture is not None:
        log.info(
            "evidence capture into %s (on %s; %g s each, at most one per %g s)",
            capture.directory,
            ", ".join(capture.on) or "request only",
            capture.seconds,
            capture.min_interval,
        )
        warn_if_others_can_write(
            capture.directory, "--capture-dir", "what lies beside the archives"
        )
    if canary_settings is not None:
        log.info("%s", describe_canary(canary_settings, redact_url))
    web.run_app(
        app,
        sock=sockets,
        ssl_context=ssl_context,
        print=None,
        access_log=None,
        handle_signals=True,
    )
