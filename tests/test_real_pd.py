"""A real prefill/decode pair: two vLLM (CPU) instances with vLLM's disk connector
(``ExampleConnector``) between them, each request sent to the prefill instance first
(``max_tokens: 1``) and then to the decode one, as a P/D proxy sends it.

The decode instance's sidecar reads its role from its page (a KV consumer). While the KV
arrives, nearly all of the decode side's prompt tokens come by transfer and nothing is
found; when it stops arriving (the fault: each prompt's KV removed from the shared path
between the two calls, as a storage path the two do not share would leave it), the decode
side computes the prompts itself and its verdict page and ``diagnose --exporter`` name
InferenceKVTransferMissing first.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from demo.browser import chromium
from demo.stack import Inferwatch, VllmServer
from demo.traffic import complete

pytestmark = pytest.mark.vllm

GIVE_UP = 120.0  # a guard against a hang, not a bound on how fast anything must be
EXPECT = "InferenceKVTransferMissing"
# The demo's timing: a short rate window, evaluated every second, the alert's for 5 s.
CONFIG = """\
poll_interval: 0.25
alerting:
  rate_window: 15s
  evaluation_interval: 1s
  for:
    InferenceKVTransferMissing: 5s
"""


def connector(role: str, path: Path) -> list[str]:
    config = {
        "kv_connector": "ExampleConnector",
        "kv_role": role,
        "kv_connector_extra_config": {"shared_storage_path": str(path)},
    }
    return ["--kv-transfer-config", json.dumps(config)]


async def pd_traffic(prefill: str, decode: str, stop: asyncio.Event, lose_kv: Path | None) -> int:
    """Requests one after another, each to the prefill instance then the decode one, until
    ``stop``; with ``lose_kv``, what the prefill stored there is gone before the decode
    call. Returns the requests the decode side answered."""
    done = 0
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            prompt = f"request {done}: " + " ".join(["alpha beta gamma delta"] * 40)
            assert await complete(session, prefill, prompt, 1) == 200
            if lose_kv is not None:
                for stored in lose_kv.iterdir():
                    shutil.rmtree(stored)
            assert await complete(session, decode, prompt, 16) == 200
            done += 1
    return done


async def verdict(url: str) -> dict:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/verdict.json") as r:
        return await r.json()


def held(doc: dict) -> list[str]:
    """The findings that held for their alert's ``for``, as the page ranks them."""
    return [f["alert"] for f in doc["findings"] if not f.get("pending")]


def test_a_decode_side_whose_kv_stops_arriving_is_named(tmp_path: Path) -> None:
    shared = tmp_path / "kv"
    shared.mkdir()
    config = tmp_path / "inferwatch.yaml"
    config.write_text(CONFIG)
    prefill = VllmServer(tmp_path / "prefill", connector("kv_producer", shared))
    decode = VllmServer(tmp_path / "decode", connector("kv_consumer", shared))
    for server in (prefill, decode):
        server.workdir.mkdir()
    sidecar = None
    try:
        prefill.start()
        decode.start()
        sidecar = Inferwatch(
            tmp_path, decode.url, ["--backend", "vllm", "--gpu", "off", "--config", str(config)]
        ).start()

        async def run() -> tuple[dict, dict, dict, str, int, int]:
            stop = asyncio.Event()
            traffic = asyncio.create_task(pd_traffic(prefill.url, decode.url, stop, None))
            await asyncio.sleep(20)  # more than a rate window of the pair at work
            healthy = await verdict(sidecar.url)
            stop.set()
            served = await traffic
            stop = asyncio.Event()
            traffic = asyncio.create_task(pd_traffic(prefill.url, decode.url, stop, shared))
            deadline = time.monotonic() + GIVE_UP
            try:
                while EXPECT not in held(doc := await verdict(sidecar.url)):
                    assert time.monotonic() < deadline, doc["findings"]
                    await asyncio.sleep(1)
                # With the fault on: diagnose --exporter over a window of its own, and the
                # page as served.
                judged = await diagnose_exporter(sidecar.url)
                async with aiohttp.ClientSession() as session, session.get(sidecar.url) as r:
                    html = await r.text()
            finally:
                stop.set()
                lost = await traffic
            return healthy, doc, judged, html, served, lost

        healthy, faulted, judged, html, served, lost = asyncio.run(run())
    finally:
        if sidecar is not None:
            sidecar.stop()
        decode.stop()
        prefill.stop()
    # The KV arrived (the decode side's page says decode): the alert is not even pending.
    print(f"\nhealthy: {served} requests, findings {held(healthy)}; with the KV lost: {lost}")
    assert served and EXPECT not in [f["alert"] for f in healthy["findings"]], healthy["findings"]
    # It stopped arriving: the cause, ranked first, with what the decode side computed.
    assert held(faulted)[0] == EXPECT, held(faulted)
    (finding,) = [f for f in faulted["findings"] if f["alert"] == EXPECT]
    share = [e for e in finding["evidence"] if e["signal"] == "kv_transfer_prompt_share"]
    print(f"verdict: {held(faulted)}; evidence {share}")
    assert share and share[0]["value"] < 0.5, finding["evidence"]
    # diagnose --exporter, judging alone over the next window, names it first too.
    named = [f["alert"] for f in judged["findings"]]
    print(f"diagnose --exporter: {named}")
    assert named and named[0] == EXPECT, named
    # The verdict page as a browser renders it, with a screenshot to look at.
    page = tmp_path / "verdict.html"
    page.write_text(html)
    shot = tmp_path / "verdict.png"
    taken = chromium(
        f"--screenshot={shot}", "--window-size=1200,1400", "--hide-scrollbars", page.as_uri(),
        profile=tmp_path / "chromium",
    )  # fmt: skip
    assert taken.returncode == 0, taken.stderr
    print(f"verdict page: {shot}")
    dom = chromium("--dump-dom", page.as_uri(), profile=tmp_path / "chromium").stdout
    assert EXPECT in dom


async def diagnose_exporter(url: str) -> dict:
    """``inferwatch diagnose --exporter URL --json`` over one rate window (15 s)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "inferwatch", "diagnose", "--exporter", url,
        "--interval", "15", "--json",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), timeout=GIVE_UP)
    return json.loads(out)
