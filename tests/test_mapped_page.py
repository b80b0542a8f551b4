"""A page that fits a planned layout is mapped feed by feed as it is read
(collect/backends/mapped.py): what is read is what a fresh mapper gives, and a feed no one
reads is neither parsed nor judged."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferwatch.collect.backends import VLLM, Mapper
from inferwatch.collect.backends.mapped import Feeds
from inferwatch.collect.textparse import ExpositionError
from inferwatch.model import Dropped

FIXTURES = Path(__file__).parent / "fixtures"
PAGE = (FIXTURES / "vllm-0.32.0-cpu-loaded-kv-full.prom").read_text()
PREEMPTIONS = 'vllm:num_preemptions_total{engine="0",model_name="tiny"} 13.0'
WAITING = 'vllm:num_requests_waiting{engine="0",model_name="tiny"} 20.0'


def _planned_mapper() -> tuple[Mapper, list[Dropped]]:
    """A mapper that has planned the capture's layout, and what it was told was left out."""
    told: list[Dropped] = []
    mapper = Mapper(VLLM, told.append)
    mapper.normalize(PAGE)  # read in full
    mapper.normalize(PAGE.replace(" 13.0\n", " 14.0\n"))  # known blocks: the page's layout
    assert isinstance(mapper.normalize(PAGE).values, Feeds)  # mapped as it is read
    return mapper, told


def test_a_feed_no_one_reads_is_not_judged_until_it_is_read() -> None:
    mapper, told = _planned_mapper()
    page = PAGE.replace(PREEMPTIONS, PREEMPTIONS.replace(" 13.0", " -3"))  # a counter < 0
    sample = mapper.normalize(page)
    assert sample.values["requests_waiting"]  # the poll's signals are read
    assert told == []  # the counter's family was not mapped: nothing judged yet
    assert "preemptions" not in sample.values  # its only series is left out when read
    assert [d.kind for d in told] == ["invalid value"]
    assert sample.dropped == Mapper(VLLM).normalize(page).dropped
    assert len(told) == 1  # told once per page, however often it is read


def test_a_value_that_is_not_a_number_has_the_page_read_in_full_where_it_is_read() -> None:
    mapper, _ = _planned_mapper()
    page = PAGE.replace(PREEMPTIONS, PREEMPTIONS + " 1700000000")  # a timestamp
    fresh = Mapper(VLLM).normalize(page)
    sample = mapper.normalize(page)
    assert sample.values["requests_waiting"] == fresh.values["requests_waiting"]
    assert dict(sample.values) == dict(fresh.values)
    assert dict(sample.histograms) == dict(fresh.histograms)
    assert sample.dropped == fresh.dropped


def test_a_signal_that_is_not_a_number_is_judged_by_the_poll() -> None:
    mapper, _ = _planned_mapper()
    page = PAGE.replace(WAITING, WAITING.replace(" 20.0", " twenty"))
    assert repr(_outcome(mapper, page)) == repr(_outcome(Mapper(VLLM), page))


def _outcome(mapper: Mapper, page: str) -> object:
    try:
        sample = mapper.normalize(page)
    except Exception as exc:  # the page rejected: the same error as a fresh mapper's
        return type(exc), str(exc)
    return sample.model, dict(sample.values), dict(sample.histograms), tuple(sample.dropped)


def test_a_page_that_fits_a_layout_without_the_servers_names_is_still_recognised() -> None:
    """A page that fits a layout holding one of the server's own names is the server's; one
    whose layout holds none (only names others export too) is looked at in full."""
    served = (
        "# TYPE other gauge\nvllm:build 1\n"  # the server's name, in a family not mapped
        "# TYPE http_requests_total counter\n"
        'http_requests_total{handler="/v1/completions"} 3\n'
    )
    mapper = Mapper(VLLM)
    for _ in range(3):  # read in full, then known: the page's layout
        assert mapper.normalize(served, "m").model == "m"
    foreign = served.replace("vllm:build", "build")  # fits that layout
    with pytest.raises(ExpositionError, match="no vllm metrics"):
        mapper.normalize(foreign, "m")
