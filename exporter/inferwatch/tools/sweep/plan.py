"""``inferwatch baseline``'s options, and :class:`Plan`: the sweep they describe, validated."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferwatch.capacity import ARRIVALS
from inferwatch.method.slo.objectives import SLOs
from inferwatch.settings import (
    ConfigError,
    Option,
    bounded_float,
    bounded_int,
    existing_file,
    http_url,
    positive_float,
    positive_int,
)
from inferwatch.tools.sweep.goodput import Objectives, objectives_for
from inferwatch.tools.sweep.prompts import load_prompts
from inferwatch.tools.sweep.search import Search


def _int_list(minimum: int) -> Callable[[str], tuple[int, ...]]:
    """A parser of comma-separated distinct integers, each at least ``minimum``."""

    def parse(text: str) -> tuple[int, ...]:
        values = []
        for item in text.split(","):
            try:
                value = positive_int(item.strip())
            except ValueError as exc:
                raise ValueError(f"{text!r}: {exc}") from None
            if value < minimum:
                raise ValueError(f"{text!r}: {value} is below the minimum of {minimum}")
            if value in values:
                raise ValueError(f"{text!r} lists {value} twice")
            values.append(value)
        return tuple(values)

    return parse


def _non_empty(text: str) -> str:
    if not text:
        raise ValueError("must not be empty")
    return text


def new_file(text: str) -> Path:
    """A file to write: its directory exists, and it is not a directory itself."""
    path = Path(text)
    if not path.parent.is_dir():
        raise ValueError(f"{text}: directory {path.parent} does not exist")
    if path.is_dir():
        raise ValueError(f"{text} is a directory")
    return path


OPTIONS = (
    Option(
        "--url",
        parse=http_url,
        default=None,
        help="OpenAI-compatible server base URL (required)",
        metavar="URL",
    ),
    Option(
        "--replicas",
        parse=bounded_int(1, 100_000),
        default=1,
        help="like replicas behind --url (a router or load balancer): the traffic measures the "
        "fleet, and the file's rates and concurrency are one replica's share of it, for every "
        "replica's sidecar to take",
        metavar="N",
    ),
    Option(
        "--replica-url",
        parse=http_url,
        default=None,
        help="one of the replicas behind --url, as its sidecar reaches it (required with "
        "--replicas above 1): its metrics page gives the server-side latency",
        metavar="URL",
    ),
    Option(
        "--model",
        parse=_non_empty,
        default=None,
        help="model name to request (required)",
        metavar="NAME",
    ),
    Option(
        "--out",
        parse=new_file,
        default=None,
        help="baseline file to write (required)",
        metavar="FILE",
    ),
    Option(
        "--api",
        parse=str,
        default="completions",
        help="completions or chat",
        choices=("completions", "chat"),
    ),
    Option(
        "--concurrency",
        parse=_int_list(1),
        default="1,4,16",
        help="concurrency levels",
        metavar="N,N",
    ),
    Option(
        "--prompt-tokens",
        parse=_int_list(1),
        default=None,
        help="prompt lengths in tokens (default: 128,1024; not with --prompts)",
        metavar="N,N",
    ),
    # ITL needs two tokens at least.
    Option(
        "--output-tokens",
        parse=_int_list(2),
        default="64,256",
        help="output lengths in tokens",
        metavar="N,N",
    ),
    Option(
        "--requests-per-cell",
        parse=positive_int,
        default=None,
        help="requests per cell (default: max(8, 2 x concurrency))",
        metavar="N",
    ),
    Option(
        "--prompts",
        parse=existing_file,
        default=None,
        help="JSONL of real prompts, one object per line with `prompt` or `messages`",
        metavar="FILE",
    ),
    Option(
        "--metrics-url",
        parse=http_url,
        default=None,
        help="metrics page for the server-side TTFT (default: URL/metrics, or the replica's; "
        "inferwatch's works too)",
        metavar="URL",
    ),
    Option(
        "--gpu-name",
        parse=_non_empty,
        default="unknown",
        help="GPU recorded in the file's metadata",
        metavar="NAME",
    ),
    Option(
        "--previous",
        parse=existing_file,
        default=None,
        help="earlier baseline to mark regressions against",
        metavar="FILE",
    ),
    Option(
        "--regression-factor",
        parse=bounded_float(1, 1000),
        default=None,
        help="a cell regressed when its TTFT or ITL p95 exceeds this x the previous "
        "(default: the thresholds' regression_factor, 1.5)",
        metavar="X",
    ),
    Option(
        "--request-timeout",
        parse=positive_float,
        default=300.0,
        help="seconds one request may take",
        metavar="S",
    ),
    Option(
        "--seed",
        parse=positive_int,
        default=None,
        help="seed of the generated prompts (default: a fresh one, recorded in the file)",
        metavar="N",
    ),
    *(
        Option(
            f"--goodput-{kind}",
            parse=positive_float,
            default=None,
            help=f"{what} bound of a good request, for goodput (default: the config's slos: {kind} "
            "objective's; a request is good when it meets every objective given)",
            metavar="S",
        )
        for kind, what in (("ttft", "TTFT"), ("itl", "inter-token gap"), ("e2e", "end-to-end"))
    ),
    Option(
        "--search",
        parse=str,
        default="off",
        help="after the cells, search each prompt x output shape for the highest request rate "
        "whose goodput meets --goodput-target (the capacity, written to the file)",
        choices=("off", "on"),
    ),
    Option(
        "--arrivals",
        parse=str,
        default="poisson",
        help="how the search's requests arrive at a rate (poisson: seeded by --seed)",
        choices=ARRIVALS,
    ),
    Option(
        "--goodput-target",
        parse=bounded_float(0.01, 1),
        default=0.95,
        help="share of a step's requests that must be good for its rate to be carried",
        metavar="SHARE",
    ),
    Option(
        "--search-tolerance",
        parse=bounded_float(0.01, 1),
        default=0.1,
        help="the search stops once the lowest bad rate is within this share above the good one",
        metavar="SHARE",
    ),
    Option(
        "--search-start",
        parse=positive_float,
        default=None,
        help="the search's first rate in requests/s (default: 1 / one request's duration alone)",
        metavar="RATE",
    ),
    Option(
        "--search-steps",
        parse=bounded_int(2, 100),
        default=12,
        help="most rates measured per shape",
        metavar="N",
    ),
    Option(
        "--search-seconds",
        parse=positive_float,
        default=900.0,
        help="most seconds searched per shape",
        metavar="S",
    ),
    Option(
        "--api-key",
        parse=_non_empty,
        default=None,
        help="bearer token for the API (prefer the env var)",
        metavar="KEY",
    ),
)
REQUIRED = ("url", "model", "out")
DEFAULT_PROMPT_TOKENS = "128,1024"


@dataclass(frozen=True)
class Plan:
    """The sweep, validated from the options."""

    root: str
    model: str
    api: str
    concurrency: tuple[int, ...]
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    requests_per_cell: int | None
    metrics_url: str
    gpu_name: str
    request_timeout: float
    seed: int
    api_key: str | None = field(default=None, repr=False)
    prompts_file: Path | None = None
    file_prompts: tuple[dict[str, Any], ...] = ()
    objectives: Objectives = field(default_factory=Objectives)  # what good requests meet
    search: Search | None = None  # the load search after the cells, if asked for
    replicas: int = 1  # like replicas behind root: the file holds one's share
    replica_root: str | None = None  # one of them, as its sidecar reaches it

    @classmethod
    def from_values(cls, values: Mapping[str, Any], slos: SLOs | None = None) -> Plan:
        root = values["url"].rstrip("/").removesuffix("/v1")
        prompts_file = values["prompts"]
        if prompts_file is not None and values["prompt_tokens"] is not None:
            raise ConfigError("--prompts replaces --prompt-tokens: give one of them")
        prompt_tokens = values["prompt_tokens"]
        if prompts_file is None and prompt_tokens is None:
            prompt_tokens = _int_list(1)(DEFAULT_PROMPT_TOKENS)
        replicas, replica = values.get("replicas", 1), values.get("replica_url")
        if replicas > 1 and replica is None:
            raise ConfigError(
                f"--replicas {replicas} needs --replica-url: behind a router, URL/metrics is "
                "no replica's own page"
            )
        if replicas == 1 and replica is not None:
            raise ConfigError("--replica-url names a replica behind --url: give --replicas too")
        uneven = [c for c in values["concurrency"] if c % replicas]
        if uneven:
            raise ConfigError(
                f"--concurrency {uneven[0]} is not a multiple of --replicas {replicas}: each "
                "replica's share of it must be whole"
            )
        replica_root = replica.rstrip("/").removesuffix("/v1") if replica else None
        return cls(
            root=root,
            model=values["model"],
            api=values["api"],
            concurrency=values["concurrency"],
            prompt_tokens=(0,) if prompts_file is not None else prompt_tokens,
            output_tokens=values["output_tokens"],
            requests_per_cell=values["requests_per_cell"],
            metrics_url=values["metrics_url"] or (replica_root or root) + "/metrics",
            gpu_name=values["gpu_name"],
            request_timeout=values["request_timeout"],
            seed=values["seed"] or random.randrange(1, 1_000_000),
            api_key=values["api_key"],
            prompts_file=prompts_file,
            file_prompts=load_prompts(prompts_file, values["api"]) if prompts_file else (),
            objectives=objectives_for(
                slos or SLOs(),
                values["model"],
                {kind: values.get(f"goodput_{kind}") for kind in ("ttft", "itl", "e2e")},
            ),
            search=_search(values) if values.get("search") == "on" else None,
            replicas=replicas,
            replica_root=replica_root,
        )

    @property
    def server_root(self) -> str:
        """The server the sweep's server-side readings are of: the replica behind a router."""
        return self.replica_root or self.root

    def shapes(self) -> list[tuple[int, int]]:
        return [(p, o) for p in self.prompt_tokens for o in self.output_tokens]

    def keys(self) -> list[tuple[int, int, int]]:
        return [
            (c, p, o)
            for c in self.concurrency
            for p in self.prompt_tokens
            for o in self.output_tokens
        ]

    def requests_in(self, concurrency: int) -> int:
        return self.requests_per_cell or max(8, 2 * concurrency)


def _search(values: Mapping[str, Any]) -> Search:
    return Search(
        arrivals=values["arrivals"],
        target=values["goodput_target"],
        tolerance=values["search_tolerance"],
        start=values["search_start"],
        steps=values["search_steps"],
        seconds=values["search_seconds"],
        requests=values["requests_per_cell"],
    )


def plan_from(values: Mapping[str, Any], slos: SLOs | None = None) -> Plan:
    """The plan from resolved option values and the config's objectives; ConfigError when a
    required option is missing."""
    for option in OPTIONS:
        if option.key in REQUIRED and option.key in values and values[option.key] is None:
            raise ConfigError(f"{option.flag} is required (or {option.env})")
    return Plan.from_values(values, slos)
