"""What a hostile page can make the sidecar hold, within the documented limits
(docs/security.md, "Memory"): a series whose label set is longer than
``--backend-max-label-bytes`` is left out and counted, the relabel memo holds a churning
server's label texts for a page or two, the verdict's pages are bounded in bytes, and a page
whose long model names change at every poll leaves the memory held flat, through the real
app."""

from __future__ import annotations

import base64
import gc
import logging
import random
import tracemalloc
from collections.abc import Iterator
from itertools import chain

from aiohttp import web

from inferwatch.collect import scanner
from inferwatch.collect.backends import VLLM, families
from inferwatch.collect.backends.relabel import Relabeler
from inferwatch.collect.poller import DEFAULT_MAX_LABEL_BYTES, Poller, PollSettings
from inferwatch.collect.scanner import PageScanner
from inferwatch.collect.upstream import Upstream
from inferwatch.serve.sidecar import make_app
from inferwatch.serve.verdict import DEFAULT_STEP
from inferwatch.serve.web import VERDICT

from conftest import page_value

WAITING = 'vllm:num_requests_waiting{model_name="m"} 1\n'


def churning_page(poll: int, series: int, chars: int) -> str:
    """``series`` series of a mapped family whose model names, ``chars`` long and hardly
    compressible, change at every poll (the security issue's page is 9,000 of 1,600)."""
    noise = base64.b64encode(random.Random(poll).randbytes(series * chars)).decode()
    return WAITING + "".join(
        f'vllm:num_requests_running{{engine="{i}",model_name="{name}"}} 1\n'
        for i, name in enumerate(noise[i : i + chars] for i in range(0, series * chars, chars))
    )


class Churning(Upstream):
    """A backend whose every page is a new :func:`churning_page`."""

    def __init__(self, series: int, chars: int) -> None:
        super().__init__("http://backend", timeout=1.0, max_bytes=1 << 24)
        self.polls = 0
        self.series, self.chars = series, chars

    async def get_exposition(self, path: str) -> str:
        self.polls += 1
        return churning_page(self.polls, self.series, self.chars)


def stepped_poller(upstream: Upstream) -> Poller:
    """A poller whose clock moves a verdict step at each poll."""
    clock: Iterator[float] = iter(range(0, 10**9, int(DEFAULT_STEP)))
    return Poller(upstream, VLLM, None, PollSettings(), clock=lambda: float(next(clock)))


# --- label sets ---------------------------------------------------------------------------


async def test_a_series_whose_label_set_is_too_long_is_left_out_and_counted(
    poller_for, aiohttp_client, aiohttp_server, caplog
) -> None:
    long_bytes = "λ" * (DEFAULT_MAX_LABEL_BYTES // 2 + 1)  # fewer characters than the bound
    page = WAITING + (
        'vllm:num_requests_running{engine="0",model_name="m"} 3\n'
        f'vllm:num_requests_running{{engine="1",model_name="{long_bytes}"}} 5\n'
        f'vllm:num_requests_running{{engine="2",model_name="{"x" * 5000}"}} 7\n'
    )

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/plain")

    backend = web.Application()
    backend.router.add_get("/metrics", metrics)
    server = await aiohttp_server(backend)
    poller = poller_for(str(server.make_url("")).rstrip("/"))
    client = await aiohttp_client(make_app(poller, run_poller=False))
    with caplog.at_level(logging.WARNING, logger="inferwatch.poller"):
        for _ in range(3):
            await poller.poll_once()
    served = await (await client.get("/metrics")).text()
    assert page_value(served, "inferwatch_backend_up", backend="vllm") == 1.0
    assert (
        page_value(served, "inferwatch_requests_running", backend="vllm", model="m", engine="0")
        == 3.0
    )
    assert 'engine="1"' not in served and 'engine="2"' not in served
    dropped = page_value(
        served, "inferwatch_backend_series_dropped_total", backend="vllm", reason="label_bytes"
    )
    assert dropped == 6.0  # two a poll
    lines = [r.getMessage() for r in caplog.records if r.name == "inferwatch.poller"]
    assert lines == [
        "vllm page: 2 series of vllm:num_requests_running left out: label set over 4096 bytes "
        "(--backend-max-label-bytes)"
    ]


def test_backend_max_label_bytes_reaches_the_poll(cli, monkeypatch) -> None:
    from inferwatch.serve import command

    built: list[Poller] = []
    monkeypatch.setattr(
        command, "run", lambda config, spec: built.append(command.build_poller(config))
    )
    assert cli("serve", "--gpu", "off", "--backend-max-label-bytes", "100").returncode == 0
    assert built[0].settings.max_label_bytes == 100
    refused = cli("serve", "--backend-max-label-bytes", "0")
    assert refused.returncode == 2 and "must be a positive integer" in refused.stderr


# --- caches and histories -----------------------------------------------------------------


def test_the_relabel_memo_holds_a_churning_servers_label_texts_for_two_pages_at_most() -> None:
    relabel = Relabeler(VLLM.labels)
    series = 500
    for poll in range(20):
        relabel.next_page()
        for text in churning_page(poll, series, 100).splitlines()[1:]:
            relabel.series(text[text.index("{") + 1 : text.rindex("}")])
        assert relabel.held() <= 2 * series
    stable = churning_page(0, series, 100).splitlines()[1:]
    for _ in range(3):  # a page that repeats is held whole, page after page
        relabel.next_page()
        for text in stable:
            relabel.series(text[text.index("{") + 1 : text.rindex("}")])
    assert relabel.held() == series


def test_the_scanners_layouts_cover_a_bounded_text(monkeypatch) -> None:
    monkeypatch.setattr(scanner, "LAYOUT_CHARS", 100_000)  # two of these pages' families
    pages = PageScanner(VLLM.wanted)
    # Twelve pages of 40 KB, then one of 200 KB: bigger than them all, it keeps no layout.
    for text in [churning_page(poll, 20, 2000) for poll in range(12)] + [
        churning_page(12, 100, 2000)
    ]:
        pages.scan(text)
        kept = chain((page.layout for page in pages._pages), *pages._layouts.values())
        assert 0 < sum(layout.chars for layout in kept) <= 100_000


def test_a_histogram_feeds_layouts_cover_a_bounded_text(monkeypatch) -> None:
    monkeypatch.setattr(families, "HISTOGRAM_LAYOUT_CHARS", 50_000)
    (source, *_) = next(f for f in VLLM.feeds if f.key == "time_to_first_token_seconds").sources
    layouts: dict = {}
    for poll in range(12):
        model = base64.b64encode(random.Random(poll).randbytes(600)).decode()
        texts = [f'le="{le}",model_name="{model}"' for le in ("0.1", "1.0", "+Inf")]
        samples = {
            f"{source.name}_bucket": [(text, 1.0) for text in texts],
            f"{source.name}_sum": [(f'model_name="{model}"', 0.5)],
            f"{source.name}_count": [(f'model_name="{model}"', 1.0)],
        }
        families.histograms(samples, source, Relabeler(VLLM.labels), [], layouts)
        assert 0 < sum(layout.chars for layout in layouts.values()) <= 50_000


async def test_the_verdict_keeps_its_pages_within_bytes_and_its_window_reach(
    aiohttp_client,
) -> None:
    poller = stepped_poller(Churning(series=50, chars=2000))
    app = make_app(poller, run_poller=False)
    history = app[VERDICT]
    history.page_bytes = 300_000  # about four of these pages
    client = await aiohttp_client(app)
    reach = []
    for _ in range(int(history.window / DEFAULT_STEP) + 20):
        await poller.poll_once()
        doc = await (await client.get("/verdict.json")).json()
        reach.append(doc["window_seconds"] or 0.0)
        assert sum(len(page) for _, page in history._pages) <= history.page_bytes
    assert max(reach[-20:]) >= 0.75 * history.window  # dropped where they lay closest


async def test_a_churning_page_leaves_the_memory_held_flat(aiohttp_client) -> None:
    poller = stepped_poller(Churning(series=200, chars=2000))
    app = make_app(poller, run_poller=False)
    app[VERDICT].page_bytes = 2 << 20  # reached in a few polls
    client = await aiohttp_client(app)

    async def held_after_each(polls: int) -> list[int]:
        held = []
        for _ in range(polls):
            await poller.poll_once()
            for path in ("/metrics", "/verdict.json"):  # the test client would keep answers
                async with client.session.get(client.make_url(path)) as resp:
                    assert resp.status == 200
                    await resp.read()
            gc.collect()
            held.append(tracemalloc.get_traced_memory()[0])
        return held

    tracemalloc.start()
    try:
        await held_after_each(5)  # the verdict's pages reach their bytes
        first, then = await held_after_each(15), await held_after_each(15)
    finally:
        tracemalloc.stop()
    # Each page is 0.4 MB; the caches fill and start over within fifteen polls: the most
    # held over the next fifteen is no more than over the first (it would grow by pages).
    assert max(then) - max(first) < 2**20, f"{(max(then) - max(first)) / 2**20:.1f} MiB more"
