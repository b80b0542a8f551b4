"""The parts of a backend's table: where a server's families feed the metric contract.

A backend module declares a :class:`~inferwatch.collect.backends.mapping.Backend` with one
:class:`Feed` per contract key it can provide. A feed lists :class:`Source` families in
order of preference (current name first, then the names older releases used); the first one
present on the page wins, so a server that exposes both a new and a deprecated name is never
counted twice::

    feed("kv_cache_usage_ratio", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")

Most sources read a sample's value. Two kinds derive it: :func:`info` reads numbers from
the label values of an info series (``vllm:cache_config_info{num_gpu_blocks="32",...} 1``),
and ``Source(..., times=other)`` multiplies each series by the other source's series with
the same contract labels. A value they cannot derive (a label missing, ``"None"``, not a
number) leaves the series absent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from types import MappingProxyType

from inferwatch.metrics import BACKEND, Kind

# A ``where`` test: the label's value equals the string, or the callable accepts it.
LabelTest = str | Callable[[str], bool]


@dataclass(frozen=True)
class Source:
    """One backend family feeding a contract key.

    ``name`` is the sample name for gauges and counters (``vllm:prompt_tokens_total``) and
    the family name for histograms (``vllm:time_to_first_token_seconds``). ``where`` keeps
    only samples whose labels pass its tests (a value, or a callable on the value; a missing
    label fails); ``scale`` converts units (0.001 for ms -> s).

    Gauges and counters may derive their value instead of reading it: ``from_labels`` (see
    :func:`info`) takes it from the sample's label values, and ``times`` multiplies each
    series by the series of another source with the same contract labels. ``labels`` keeps
    server labels of this source only, beside the backend's (server name -> contract name:
    TGI's ``method`` is the ``kind`` of its step durations, not of its other families);
    ``values`` writes a contract label's server values in the contract's terms (TGI's
    ``err="overloaded"`` is ``reason="error"``; a value it does not list is kept as it is, so
    ``where`` keeps out the ones it has no meaning for), and ``constant`` adds labels the
    server leaves implicit (TGI's successes are one unlabelled counter). ``count_label`` takes
    the value as the number of comma-separated names in that label; with ``newest``, of the
    samples that coincide after relabeling only the one whose own value is the largest
    counts (an info family valued at the time each label set was last set, all of them kept:
    vLLM's ``lora_requests_info``).
    """

    name: str
    _: KW_ONLY
    where: Mapping[str, LabelTest] = field(default_factory=lambda: MappingProxyType({}))
    scale: float = 1.0
    from_labels: tuple[tuple[str, ...], ...] = ()
    times: Source | None = None
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    values: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: MappingProxyType({}))
    constant: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    count_label: str = ""
    newest: bool = False

    @property
    def relabels(self) -> bool:
        """Whether its labels map otherwise than the backend's (a relabeler of its own)."""
        return bool(self.labels or self.values or self.constant)

    def sample_names(self, kind: Kind) -> tuple[str, ...]:
        if kind is Kind.HISTOGRAM:
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        if self.times is not None:
            return (self.name, *self.times.sample_names(kind))
        return (self.name,)


@dataclass(frozen=True)
class Feed:
    """A contract key (see ``inferwatch.metrics.BACKEND``) and where a backend finds it: the
    first of its sources on the page, or with ``adds`` every one there, their series added
    (counters that together count what the key counts)."""

    key: str
    sources: tuple[Source, ...]
    _: KW_ONLY
    adds: bool = False

    def __post_init__(self) -> None:
        if self.key not in BACKEND:
            raise ValueError(f"{self.key!r} is not a backend series of the metric contract")

    @property
    def kind(self) -> Kind:
        return BACKEND[self.key].kind


def feed(key: str, *names: str | Source) -> Feed:
    """``feed("requests_waiting", "vllm:num_requests_waiting")``: names in preference order."""
    return Feed(key, tuple(n if isinstance(n, Source) else Source(n) for n in names))


def feed_sum(key: str, *sources: Source) -> Feed:
    """A scalar key whose series are those of every source on the page, added (TGI's
    finished requests: its successes and its failures by kind)."""
    made = Feed(key, sources, adds=True)
    if made.kind is Kind.HISTOGRAM:
        raise ValueError(f"{key!r}: only counters and gauges add up across families")
    return made


def info(name: str, *, from_labels: tuple[str | tuple[str, ...], ...]) -> Source:
    """An info series (value 1) whose labels hold the number: ``info("vllm:cache_config_info",
    from_labels=("kv_cache_size_tokens", ("num_gpu_blocks", "block_size")))`` reads the first
    label, else the product of the other two. Per sample, the first alternative whose labels
    are all present and numbers (finite, >= 0) wins; a label reading ``"None"`` counts as
    missing."""
    return Source(
        name, from_labels=tuple((a,) if isinstance(a, str) else tuple(a) for a in from_labels)
    )


def newest_info(name: str, label: str, *, count: bool = False) -> Source:
    """The number in ``label`` (``count``: the number of comma-separated names in it) of the
    newest sample of an info family whose values are the times its label sets were set."""
    if count:
        return Source(name, count_label=label, newest=True)
    return Source(name, from_labels=((label,),), newest=True)


def inference_api(*paths: str) -> Callable[[str], bool]:
    """A ``where`` test for an HTTP handler label: the OpenAI-compatible API (paths under
    ``/v1/``) other than ``/v1/models``, plus the server's own inference ``paths``.

    It leaves out what monitoring and load balancers request (``/metrics``, ``/health``,
    ``/ping``, ``/version``, ``/load``, model and server info...): those requests say nothing
    about the service's answers to its clients, and the exporter makes some of them itself.
    ``/v1/models`` is left out for the same reason (clients, probes and routers poll it).
    """
    native = frozenset(paths)

    def test(handler: str) -> bool:
        if handler == "/v1/models" or handler.startswith("/v1/models/"):
            return False
        return handler in native or handler.startswith("/v1/")

    return test


@dataclass(frozen=True)
class Profiler:
    """A server's own profiler endpoints (POST, no body needed), for evidence capture.

    ``enable`` says how the server is started with its profiler on (the endpoints exist
    only then); ``prefix_field`` names a start-body field that prefixes the trace files,
    ``steps_field`` one that bounds the engine steps profiled.
    """

    enable: str
    start_path: str = "/start_profile"
    stop_path: str = "/stop_profile"
    prefix_field: str | None = None
    steps_field: str | None = None
