"""``inferwatch serve``'s option table: every flag, its environment variable and config key,
its default, its type (which validates it) and its help (``docs/exporter.md`` is generated
from it)."""

from __future__ import annotations

from pathlib import Path

from inferwatch.collect.backends import BACKENDS
from inferwatch.collect.poller import DEFAULT_MAX_LABEL_BYTES, DEFAULT_MAX_SERIES
from inferwatch.collect.steps import DEFAULT_KNOWN_STEP
from inferwatch.method.alerts import ALERTS
from inferwatch.serve.request_checks import host_names
from inferwatch.settings import (
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
)

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
        "--backend-max-label-bytes",
        positive_int,
        DEFAULT_MAX_LABEL_BYTES,
        "longest label set of a series (the text between its braces); a longer series is left "
        "out and counted in inferwatch_backend_series_dropped_total",
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
        "any (comma-separated, no port; default: addresses, localhost and the listen "
        "address's name, on every interface this host's name)",
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
        "--server-cpu",
        str,
        "on",
        "read the CPU under the server (its threads' CPU time and run-queue wait, the node's "
        "CPU pressure, its cgroup's throttling) from /proc: on (series absent where not "
        "visible, and collector_success says why) or off",
        choices=("on", "off"),
    ),
    Option(
        "--idle-threshold",
        ratio,
        0.1,
        "GPU busy share below which a GPU counts as idle",
        metavar="RATIO",
    ),
    Option(
        "--engine-step-seconds",
        positive_float,
        DEFAULT_KNOWN_STEP,
        "the longest scheduler step the engine takes (its biggest batch); without NVML, an "
        "engine that makes no step for over twice this (or its own recurring long steps) "
        "with requests waiting is stalled",
        metavar="SECONDS",
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
        "auto",
        "send small streamed requests of our own and time them client side (the canary_* "
        "series); auto: only to a server that has no TTFT histogram of its own (TGI), where "
        "the canary's is the only first-token measurement",
        choices=("auto", "on", "off"),
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
