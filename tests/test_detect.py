"""``--backend auto`` tells the registered servers apart, and says so when it cannot."""

from __future__ import annotations

import json

import pytest

from inferwatch.collect.backends import BACKENDS, UnknownBackend, detect

from conftest import FIXTURES, TGI_PAGE, captures_of, fixture_text

CAPTURES = sorted(p.name for p in FIXTURES.glob("*.prom"))


@pytest.mark.parametrize("fixture", CAPTURES)
def test_every_capture_is_recognised_as_the_server_it_came_from(fixture: str) -> None:
    (expected,) = [name for name in BACKENDS if fixture in captures_of(name)]
    assert detect(fixture_text(fixture)).name == expected


def test_tgi_page_is_recognised() -> None:
    assert detect(TGI_PAGE).name == "tgi"


def test_json_escaped_llamacpp_body_is_recognised() -> None:
    body = json.dumps(fixture_text("llamacpp-2025-late-go-test-real-dump.prom"))
    assert detect(body).name == "llamacpp"


def test_every_backend_has_captures_or_pages() -> None:
    seen = {detect(fixture_text(f)).name for f in CAPTURES} | {detect(TGI_PAGE).name}
    assert seen == set(BACKENDS)


@pytest.mark.parametrize(
    "page",
    [
        "",
        '# HELP http_requests_total x\nhttp_requests_total{handler="/health"} 4.0\n',
        "<html><body>502 Bad Gateway</body></html>\n",
        '{"error": {"code": 501, "message": "This server does not support metrics endpoint."}}',
        '"not json\n',
    ],
)
def test_unrecognised_page_gets_one_clear_line(page: str) -> None:
    with pytest.raises(UnknownBackend) as info:
        detect(page)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("cannot tell the backend from its /metrics page")
    assert f"none of {', '.join(BACKENDS)} recognised" in message
    assert message.endswith("set --backend explicitly")


def test_page_with_as_many_lines_of_two_servers_is_ambiguous() -> None:
    page = 'vllm:num_requests_waiting{model_name="m"} 1\nsglang:num_queue_reqs{model_name="m"} 1\n'
    with pytest.raises(
        UnknownBackend, match=r"as many (vllm as sglang|sglang as vllm) metric lines"
    ):
        detect(page)


def test_the_server_with_most_lines_wins() -> None:
    # An SGLang page that also re-exports one vLLM-named line stays SGLang.
    page = fixture_text("sglang-0.3-docs-production_metrics.prom") + "vllm:num_requests_waiting 0\n"
    assert detect(page).name == "sglang"


@pytest.mark.parametrize("fixture", CAPTURES)
def test_detection_and_mapping_recognise_a_page_by_the_same_lines(fixture: str) -> None:
    # ``--backend auto`` ranks by the lines each server's mapper would recognise the page by.
    for backend in BACKENDS.values():
        page = backend.readable(fixture_text(fixture))
        assert backend.recognises(page) == (backend.signature_lines(page) > 0), backend.name


def test_signature_lines_are_the_lines_a_prefix_begins() -> None:
    vllm = BACKENDS["vllm"]
    page = 'vllm:a 1\n# TYPE vllm:b gauge\nvllm:b{x="vllm:"} 2\nnot_vllm:c 3\n'
    assert vllm.signature_lines(page) == 2 and vllm.recognises(page)
    assert vllm.signature_lines("# TYPE vllm:b gauge\n") == 0
    assert not vllm.recognises("# TYPE vllm:b gauge\n")
