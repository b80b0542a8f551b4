"""``inferwatch serve``: assembles the exporter from its settings and serves it."""

from __future__ import annotations

import ctypes
import gc
import ipaddress
import logging
import socket
import ssl
import stat
import sys
from pathlib import Path

from inferwatch.baseline import load as load_baseline
from inferwatch.collect.backends import BACKENDS
from inferwatch.collect.canary import describe as describe_canary
from inferwatch.collect.gpu import GpuSource, GpuUnavailable
from inferwatch.collect.poller import Poller, PollSettings
from inferwatch.collect.server_cpu import ServerCpu
from inferwatch.collect.steps import DEFAULT_KNOWN_STEP
from inferwatch.collect.upstream import Upstream
from inferwatch.method.spec import Spec, spec_from_config
from inferwatch.serve.config import ServeConfig
from inferwatch.serve.listener import connection_cap, open_file_limit, serve
from inferwatch.serve.options import OPTIONS
from inferwatch.serve.sidecar import make_app
from inferwatch.serve.webconfig import MIN_BCRYPT_COST, WebConfig
from inferwatch.serve.webconfig import load as load_web_config
from inferwatch.settings import (
    ConfigError,
)
from inferwatch.urls import redact_url

__all__ = ["OPTIONS", "ServeConfig", "build_poller", "run"]

log = logging.getLogger("inferwatch")

# Seconds a thread holds the GIL before another that waits for it takes it (sys's).
SWITCH_INTERVAL = 0.001
# glibc's malloc raises its mmap threshold whenever a mapped block is freed (up to 32 MiB),
# so once a big page's text has come and gone, the next big buffers are carved from the heap,
# which keeps the memory after they are freed. Held at its default, every block this large
# is a mapping of its own, handed back to the system when freed (see bench/exporter.py's
# huge page). mallopt's parameter number is glibc's M_MMAP_THRESHOLD (malloc.h).
MMAP_THRESHOLD = 128 * 1024
M_MMAP_THRESHOLD = -3
# The garbage collector's thresholds once the start-up objects are frozen: a full collection
# after every 100 collections of the middle generation, not 10 (gc's default). What was made
# to start no longer counts among the long-lived objects that hold full collections back,
# and each one walks every series of a huge page and of the verdict over it, holding the GIL
# while /healthz waits (bench/exporter.py's huge page). Cycles are still collected.
GC_THRESHOLDS = (700, 10, 100)


def hand_big_buffers_back() -> None:
    """Hold glibc's mmap threshold at :data:`MMAP_THRESHOLD`; no-op on another libc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no mallopt: not glibc
        return
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def settle_process() -> None:
    """Set the serving process up for a long life of short polls, once it is built."""
    # A big page is mapped, and the verdict computed, in worker threads that hold the GIL;
    # the event loop answering scrapes takes it back at every switch, each time after up
    # to the interval (5 ms by default), and a scrape that needs a few waits for each.
    sys.setswitchinterval(SWITCH_INTERVAL)
    hand_big_buffers_back()
    # What was made to start (modules, the app, its settings) lives as long as the process:
    # frozen, it is no longer walked by each full collection.
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


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
        engine_step_seconds=config.engine_step_seconds,
        model_weights_bytes=weight_bytes,
        peak_memory_bandwidth=config.peak_memory_bandwidth,
        tensor_parallel_size=config.tensor_parallel_size,
        baseline=baseline,
        max_series=config.backend_max_series,
        max_label_bytes=config.backend_max_label_bytes,
        latency_window=latency_window,
        role=config.role,
    )
    poller = Poller(upstream, backend, gpu, settings)
    if config.server_cpu == "on":
        poller.register("server_cpu", ServerCpu(config.backend_url))
    return poller


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


def warn_if_others_can_read(path: Path | None, flag: str, holds: str) -> None:
    """A start-up warning when ``path``, which holds ``holds``, is readable by others."""
    try:
        mode = path.stat().st_mode if path is not None else 0
    except OSError:
        return
    if mode & stat.S_IROTH:
        log.warning(
            "%s %s is readable by others (mode %03o) and holds %s; make it readable by this "
            "user only (chmod o-r)",
            flag,
            path,
            stat.S_IMODE(mode),
            holds,
        )


def warn_of_secrets_others_reach(config: ServeConfig, web_config: WebConfig | None) -> None:
    """Start-up warnings: secrets files others can read, password hashes cheap to crack."""
    warn_if_others_can_read(config.web_config_file, "--web.config.file", "password hashes")
    if web_config is not None and web_config.tls is not None:
        warn_if_others_can_read(web_config.tls.key_file, "key_file", "the TLS private key")
    for flag, path in (
        ("--backend-bearer-token-file", config.backend_bearer_token_file),
        ("--canary-bearer-token-file", config.canary_bearer_token_file),
    ):
        warn_if_others_can_read(path, flag, "a token")
    for user, cost in (web_config.cheap_hashes() if web_config else {}).items():
        log.warning(
            "basic_auth_users.%s: bcrypt cost %d is below %d: a stolen hash is cheap to "
            "crack; make one with htpasswd -nBC %d",
            user,
            cost,
            MIN_BCRYPT_COST,
            MIN_BCRYPT_COST,
        )


def log_uncalibrated(spec: Spec, config: ServeConfig) -> None:
    """Say what still holds a default that `inferwatch calibrate` would measure."""
    names = spec.uncalibrated()
    if config.engine_step_seconds == DEFAULT_KNOWN_STEP:
        names.append("engine_step_seconds")
    if names:
        log.warning(
            "uncalibrated, at their defaults: %s; the alerts that fire on them are info, and "
            "without NVML a long engine step may read as a stall, until `inferwatch "
            "calibrate` measures them",
            ", ".join(names),
        )


def log_otlp(config: ServeConfig, spec: Spec) -> None:
    """Say that the OTLP trace receiver is on, and what it keeps."""
    if config.otlp_traces == "on":
        log.info(
            "receiving OTLP/HTTP traces at POST /v1/traces: the %d slowest requests of each "
            "%g s window",
            config.otlp_slowest,
            spec.window_seconds,
        )


def run(config: ServeConfig, spec: Spec | None = None) -> None:
    """Serve until a signal; ``spec`` (default: the defaults) is the verdict's and sets the
    window of the canary's TTFT gap and of the latency quantiles."""
    spec = spec_from_config({}) if spec is None else spec
    cap = connection_cap(open_file_limit())
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
        "serving on %s:%d (%s; at most %d connections), polling %s backend at %s every %g s",
        host or "*",
        port,
        "plain HTTP" if web_config is None else web_config.describe(),
        cap,
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
        listen_host=host,
        otlp=config.otlp_settings(),
    )
    log_uncalibrated(spec, config)
    if config.web_config_file is not None:
        warn_if_others_can_write(config.web_config_file, "--web.config.file", "who is let in")
    warn_of_secrets_others_reach(config, web_config)
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
    log_otlp(config, spec)
    if canary_settings is not None:
        log.info("%s", describe_canary(canary_settings, redact_url))
    settle_process()
    serve(app, sockets, ssl_context, cap)
