"""The fast exposition reader agrees with the format on the edge cases that matter."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.collect import scanner as scanner_module
from inferwatch.collect.scanner import PageScanner
from inferwatch.collect.textparse import (
    ExpositionError,
    PageReader,
    Scan,
    parse_labels,
    read_page,
    scan,
)

from conftest import FIXTURES, fixture_text, oracle_samples


def test_escaped_label_values_and_braces_inside_quotes() -> None:
    text = 'm{a="x\\"y",b="line\\nbreak",c="back\\\\slash",d="{}"} 1\n'
    ((raw, value),) = scan(text, {"m"}).samples["m"]
    assert value == 1.0
    assert parse_labels(raw) == (
        ("a", 'x"y'),
        ("b", "line\nbreak"),
        ("c", "back\\slash"),
        ("d", "{}"),
    )


def test_special_values_timestamps_and_comments() -> None:
    text = (
        "# HELP g a gauge\n# TYPE g gauge\n"
        'g{x="1"} NaN\n'
        'g{x="2"} +Inf 1700000000000\n'
        'g{x="3"} -1.5e-3\n'
        "other 5\n"
    )
    found = scan(text, {"g"}).samples
    values = [v for _, v in found["g"]]
    assert values[0] != values[0]  # NaN
    assert values[1:] == [float("inf"), -0.0015]
    assert "other" not in found


def test_truncated_body_is_rejected() -> None:
    with pytest.raises(ExpositionError, match="truncated"):
        scan('g{x="1"} 1\ng{x="2"} 2', {"g"})


def test_a_malformed_line_leaves_out_its_name_only() -> None:
    found = scan('g abc\nh 1\ng{x="1"} 2\ni{a="1",b} 3\n', {"g", "h", "i"})
    assert found.samples == {"h": [("", 1.0)], "i": [('a="1",b', 3.0)]}  # labels: parsed later
    assert found.malformed == {"g": "value 'abc' is not a number"}


def test_malformed_label_set_is_rejected() -> None:
    with pytest.raises(ExpositionError, match="malformed label set"):
        parse_labels('a="1",b=2')


def test_html_yields_no_samples() -> None:
    assert scan("<html><body>502 Bad Gateway</body></html>\n", {"g"}).samples == {}


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.prom")))
def test_agrees_with_prometheus_client_on_every_capture(fixture: str) -> None:
    text = fixture_text(fixture)
    expected = oracle_samples(text)
    got = scan(text, set(expected)).samples
    assert got.keys() == expected.keys()
    for name, samples in expected.items():
        mine = [(dict(parse_labels(raw)), v) for raw, v in got[name]]
        assert len(mine) == len(samples), name
        for (lab_a, val_a), (lab_b, val_b) in zip(mine, samples, strict=True):
            assert lab_a == lab_b, name
            assert val_a == val_b or (val_a != val_a and val_b != val_b), name


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.prom")))
def test_page_scanner_finds_what_a_full_scan_finds(fixture: str) -> None:
    text = fixture_text(fixture)
    names = set(oracle_samples(text))

    def comparable(found: Scan) -> dict:  # NaN != NaN; compare its text instead
        return {n: [(raw, repr(v)) for raw, v in s] for n, s in found.samples.items()}

    assert comparable(PageScanner(names).scan(text)) == comparable(scan(text, names))


def test_page_scanner_reparses_only_changed_families() -> None:
    page = (
        "# HELP a_seconds A.\n# TYPE a_seconds histogram\n"
        'a_seconds_bucket{le="1.0"} 1.0\na_seconds_bucket{le="+Inf"} 2.0\na_seconds_count 2.0\n'
        "# HELP b Gauge B.\n# TYPE b gauge\nb 5.0\n"
        "# TYPE skipped counter\nskipped_total 9.0\n"
    )
    scanner = PageScanner({"a_seconds_bucket", "a_seconds_count", "b"})
    first = scanner.scan(page).samples
    assert first["b"] == [("", 5.0)]
    assert "skipped_total" not in first
    second = scanner.scan(page.replace("b 5.0", "b 6.0")).samples
    assert second["b"] == [("", 6.0)]
    assert second["a_seconds_bucket"] is first["a_seconds_bucket"]  # unchanged: reused


def test_page_scanner_reads_a_family_whose_type_line_is_repeated() -> None:
    page = "# TYPE g gauge\n# TYPE g gauge\ng 1\n"
    assert PageScanner({"g"}).scan(page) == Scan({"g": [("", 1.0)]})


def test_page_scanner_reads_untyped_pages_and_their_next_values() -> None:
    scanner = PageScanner({"g"})
    assert scanner.scan('g{x="1"} 3\n').samples == {"g": [('x="1"', 3.0)]}
    assert scanner.scan('g{x="1"} 4\n').samples == {"g": [('x="1"', 4.0)]}


def test_page_scanner_reads_a_comment_that_became_a_sample_line() -> None:
    # As many lines as the block read before, a comment now a sample of a wanted name: the
    # block's layout no longer fits, so it is read in full.
    scanner = PageScanner({"g", "h"})
    assert scanner.scan("# TYPE g gauge\n# HELP h H.\ng 1\n").samples == {"g": [("", 1.0)]}
    again = scanner.scan("# TYPE g gauge\nh 5\ng 2\n").samples
    assert again == {"h": [("", 5.0)], "g": [("", 2.0)]}


def test_a_page_that_fits_a_page_layout_is_read_by_its_values() -> None:
    page = (
        '# TYPE g gauge\ng{x="1"} 1\n# TYPE other counter\nother_total 7\n'
        '# TYPE h histogram\nh_bucket{le="+Inf"} 2\nh_count 2\n'
    )
    scanner = PageScanner({"g", "h_bucket", "h_count"})
    assert scanner.by_layout(page) is None  # nothing known yet
    scanner.scan(page)  # read in full: the blocks' layouts
    scanner.scan(page.replace('g{x="1"} 1', 'g{x="1"} 3'))  # known blocks: the page's
    moved = page.replace("} 1", "} 4").replace("other_total 7", "other_total 8")
    layout, values = scanner.by_layout(moved)
    assert values == ("4", "2", "2")  # the other family's lines are not read; nothing parsed
    get, texts = layout.names["g"]
    assert (get(values), texts) == (("4",), ('x="1"',))
    with pytest.raises(ExpositionError, match="more than 2 samples"):
        scanner.by_layout(moved, limit=2)


def test_a_family_that_comes_and_goes_is_read_by_its_layout_and_its_page_by_the_pages() -> None:
    # Two states of one server, one with a family the other lacks (speculative decoding's,
    # a LoRA adapter's), in turn: after a round, neither is read in full again.
    def page(n: int, busy: bool) -> str:
        calm = (
            f'# TYPE g gauge\ng{{x="1"}} {n}\n'
            '# TYPE h histogram\nh_bucket{le="+Inf"} 2\nh_count 2\n'
        )
        return calm + (f'# TYPE s counter\ns_total{{k="1"}} {100 + n}\n' if busy else "")

    scanner = PageScanner({"g", "h_bucket", "h_count", "s_total"})
    for n in range(3):
        for busy in (False, True):
            scanner.scan(page(n, busy))
    reads = scanner._full_reads
    for n in range(3, 6):
        for busy in (False, True):
            fitted = scanner.by_layout(page(n, busy))
            assert fitted is not None, busy
            assert fitted[1] == tuple(map(str, [n, 2, 2, 100 + n] if busy else [n, 2, 2]))
            assert scanner.scan(page(n, busy)).samples["g"] == [('x="1"', n)]
    assert scanner._full_reads == reads


@pytest.mark.parametrize(
    "changed",
    [
        # A TYPE line where a skipped family had a sample: the page is cut otherwise.
        lambda page: page.replace("other_total 7", "# TYPE g2 gauge"),
        lambda page: page.replace('g{x="1"} 1', 'g{x="2"} 1'),  # a label changed
        lambda page: page.replace("# TYPE h histogram", "# TYPE h summary"),
        lambda page: page.replace("h_count 2\n", "h_count 2\nh_sum 1\n"),  # one line more
    ],
)
def test_a_page_that_does_not_fit_its_page_layout_is_read_in_full(changed) -> None:
    page = '# TYPE g gauge\ng{x="1"} 1\n# TYPE other counter\nother_total 7\n' + (
        '# TYPE h histogram\nh_bucket{le="+Inf"} 2\nh_count 2\n'
    )
    scanner = PageScanner({"g", "g2", "h_bucket", "h_count", "h_sum"})
    scanner.scan(page)
    scanner.scan(page.replace("} 1", "} 5"))
    assert scanner.by_layout(page) is not None
    assert scanner.by_layout(changed(page)) is None


def test_a_value_is_cut_from_a_page_that_fits_its_layout_but_parsed_where_it_is_read() -> None:
    # A timestamp after the value: the page is cut as its layout says, and its value's text
    # (which float() refuses) has it read in full where a mapper parses it.
    page = '# TYPE g gauge\ng{x="1"} 1\n# TYPE h histogram\nh_bucket{le="+Inf"} 2\nh_count 2\n'
    scanner = PageScanner({"g", "h_bucket", "h_count"})
    scanner.scan(page)
    scanner.scan(page.replace("} 1", "} 5"))
    stamped = page.replace('g{x="1"} 1', 'g{x="1"} 1 1700000000')
    assert scanner.by_layout(stamped)[1] == ("1 1700000000", "2", "2")


def test_a_family_too_big_for_a_layout_is_read_in_full_whenever_it_changes(monkeypatch) -> None:
    # A series budget raised for a huge server: a layout of all of a family's lines would
    # double what the scanner holds for it, so the family is read in full at each change.
    monkeypatch.setattr(scanner_module, "LAYOUT_SAMPLES", 3)

    def page(n: int, series: int) -> str:
        return "# TYPE g gauge\n" + "".join(f'g{{x="{i}"}} {n}\n' for i in range(series))

    for series, kept in ((3, 1), (4, 0)):
        scanner = PageScanner({"g"})
        scanner.scan(page(0, series))
        reads = scanner._full_reads
        for n in (1, 2):
            samples = scanner.scan(page(n, series)).samples["g"]
            assert samples == [(f'x="{i}"', n) for i in range(series)]
        assert len(scanner._layouts["g"]) == kept
        assert scanner._full_reads == reads + (0 if kept else 2)


def test_a_type_line_naming_a_type_line_announces_no_wanted_family() -> None:
    # Only the page's first line may start a chunk with "# TYPE " (there is no newline before
    # it); anywhere else the TYPE line names the family "#", which no one wants.
    page = "# TYPE g gauge\ng 1\n# TYPE # TYPE h gauge\nh 2\n"
    assert PageScanner({"g", "h"}).scan(page).samples == {"g": [("", 1.0)]}


def test_an_untyped_page_is_cut_without_a_copy() -> None:
    # A hostile page of one huge untyped family is held once, as the page, not once more.
    page = 'g{x="1"} 1\ng{x="2"} 2\n'
    scanner = PageScanner({"g"})
    scanner.scan(page)
    assert scanner._blocks["\n"][0] is page


def test_page_scanner_rejects_truncated_pages() -> None:
    with pytest.raises(ExpositionError, match="truncated"):
        PageScanner({"g"}).scan("# TYPE g gauge\ng 1")


def _by_prometheus_client(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


@pytest.mark.parametrize("golden", sorted((Path(__file__).parent / "golden").glob("*.prom")))
def test_read_page_reads_every_served_page_as_prometheus_client_does(golden: Path) -> None:
    text = golden.read_text()
    mine, theirs = read_page(text), _by_prometheus_client(text)
    assert mine.keys() == theirs.keys()
    for name, samples in theirs.items():
        assert [(labels, repr(v)) for labels, v in mine[name]] == [
            (labels, repr(v)) for labels, v in samples
        ], name


def test_read_page_reads_each_line_to_the_last_one_without_a_newline() -> None:
    assert read_page("a 1\n\n# c\nb 2") == {"a": [({}, 1.0)], "b": [({}, 2.0)]}


def test_read_page_refuses_a_malformed_line_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"^not Prometheus text: value 'x' is not a number$"):
        read_page('inferwatch_backend_up{backend="vllm"} x\n')


def test_a_page_reader_shares_the_label_sets_of_the_last_page() -> None:
    # The verdict keeps a window's two ends side by side: one dict per series, not two.
    reader = PageReader()
    first = reader.read('a{x="1"} 1\na{x="2"} 1\n')
    second = reader.read('a{x="1"} 2\na{x="3"} 5\n')
    assert second == {"a": [({"x": "1"}, 2.0), ({"x": "3"}, 5.0)]}
    assert second["a"][0][0] is first["a"][0][0]
    third = reader.read('a{x="2"} 1\n')  # only the last page's are kept
    assert third["a"][0][0] is not first["a"][1][0]
