"""``inferwatch serve``'s option table: every flag, its environment variable and config key,
its default, its type (which validates it) and its help (``docs/exporter.md`` is generated
from it)."""

from __future__ import annotations

from pathlib import Path

from inferwatch.collect.backends import BACKENDS
from inferwatch.collect.poller import DEFAULT_MAX_LABEL_BYTES, DEFAULT_MAX_SERIES
from inferwatch.collect.steps import DEFAULT_KNOWN_STEP
from inferwatch.method.alerts import ALERTS
from inferwatch.metrics import ROLES
from inferwatch.serve.otlp import DEFAULT_MAX_BYTES
from inferwatch.serve.request_checks import host_names
from inferwatch.serve.slow_requests import DEFAULT_MOST
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
        parse=str,
        default="auto",
        help="inference server kind; auto recognises it from its /metrics page",
        choices=("auto", *BACKENDS),
    ),
    Option(
        "--role",
        parse=str,
        default="auto",
        help="the server's part in a disaggregated deployment, on inferwatch_backend_info; auto "
        "reads it from the page where the server tells it (SGLang's engine_type, vLLM's KV "
        "connector families), none where it does not",
        choices=("auto", *ROLES),
    ),
    Option(
        "--backend-url",
        parse=http_url,
        default="http://127.0.0.1:8000",
        help="base URL of the server (or its full metrics URL)",
        metavar="URL",
    ),
    Option(
        "--backend-timeout",
        parse=bounded_float(0.01, 60),
        default=2.0,
        help="seconds to wait for the backend's /metrics",
        metavar="S",
    ),
    Option(
        "--backend-bearer-token-file",
        parse=existing_file,
        default=None,
        help="file with a bearer token sent to the backend as Authorization (read at start)",
        metavar="FILE",
    ),
    Option(
        "--backend-header",
        parse=header_line,
        default=None,
        help="one more header sent to the backend, e.g. 'X-Api-Key: ...' (never logged)",
        metavar="'NAME: VALUE'",
    ),
    Option(
        "--backend-max-bytes",
        parse=positive_int,
        default=16 * 1024 * 1024,
        help="largest /metrics body accepted",
        metavar="N",
    ),
    Option(
        "--backend-max-series",
        parse=positive_int,
        default=DEFAULT_MAX_SERIES,
        help="most samples of mapped families a page may hold; a bigger page marks the backend down",
        metavar="N",
    ),
    Option(
        "--backend-max-label-bytes",
        parse=positive_int,
        default=DEFAULT_MAX_LABEL_BYTES,
        help="longest label set of a series (the text between its braces); a longer series is left "
        "out and counted in inferwatch_backend_series_dropped_total",
        metavar="N",
    ),
    Option(
        "--web.listen-address",
        parse=listen_address,
        default=f":{DEFAULT_PORT}",
        help="address to serve /metrics on",
        metavar="HOST:PORT",
    ),
    Option(
        "--web.config.file",
        parse=existing_file,
        default=None,
        help="TLS, basic auth and response headers, in the Prometheus exporter-toolkit format",
        metavar="FILE",
    ),
    Option(
        "--web.allowed-host",
        parse=host_names,
        default=None,
        help="the only Host names (or addresses) answered, against DNS rebinding; /healthz answers "
        "any (comma-separated, no port; default: addresses, localhost and the listen "
        "address's name, on every interface this host's name)",
        metavar="NAME,...",
        many=True,
    ),
    Option(
        "--poll-interval",
        parse=bounded_float(0.05, 60),
        default=0.5,
        help="seconds between polls of backend and GPUs",
        metavar="S",
    ),
    Option(
        "--gpu",
        parse=str,
        default="auto",
        help="NVML: auto = use if present; on = required (exit if absent); off",
        choices=("auto", "on", "off"),
    ),
    Option(
        "--server-cpu",
        parse=str,
        default="on",
        help="read the CPU under the server (its threads' CPU time and run-queue wait, the node's "
        "CPU pressure, its cgroup's throttling) from /proc: on (series absent where not "
        "visible, and collector_success says why) or off",
        choices=("on", "off"),
    ),
    Option(
        "--idle-threshold",
        parse=ratio,
        default=0.1,
        help="GPU busy share below which a GPU counts as idle",
        metavar="RATIO",
    ),
    Option(
        "--engine-step-seconds",
        parse=positive_float,
        default=DEFAULT_KNOWN_STEP,
        help="the longest scheduler step the engine takes (its biggest batch); without NVML, an "
        "engine that makes no step for over twice this (or its own recurring long steps) "
        "with requests waiting is stalled",
        metavar="SECONDS",
    ),
    Option(
        "--model-weights-bytes",
        parse=positive_int,
        default=None,
        help="model weight bytes, for the decode floor",
        metavar="N",
    ),
    Option(
        "--model-path",
        parse=existing_dir,
        default=None,
        help="model directory; its *.safetensors sizes give the weight bytes",
        metavar="DIR",
    ),
    Option(
        "--peak-memory-bandwidth",
        parse=positive_float,
        default=None,
        help="peak bandwidth in bytes/s of the memory one engine's weights are spread over "
        "(default: from NVML, the engine's GPUs)",
        metavar="B_PER_S",
    ),
    Option(
        "--tensor-parallel-size",
        parse=positive_int,
        default=None,
        help="GPUs one engine's weights are spread over; engine k (in engine-label order) uses "
        "GPUs [k*N, (k+1)*N) of those NVML sees (default: visible GPUs / engines)",
        metavar="N",
    ),
    Option(
        "--baseline",
        parse=existing_file,
        default=None,
        help="baseline file from `inferwatch baseline`",
        metavar="FILE",
    ),
    Option(
        "--canary",
        parse=str,
        default="auto",
        help="send small streamed requests of our own and time them client side (the canary_* "
        "series); auto: only to a server that has no TTFT histogram of its own (TGI), where "
        "the canary's is the only first-token measurement",
        choices=("auto", "on", "off"),
    ),
    Option(
        "--canary-url",
        parse=http_url,
        default=None,
        help="OpenAI API base the canary's requests go to: the server's, or any URL the traffic "
        "goes through, e.g. the ingress (default: the backend URL's scheme, host and port)",
        metavar="URL",
    ),
    Option(
        "--canary-interval",
        parse=bounded_float(0.1, 3600),
        default=15.0,
        help="seconds between canary probes (doubling after each failure, up to 120 s, until "
        "the server is seen up again)",
        metavar="S",
    ),
    Option(
        "--canary-model",
        parse=str,
        default=None,
        help="model the canary asks for (default: the model the backend's page names)",
        metavar="NAME",
    ),
    Option(
        "--canary-prompt-tokens",
        parse=bounded_int(1, 100_000),
        default=8,
        help="prompt length of a canary probe, in words (about one token each)",
        metavar="N",
    ),
    Option(
        "--canary-output-tokens",
        parse=bounded_int(1, 10_000),
        default=8,
        help="tokens a canary probe asks for (exactly, where the server allows it)",
        metavar="N",
    ),
    Option(
        "--canary-api",
        parse=str,
        default="completions",
        help="OpenAI API the canary uses",
        choices=("completions", "chat"),
    ),
    Option(
        "--canary-timeout",
        parse=bounded_float(0.1, 600),
        default=10.0,
        help="seconds a canary probe may take in all before it counts as a timeout",
        metavar="S",
    ),
    Option(
        "--canary-bearer-token-file",
        parse=existing_file,
        default=None,
        help="file with a bearer token the canary sends as Authorization (read at start)",
        metavar="FILE",
    ),
    Option(
        "--capture-dir",
        parse=Path,
        default=None,
        help="folder for evidence captures (profiler trace, stacks, pages): new, empty or one it "
        "made; turns on POST /capture and GET /captures, which need basic auth or client "
        "certificates unless the exporter listens on loopback only (default: captures off)",
        metavar="DIR",
    ),
    Option(
        "--capture-on",
        parse=alert_list,
        default=None,
        help="cause alerts whose condition, held on the verdict for the alert's `for`, starts a "
        "capture (comma-separated; default: none, capture on request only)",
        metavar="ALERT,...",
        many=True,
    ),
    Option(
        "--capture-seconds",
        parse=bounded_float(1, 120),
        default=10.0,
        help="seconds a capture profiles and samples stacks for",
        metavar="S",
    ),
    Option(
        "--capture-min-interval",
        parse=bounded_float(0, 7 * 86400),
        default=600.0,
        help="least seconds between the starts of two captures",
        metavar="S",
    ),
    Option(
        "--capture-max-bytes",
        parse=positive_int,
        default=1024**3,
        help="most bytes the capture folder holds, a capture in flight and its archive included "
        "(the oldest captures deleted first)",
        metavar="N",
    ),
    Option(
        "--capture-profiler-dir",
        parse=existing_dir,
        default=None,
        help="the folder the server's profiler writes its traces to, as mounted here (vLLM: "
        "torch_profiler_dir; SGLang: SGLANG_TORCH_PROFILER_DIR); without it no trace is taken",
        metavar="DIR",
    ),
    Option(
        "--capture-profiler-steps",
        parse=bounded_int(1, 100_000),
        default=100,
        help="engine steps the server's profiler records at most (vLLM: max_iterations); the "
        "server writes the trace in its stop call, minutes for a big one",
        metavar="N",
    ),
    Option(
        "--capture-pid",
        parse=positive_int,
        default=None,
        help="the server's process for py-spy (default: the one listening on the backend URL's port)",
        metavar="PID",
    ),
    Option(
        "--otlp-traces",
        parse=str,
        default="off",
        help="receive the server's request spans over OTLP/HTTP at POST /v1/traces (vLLM: "
        "--otlp-traces-endpoint), list the rate window's slowest requests on the verdict and "
        "put their trace ids on the latency buckets as exemplars",
        choices=("on", "off"),
    ),
    Option(
        "--otlp-slowest",
        parse=bounded_int(1, 100),
        default=DEFAULT_MOST,
        help="slowest requests of the rate window listed, by TTFT and by time per output token",
        metavar="N",
    ),
    Option(
        "--otlp-max-bytes",
        parse=positive_int,
        default=DEFAULT_MAX_BYTES,
        help="largest OTLP body accepted, decompressed; a bigger one is refused with 413",
        metavar="N",
    ),
    Option(
        "--log.level",
        parse=str,
        default="info",
        help="log level",
        choices=("debug", "info", "warning", "error"),
    ),
)
