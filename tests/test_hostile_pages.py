"""Whatever a server sends, a poll publishes a complete, valid snapshot or marks it down.

The invariant, checked here on the issue's reproducers (each a regression case), through
the real HTTP app, and as a property over mutated real captures:

- ``/metrics`` answers 200 with a page that prometheus_client parses and ``promtool check
  metrics`` accepts, with no series twice;
- the backend is either up with every series valid for its kind, or down
  (``inferwatch_backend_up 0``) with one cause and none of its series left behind;
- no exception but the project's own errors leaves parsing, normalizing or rendering;
- logs name a cause once per kind, not once per poll.
"""

from __future__ import annotations

import asyncio
import logging
import math
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.collect.backends import BACKENDS, VLLM, Mapper, detect
from inferwatch.collect.backends.relabel import Relabeler
from inferwatch.collect.poller import DEFAULT_MAX_SERIES, Poller, PollSettings
from inferwatch.collect.textparse import ExpositionError, scan
from inferwatch.collect.upstream import Upstream
from inferwatch.logs import CauseLog
from inferwatch.metrics import BACKEND
from inferwatch.model import Snapshot
from inferwatch.serve.exposition import render
from inferwatch.serve.sidecar import make_app

from conftest import FIXTURES, fixture_text, page_value

M = {"backend": "vllm", "model": "m"}
WAITING = 'vllm:num_requests_waiting{model_name="m"} 1\n'
HIST = "vllm:time_to_first_token_seconds_bucket"


class Hostile(NamedTuple):
    """One of the issue's reproducers or their neighbours, and what the exporter makes of it."""

    page: str
    up: bool
    present: dict[str, float]  # series that must be on the exposed page, with their values
    absent: tuple[str, ...]  # contract names that must not be
    cause: str  # in the one line logged when the backend is down


HOSTILE: dict[str, Hostile] = {
    "malformed label set outside the signals": Hostile(
        page=WAITING + 'vllm:prompt_tokens_total{model_name="m",bad} 5\n',
        up=True,
        present={"inferwatch_requests_waiting": 1.0},
        absent=("inferwatch_prompt_tokens_total",),
        cause="",
    ),
    "OpenMetrics exemplar, # EOF and _created": Hostile(
        page="# TYPE vllm:prompt_tokens counter\n"
        "# UNIT vllm:prompt_tokens tokens\n"
        'vllm:prompt_tokens_total{model_name="m"} 5 # {trace_id="abc"} 1.0\n'
        'vllm:prompt_tokens_created{model_name="m"} 1.7e9\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        + WAITING
        + "# TYPE vllm:generation_tokens counter\n"
        'vllm:generation_tokens_total 7 # {trace_id="x}"} 1.0 1700000000.5\n'
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        f'{HIST}{{le="0.1",model_name="m"}} 2 # {{trace_id="t"}} 0.05\n'
        f'{HIST}{{le="+Inf",model_name="m"}} 3\n'
        'vllm:time_to_first_token_seconds_count{model_name="m"} 3\n'
        'vllm:time_to_first_token_seconds_sum{model_name="m"} 0.4\n'
        'vllm:time_to_first_token_seconds_created{model_name="m"} 1.7e9\n'
        "# EOF\n",
        up=True,
        present={
            "inferwatch_prompt_tokens_total": 5.0,
            "inferwatch_generation_tokens_total": 7.0,
            'inferwatch_time_to_first_token_seconds_bucket{le="0.1"}': 2.0,
            "inferwatch_time_to_first_token_seconds_count": 3.0,
        },
        absent=(),
        cause="",
    ),
    "histogram series that merge with different bounds": Hostile(
        page=WAITING
        + f'{HIST}{{model_name="m",pid="1",le="0.1"}} 1\n{HIST}{{model_name="m",pid="1",le="+Inf"}} 1\n'
        f'{HIST}{{model_name="m",pid="2",le="0.2"}} 1\n{HIST}{{model_name="m",pid="2",le="+Inf"}} 1\n',
        up=True,
        present={"inferwatch_requests_waiting": 1.0},
        absent=("inferwatch_time_to_first_token_seconds",),
        cause="",
    ),
    "the same, without model labels (the poll looks for the model there)": Hostile(
        page="vllm:num_requests_waiting 1\n"
        f'{HIST}{{pid="1",le="0.1"}} 1\n{HIST}{{pid="1",le="+Inf"}} 1\n'
        f'{HIST}{{pid="2",le="0.2"}} 1\n{HIST}{{pid="2",le="+Inf"}} 1\n',
        up=True,
        present={},
        absent=("inferwatch_time_to_first_token_seconds",),
        cause="",
    ),
    "duplicate lines": Hostile(
        page=WAITING
        + 'vllm:prompt_tokens_total{model_name="m"} 5\n' * 2
        + f'{HIST}{{model_name="m",le="+Inf"}} 1\n' * 2
        + 'vllm:time_to_first_token_seconds_count{model_name="m"} 1\n' * 2
        + 'vllm:time_to_first_token_seconds_sum{model_name="m"} 0.5\n',
        up=True,
        present={
            "inferwatch_prompt_tokens_total": 5.0,
            'inferwatch_time_to_first_token_seconds_bucket{le="+Inf"}': 1.0,
            "inferwatch_time_to_first_token_seconds_count": 1.0,
        },
        absent=(),
        cause="",
    ),
    "values a contract series cannot take": Hostile(
        page='vllm:num_requests_waiting{model_name="m"} NaN\n'
        'vllm:num_requests_running{model_name="m"} 2\n'
        'vllm:kv_cache_usage_perc{model_name="m"} -Inf\n'
        'vllm:prompt_tokens_total{model_name="m"} -5\n'
        'vllm:generation_tokens_total{model_name="m"} +Inf\n'
        'vllm:num_preemptions_total{model_name="m"} NaN\n'
        f'{HIST}{{model_name="m",le="+Inf"}} -1\n',
        up=True,
        present={"inferwatch_requests_running": 2.0},
        absent=(
            "inferwatch_requests_waiting",
            "inferwatch_kv_cache_usage_ratio",
            "inferwatch_prompt_tokens_total",
            "inferwatch_generation_tokens_total",
            "inferwatch_preemptions_total",
            "inferwatch_time_to_first_token_seconds",
        ),
        cause="",
    ),
    "a ratio above 1 and a counter summed over processes with one negative part": Hostile(
        page=WAITING + 'vllm:kv_cache_usage_perc{model_name="m"} 1.5\n'
        'vllm:prompt_tokens_total{model_name="m",pid="1"} 9\n'
        'vllm:prompt_tokens_total{model_name="m",pid="2"} -5\n',
        up=True,
        present={"inferwatch_requests_waiting": 1.0},
        absent=("inferwatch_kv_cache_usage_ratio", "inferwatch_prompt_tokens_total"),
        cause="",
    ),
    "malformed queue gauge (a signal the poll needs)": Hostile(
        page='vllm:num_requests_waiting{model_name="m",bad} 1\n',
        up=False,
        present={},
        absent=(),
        cause="vllm:num_requests_waiting: malformed label set",
    ),
    "more series than the budget": Hostile(
        page="".join(
            f'vllm:num_requests_running{{engine="{i}",model_name="m"}} 1\n'
            for i in range(DEFAULT_MAX_SERIES + 1)
        ),
        up=False,
        present={},
        absent=(),
        cause=f"more than {DEFAULT_MAX_SERIES} samples of mapped families (--backend-max-series)",
    ),
    "cut short": Hostile(
        page=WAITING + "vllm:prompt_tokens_total 5",
        up=False,
        present={},
        absent=(),
        cause="truncated",
    ),
    "a byte-order mark before the page": Hostile(
        page="\ufeff" + WAITING + 'vllm:num_requests_running{model_name="m"} 2\n',
        up=True,
        present={"inferwatch_requests_waiting": 1.0, "inferwatch_requests_running": 2.0},
        absent=(),
        cause="",
    ),
    "a histogram without its +Inf bucket": Hostile(
        page=WAITING + f'{HIST}{{model_name="m",le="0.1"}} 2\n'
        'vllm:time_to_first_token_seconds_count{model_name="m"} 2\n'
        'vllm:time_to_first_token_seconds_sum{model_name="m"} 0.1\n',
        up=True,
        present={"inferwatch_requests_waiting": 1.0},
        absent=("inferwatch_time_to_first_token_seconds",),
        cause="",
    ),
    "buckets that are not cumulative": Hostile(
        page=WAITING
        + f'{HIST}{{model_name="m",le="0.1"}} 5\n{HIST}{{model_name="m",le="+Inf"}} 3\n'
        'vllm:time_to_first_token_seconds_count{model_name="m"} 3\n'
        'vllm:time_to_first_token_seconds_sum{model_name="m"} 0.1\n',
        up=True,
        present={"inferwatch_requests_waiting": 1.0},
        absent=("inferwatch_time_to_first_token_seconds",),
        cause="",
    ),
    "processes that merge into buckets that are not cumulative": Hostile(
        page=WAITING + f'{HIST}{{model_name="m",pid="1",le="0.1"}} 1\n'
        f'{HIST}{{model_name="m",pid="1",le="+Inf"}} 1\n'
        f'{HIST}{{model_name="m",pid="2",le="0.1"}} 4\n'
        f'{HIST}{{model_name="m",pid="2",le="+Inf"}} 2\n'
        'vllm:time_to_first_token_seconds_count{model_name="m",pid="1"} 1\n'
        'vllm:time_to_first_token_seconds_count{model_name="m",pid="2"} 2\n'
        'vllm:time_to_first_token_seconds_sum{model_name="m",pid="1"} 0.1\n'
        'vllm:time_to_first_token_seconds_sum{model_name="m",pid="2"} 0.1\n',
        up=True,
        present={"inferwatch_requests_waiting": 1.0},
        absent=("inferwatch_time_to_first_token_seconds",),
        cause="",
    ),
    "a count that is not the +Inf bucket's": Hostile(
        page=WAITING + f'{HIST}{{model_name="m",le="+Inf"}} 3\n'
        'vllm:time_to_first_token_seconds_count{model_name="m"} 4\n'
        'vllm:time_to_first_token_seconds_sum{model_name="m"} 0.1\n',
        up=True,
        present={"inferwatch_requests_waiting": 1.0},
        absent=("inferwatch_time_to_first_token_seconds",),
        cause="",
    ),
}


class PageServer:
    """A loopback server whose /metrics answers what the test sets."""

    def __init__(self) -> None:
        self.page = fixture_text("vllm-0.32.0-cpu-loaded-kv-full.prom")
        self.statuses: list[int] = []

    async def metrics(self, request: web.Request) -> web.Response:
        if self.statuses:
            status = self.statuses.pop(0)
            return web.Response(status=status, text=f"error {status}")
        return web.Response(text=self.page, content_type="text/plain")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        return app


@pytest.fixture
async def served(aiohttp_server):
    pages = PageServer()
    server = await aiohttp_server(pages.app())
    pages.url = str(server.make_url("")).rstrip("/")
    return pages


def assert_valid_page(page: str) -> dict[str, list]:
    """Parses, holds no series twice, every backend series has a value its kind takes,
    every histogram is one (:func:`assert_valid_histograms`) and every share lies in [0, 1].

    Returns the samples of each family, by the family's contract key (``prompt_tokens``).
    """
    found: dict[str, list] = {}
    seen: set[tuple[str, tuple]] = set()
    for family in text_string_to_metric_families(page):
        key = family.name.removeprefix("inferwatch_")
        found[key] = family.samples
        if family.type == "histogram":
            assert_valid_histograms(family.name, family.samples)
        for sample in family.samples:
            series = (sample.name, tuple(sorted(sample.labels.items())))
            assert series not in seen, f"{series} appears twice"
            seen.add(series)
            if key in BACKEND and not sample.name.endswith("_sum"):
                assert math.isfinite(sample.value) and sample.value >= 0, sample
            if key.endswith("_ratio"):
                assert 0.0 <= sample.value <= 1.0, sample
    return found


def assert_valid_histograms(name: str, samples: list) -> None:
    """What the exposition format requires of each series of a histogram family: buckets
    in increasing order of bound, cumulative, the last one ``+Inf``; a ``_count`` equal to
    it; a ``_sum`` finite and >= 0 (every contract histogram observes non-negative values)."""
    series: dict[tuple, dict] = {}
    for sample in samples:
        labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
        parts = series.setdefault(labels, {"buckets": [], "count": None, "sum": None})
        if sample.name == f"{name}_bucket":
            parts["buckets"].append((float(sample.labels["le"]), sample.value))
        elif sample.name == f"{name}_count":
            parts["count"] = sample.value
        elif sample.name == f"{name}_sum":
            parts["sum"] = sample.value
    for labels, parts in series.items():
        where = f"{name}{dict(labels)}"
        bounds = [bound for bound, _ in parts["buckets"]]
        counts = [count for _, count in parts["buckets"]]
        assert bounds and bounds[-1] == math.inf, f"{where}: no +Inf bucket"
        assert bounds == sorted(set(bounds)), f"{where}: bounds {bounds}"
        assert all(math.isfinite(c) and c >= 0 for c in counts), f"{where}: counts {counts}"
        assert counts == sorted(counts), f"{where}: not cumulative {counts}"
        assert parts["count"] == counts[-1], f"{where}: count {parts['count']} != {counts[-1]}"
        total = parts["sum"]
        assert total is not None and math.isfinite(total) and total >= 0, f"{where}: sum {total}"


@pytest.mark.parametrize("case", sorted(HOSTILE))
async def test_hostile_page_is_served_valid_or_marks_the_backend_down(
    case: str, served, poller_for, aiohttp_client, caplog
) -> None:
    hostile = HOSTILE[case]
    poller = poller_for(served.url, timeout=2.0, interval=0.05)
    client = await aiohttp_client(make_app(poller, run_poller=False))
    await poller.poll_once()  # a healthy page first: nothing of it may outlive a bad one
    served.page = hostile.page
    with caplog.at_level(logging.WARNING, logger="inferwatch.poller"):
        for _ in range(3):
            await poller.poll_once()
            resp = await client.get("/metrics")
            assert resp.status == 200
    page = await resp.text()
    assert_valid_page(page)
    assert page_value(page, "inferwatch_backend_up", backend="vllm") == float(hostile.up)
    for series, value in hostile.present.items():
        name, _, le = series.partition('{le="')
        labels = {**M, "le": le[:-2]} if le else M
        assert page_value(page, name, **labels) == value, series
    for name in hostile.absent:
        assert f"\n{name}" not in page, name
    lines = [r.getMessage() for r in caplog.records if r.name == "inferwatch.poller"]
    if hostile.up:
        assert poller.snapshot.backend is not None
        assert "inferwatch_requests_finished_total" not in page  # nothing stale kept
        # One line per family and kind of defect, not one per poll.
        assert len(lines) == len({(d.family, d.kind) for d in poller.snapshot.backend.dropped})
    else:
        assert page_value(page, "inferwatch_collector_success", collector="backend") == 0.0
        assert "inferwatch_requests_" not in page and "inferwatch_backend_info" not in page
        assert len(lines) == 1 and hostile.cause in lines[0], lines
        assert "\n" not in poller.snapshot.collectors["backend"].error


async def test_a_histogram_merge_failure_inside_the_poll_keeps_the_rest_of_the_page() -> None:
    text = HOSTILE["the same, without model labels (the poll looks for the model there)"].page
    sample = VLLM.normalize(text)
    assert sample.model == "unknown" and sample.values["requests_waiting"]
    assert [d.kind for d in sample.dropped] == ["bucket bounds"]


async def test_alternating_500_and_503_log_one_line_not_one_per_poll(
    served, poller_for, caplog
) -> None:
    poller = poller_for(served.url, timeout=2.0, interval=0.05)
    served.statuses = [500, 503] * 10
    with caplog.at_level(logging.WARNING, logger="inferwatch.poller"):
        for _ in range(20):
            await poller.poll_once()
    lines = [r.getMessage() for r in caplog.records if r.name == "inferwatch.poller"]
    assert len(lines) == 1 and "HTTP 500 from" in lines[0], lines


def test_a_repeating_cause_is_logged_again_each_minute_with_what_was_held_back(caplog) -> None:
    now = [0.0]
    causes = CauseLog("backend scrape", repeat=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="inferwatch.poller"):
        for second in range(121):
            now[0] = float(second)
            causes.failed("http status", f"HTTP {500 + second % 4} from http://x/metrics")
            if second % 10 == 0:
                causes.failed("timeout", "no answer from http://x/metrics within 2 s")
        causes.ok()
    assert [r.getMessage() for r in caplog.records] == [
        "backend scrape failing: HTTP 500 from http://x/metrics",
        "backend scrape failing: no answer from http://x/metrics within 2 s",
        "backend scrape still failing (67 polls, 59 lines like this held back): "
        "HTTP 500 from http://x/metrics",
        "backend scrape still failing (68 polls, 5 lines like this held back): "
        "no answer from http://x/metrics within 2 s",
        "backend scrape still failing (133 polls, 59 lines like this held back): "
        "HTTP 500 from http://x/metrics",
        "backend scrape still failing (134 polls, 5 lines like this held back): "
        "no answer from http://x/metrics within 2 s",
        "backend scrape recovered after 134 failed polls",
    ]


def test_default_series_budget_is_at_least_ten_times_the_largest_real_page() -> None:
    largest = 0
    for path in FIXTURES.glob("*.prom"):
        text = path.read_text()
        backend = detect(text)
        page = backend.preprocess(text) if backend.preprocess else text
        largest = max(largest, scan(page, backend.wanted).count())
    assert largest > 200  # the captures are real pages, not excerpts only
    assert 10 * largest <= DEFAULT_MAX_SERIES


def big_page(series: int) -> str:
    """A page of ``series`` series of one mapped family, 75 bytes each."""
    return WAITING + "".join(
        f'vllm:num_requests_running{{engine="{i:07d}",model_name="some-model-name"}} 1\n'
        for i in range(series)
    )


@pytest.mark.parametrize(
    ("series", "max_series"),
    [
        (100_000, DEFAULT_MAX_SERIES),  # over the budget: down before the labels are parsed
        (30_000, 100_000),  # within a raised budget: mapped off the event loop
    ],
)
async def test_healthz_answers_while_a_huge_page_is_mapped(
    series: int, max_series: int, served, poller_for, aiohttp_client
) -> None:
    """While the poll maps the page, the event loop keeps answering: /healthz requests
    complete during the mapping itself (none could if it ran on the loop). No clock is read:
    the mapping holds until the test has seen answers, then goes on."""
    served.page = big_page(series)
    poller = poller_for(served.url, timeout=2.0, interval=0.05, max_series=max_series)
    mapping, answered_during = threading.Event(), threading.Event()
    normalize = poller._normalize

    def held_normalize(text: str):
        mapping.set()
        answered_during.wait(timeout=10)
        try:
            return normalize(text)
        finally:
            mapping.clear()

    poller._normalize = held_normalize
    client = await aiohttp_client(make_app(poller))  # the real poll loop runs
    answers = 0
    for _ in range(3000):
        if poller.last_poll_at is not None:
            break
        resp = await client.get("/healthz")
        if mapping.is_set():
            answers += resp.status in (200, 503)
            if answers == 3:
                answered_during.set()
        await asyncio.sleep(0.01)
    assert answers >= 3 and poller.last_poll_at is not None
    if max_series == DEFAULT_MAX_SERIES:
        assert not poller.snapshot.backend_up
        assert "--backend-max-series" in poller.snapshot.collectors["backend"].error
    else:
        assert len(poller.snapshot.backend.values["requests_running"]) == series


def test_the_series_of_a_huge_page_share_the_label_pairs_they_have_in_common() -> None:
    # A budget raised for a huge server holds a mapping of every series: their model is one
    # pair object, and a label the contract keeps as the server names it (engine) is the
    # server's own pair, not a copy per series.
    keys = list(Mapper(VLLM).normalize(big_page(1000), max_series=2000).values["requests_running"])
    assert len(keys) == 1000 and {key[0] for key in keys} == {("model", "some-model-name")}
    assert len({id(key[0]) for key in keys}) == 1
    relabel = Relabeler(VLLM.labels)
    first = relabel.series('engine="1",model_name="m"')
    own, contract = relabel.series('engine="2",model_name="m"')
    assert own == (("engine", "2"), ("model_name", "m")) and own[1] is first[0][1]
    assert contract == (("model", "m"), ("engine", "2")) and contract[0] is first[1][0]
    assert contract[1] is own[0]


# --- the property: mutated real captures --------------------------------------------------

CAPTURES = {p.name: p.read_text() for p in sorted(FIXTURES.glob("*.prom"))}
SERVER_OF = {name: detect(text) for name, text in CAPTURES.items()}

VALUES = ["NaN", "+Inf", "-Inf", "-5", "1e308", "1e400", "abc", "-nan(ind)", "", "0x10", "1_0"]
LES = ["NaN", "soon", "+Inf", "+inf", "0.1", "1e-300", "-1", "0.10", ""]
LABEL_VALUES = ['a\\"b', "\\\\", "\\n", "λ", "", "}", "{", " # {", "\\q"]


def _sample_line(lines: list[str], i: int) -> int:
    """The first sample line at or after ``i`` (wrapping), or ``i`` when there is none."""
    for j in range(len(lines)):
        k = (i + j) % len(lines)
        if lines[k] and not lines[k].startswith("#"):
            return k
    return i


def _with_value(line: str, value: str) -> str:
    head = line[: line.rfind("}") + 1] if "}" in line else line.split(" ")[0]
    return f"{head} {value}"


def _relabel(line: str, label: str) -> str:
    brace = line.find("{")
    return line if brace < 0 else f"{line[: brace + 1]}{label},{line[brace + 1 :]}"


def _with_le(line: str, le: str) -> str:
    start = line.find('le="')
    return line if start < 0 else line[: start + 4] + le + line[line.find('"', start + 4) :]


def _next(lines: list[str], i: int, test: Callable[[int], bool]) -> int | None:
    """The first line index at or after ``i`` (wrapping) that passes ``test``."""
    return next((k % len(lines) for k in range(i, i + len(lines)) if test(k % len(lines))), None)


def _without_inf_bucket(lines: list[str], i: int) -> list[str]:
    k = _next(lines, i, lambda k: 'le="+Inf"' in lines[k])
    return lines if k is None else _at(lines, k)


def _bucket_values_swapped(lines: list[str], i: int) -> list[str]:
    """Two neighbouring buckets of one series with their counts swapped (the lower bound
    then holds more than the higher one whenever they differed)."""

    def bucket_pair(k: int) -> bool:  # two bucket lines, each with a value to swap
        return k + 1 < len(lines) and all(
            "_bucket{" in lines[j] and " " in lines[j] for j in (k, k + 1)
        )

    k = _next(lines, i, bucket_pair)
    if k is None:
        return lines
    first, second = lines[k].rsplit(" ", 1), lines[k + 1].rsplit(" ", 1)
    return _at(_at(lines, k, f"{first[0]} {second[1]}"), k + 1, f"{second[0]} {first[1]}")


def _at(lines: list[str], i: int, *new: str) -> list[str]:
    """``lines`` with line ``i`` replaced by ``new`` (none: deleted)."""
    return [*lines[:i], *new, *lines[i + 1 :]]


def _draw(d: st.DataObject, choices: list[str]) -> str:
    return d.draw(st.sampled_from(choices))


Mutation = Callable[[list[str], int, st.DataObject], list[str]]

MUTATIONS: dict[str, Mutation] = {
    "duplicate line": lambda ls, i, d: _at(ls, i, ls[i], ls[i]),
    "delete line": lambda ls, i, d: _at(ls, i),
    "swap lines": lambda ls, i, d: [*ls[:i], *ls[i + 1 : i + 2], ls[i], *ls[i + 2 :]],
    "duplicate block": lambda ls, i, d: [*ls[: i + 8], *ls[i : i + 8], *ls[i + 8 :]],
    "bad value": lambda ls, i, d: _at(ls, i, _with_value(ls[i], _draw(d, VALUES))),
    "exemplar": lambda ls, i, d: _at(ls, i, ls[i] + ' # {trace_id="abc"} 1.0 1700000000.1'),
    "timestamp": lambda ls, i, d: _at(ls, i, ls[i] + " 1700000000000"),
    "bare label name": lambda ls, i, d: _at(ls, i, _relabel(ls[i], "bad")),
    "unterminated label set": lambda ls, i, d: _at(ls, i, ls[i].replace("}", "", 1)),
    "odd label value": lambda ls, i, d: _at(
        ls, i, _relabel(ls[i], f'x="{_draw(d, LABEL_VALUES)}"')
    ),
    "another process": lambda ls, i, d: _at(ls, i, ls[i], _relabel(ls[i], 'pid="2"')),
    "another bound": lambda ls, i, d: _at(
        ls, i, ls[i], _with_le(_relabel(ls[i], 'pid="3"'), _draw(d, LES))
    ),
    "bad bound": lambda ls, i, d: _at(ls, i, _with_le(ls[i], _draw(d, LES))),
    "another model": lambda ls, i, d: _at(ls, i, ls[i].replace('="', '="other-', 1)),
    "cut line": lambda ls, i, d: _at(ls, i, ls[i][: d.draw(st.integers(0, len(ls[i])))]),
    "junk line": lambda ls, i, d: _at(
        ls, i, d.draw(st.text(st.characters(exclude_characters="\n"), max_size=40))
    ),
    "EOF": lambda ls, i, d: _at(ls, i, "# EOF", ls[i]),
    "TYPE line again": lambda ls, i, d: _at(ls, i, f"# TYPE {ls[i].split('{')[0]} gauge", ls[i]),
    "byte-order mark": lambda ls, i, d: ["\ufeff" + ls[0], *ls[1:]],
    "no +Inf bucket": lambda ls, i, d: _without_inf_bucket(ls, i),
    "bucket counts swapped": lambda ls, i, d: _bucket_values_swapped(ls, i),
}


@st.composite
def hostile_pages(draw: st.DrawFn) -> tuple[str, str]:
    """(capture name, a mutated copy of that real capture)."""
    name = draw(st.sampled_from(sorted(CAPTURES)))
    lines = CAPTURES[name].rstrip("\n").split("\n")
    data = draw(st.data())
    for _ in range(draw(st.integers(1, 6))):
        if not lines:  # all deleted: an empty page is one more hostile kind
            break
        mutation = MUTATIONS[draw(st.sampled_from(sorted(MUTATIONS)))]
        lines = mutation(lines, _sample_line(lines, draw(st.integers(0, len(lines) - 1))), data)
    cut = draw(st.integers(0, 30)) == 0  # now and then the whole page is cut short
    return name, "\n".join(lines) + ("" if cut else "\n")


class PageUpstream(Upstream):
    """The backend's page as given: the network is the HTTP tests' business."""

    def __init__(self, page: str) -> None:
        super().__init__("http://backend", timeout=1.0, max_bytes=1 << 24)
        self.page = page

    async def get_exposition(self, path: str) -> str:
        return self.page

    async def get_json_field(self, path: str, field: str) -> str:
        return "served-model"


def poll_and_render(name: str, page: str) -> tuple[Snapshot, str]:
    """A poll of the real capture, then one of ``page`` a second later (a whole latency
    window: its quantiles are computed from both); the snapshot and page it leaves."""
    upstream = PageUpstream(CAPTURES[name])
    clock = iter(range(1_000_000))
    settings = PollSettings(latency_window=1.0)
    poller = Poller(upstream, SERVER_OF[name], None, settings, clock=lambda: float(next(clock)))

    async def two_polls() -> Snapshot:
        await poller.poll_once()
        assert poller.snapshot.backend_up, "the real capture itself"
        upstream.page = page
        return await poller.poll_once()

    snap = asyncio.run(two_polls())
    return snap, render(snap).decode()


def assert_invariant(snap: Snapshot, page: str) -> None:
    found = assert_valid_page(page)
    (up,) = found["backend_up"]
    if snap.backend_up:
        assert up.value == 1.0 and snap.backend is not None
    else:
        assert up.value == 0.0 and snap.backend is None
        assert not [k for k in found if k in BACKEND or k == "backend_info"], "stale series"
        error = snap.collectors["backend"].error
        assert error and "\n" not in error


@settings(
    max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(hostile_pages())
def test_every_mutated_capture_gives_a_valid_page_or_a_down_backend(named: tuple[str, str]) -> None:
    assert_invariant(*poll_and_render(*named))


PROMTOOL_PAGES = 60


def test_promtool_accepts_the_pages_of_mutated_captures(tmp_path: Path) -> None:
    pages: list[str] = []

    @settings(max_examples=PROMTOOL_PAGES, deadline=None, database=None)
    @given(hostile_pages())
    def collect(named: tuple[str, str]) -> None:
        snap, page = poll_and_render(*named)
        assert_invariant(snap, page)
        pages.append(page)

    collect()
    for n, page in enumerate(pages):
        (tmp_path / f"{n:03d}.prom").write_text(page)
    lint = subprocess.run(
        [
            "sh",
            "-c",
            'for f in "$0"/*.prom; do promtool check metrics < "$f" || echo "FAILED $f"; done',
            tmp_path,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "FAILED" not in lint.stdout, lint.stdout + lint.stderr
    assert len(pages) == PROMTOOL_PAGES


def test_every_backend_reads_its_own_captures_unchanged() -> None:
    """The property's starting points are valid as they are (no defect reported), but for
    excerpts whose histograms were cut short when they were copied."""
    for name, text in CAPTURES.items():
        sample = SERVER_OF[name].normalize(text)
        if "excerpt" in name or "snippet" in name or "issue617" in name:
            assert all(d.kind == "invalid value" for d in sample.dropped), sample.dropped
        else:
            assert sample.dropped == (), (name, sample.dropped)
        assert SERVER_OF[name] in BACKENDS.values()


def _values_moved(page: str) -> str:
    """The page with every sample's value moved (doubled, plus one), its lines otherwise
    the same: what a busy server's next page looks like."""

    def moved(line: str) -> str:
        head, _, value = line.rpartition(" ")
        if not line or line[0] == "#" or not head:
            return line
        try:
            return f"{head} {float(value) * 2 + 1!r}"
        except ValueError:
            return line

    return "\n".join(moved(line) for line in page.split("\n"))


def _mapped(mapper: Mapper, page: str) -> tuple | str:
    """What a mapper makes of a page, comparable (NaN as text), or the error it raises."""
    try:
        sample = mapper.normalize(page, max_series=DEFAULT_MAX_SERIES)
    except ExpositionError as exc:
        return str(exc)
    return repr((sample.model, sorted(sample.values.items()), sorted(sample.histograms.items()),
                 sample.dropped))  # fmt: skip


@settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(hostile_pages())
def test_a_mapper_that_read_the_last_pages_maps_a_page_as_a_fresh_one_does(
    named: tuple[str, str],
) -> None:
    """The caches that make a poll pay only for change (the scanner's blocks, its blocks'
    and pages' layouts, the plans of those pages, the histograms' layouts, the feeds' memo)
    never change what a page maps to: after the real capture, its values moved twice (the
    second page fits the first's page layout), the mutated page and its values moved twice,
    each in turn, a mapper gives what a new mapper gives for that page alone."""
    name, page = named
    backend = SERVER_OF[name]
    warm = Mapper(backend)
    for start in (CAPTURES[name], page):
        moved = _values_moved(start)
        for text in (start, moved, _values_moved(moved)):
            assert _mapped(warm, text) == _mapped(Mapper(backend), text)


def test_an_unchanged_page_is_the_last_polls_mapping_and_any_change_is_mapped() -> None:
    """An idle server's page, polled faster than anything on it moves, is not mapped again
    (the poll pays only for change); a page that moved, or a page after a rejected one, is
    mapped, and a rejected page is rejected at every poll."""
    name = "vllm-0.32.0-cpu-loaded-kv-full.prom"
    page, moved = CAPTURES[name], _values_moved(CAPTURES[name])
    upstream = PageUpstream(page)
    poller = Poller(upstream, SERVER_OF[name], None, PollSettings())

    async def backend(text: str) -> object:
        upstream.page = "".join([text[:1], text[1:]])  # equal, not the same object
        return (await poller.poll_once()).backend

    async def polls() -> None:
        first = await backend(page)
        assert first is not None
        assert await backend(page) is first
        after_move = await backend(moved)
        assert after_move is not first and after_move is not None
        assert after_move.total("requests_waiting") != first.total("requests_waiting")
        assert await backend(moved) is after_move
        assert await backend(moved[:-30]) is None  # cut short: down
        assert await backend(moved[:-30]) is None  # and again, not the last good mapping
        back = await backend(page)
        assert back is not None and back.total("requests_waiting") == first.total(
            "requests_waiting"
        )

    asyncio.run(polls())
