"""Evidence capture's rules, in front of a loopback server serving a real vLLM capture: what
an archive holds, one capture at a time, the minimum interval, the disk bound, the alert
trigger, polls going on meanwhile, the routes' auth, and ``inferwatch capture``.

The real profiler and the alert on a real fault: tests/test_capture_real.py.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import bcrypt
import pytest
from aiohttp import encode_basic_auth

from demo.stack import Inferwatch, http_json
from inferwatch.capture.capturer import CaptureSettings
from inferwatch.capture.store import CaptureStore, OverBound
from inferwatch.method.alerts import ALERTS
from inferwatch.method.findings import Finding
from inferwatch.serve.sidecar import make_app
from inferwatch.serve.verdict import Verdict
from inferwatch.serve.web import CAPTURER
from inferwatch.serve.webconfig import load as load_web_config

from conftest import fixture_text, page_value, thread_server

CAPTURE = fixture_text("vllm-0.32.0-cpu-loaded-kv-full.prom")
STALL = "InferenceQueuedWhileIdle"


def settings(tmp_path: Path, **overrides: object) -> CaptureSettings:
    values = {"directory": tmp_path / "captures", "seconds": 1.0, "min_interval": 0.0}
    CaptureStore(values["directory"], 1).open()  # type: ignore[arg-type]
    return CaptureSettings(**{**values, **overrides})  # type: ignore[arg-type]


async def finished(client) -> dict:
    """The capture listing once no capture runs (a guard, not a speed bound)."""
    for _ in range(1200):
        doc = await (await client.get("/captures")).json()
        if not doc["running"] and doc["last"] is not None:
            return doc
        await asyncio.sleep(0.05)
    raise AssertionError("the capture never finished")


def members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {
            m.name.split("/", 1)[1]: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


async def test_an_archive_holds_pages_verdict_stacks_and_says_what_was_not_possible(
    poller_for, backend_url, aiohttp_client, tmp_path
) -> None:
    poller = poller_for(backend_url)
    await poller.poll_once()
    client = await aiohttp_client(make_app(poller, run_poller=False, capture=settings(tmp_path)))
    resp = await client.post("/capture", json={})
    assert resp.status == 202
    name = (await resp.json())["name"]
    doc = await finished(client)
    last = doc["last"]
    assert last["name"] == name and last["trigger"] == "manual"
    assert [c["name"] for c in doc["captures"]] == [last["archive"]]
    download = await client.get(f"/captures/{last['archive']}")
    assert download.status == 200
    assert download.headers["Content-Type"] == "application/gzip"
    files = members(await download.read())
    assert files["server-metrics-before.txt"].decode() == CAPTURE
    assert b"inferwatch_requests_waiting" in files["inferwatch-metrics-after.txt"]
    assert json.loads(files["verdict.json"])["state"] in ("collecting", "healthy", "findings")
    manifest = json.loads(files["manifest.json"])
    parts = {p["name"]: p for p in manifest["parts"]}
    profiler = parts["profiler trace"]
    assert profiler["result"] == "not_possible"
    assert "--capture-profiler-dir not given" in profiler["detail"]
    # The loopback server runs in this very process: py-spy finds it by its port.
    assert manifest["server_pid"] == os.getpid()
    assert parts["stacks dump"]["result"] == "ok", parts["stacks dump"]
    # This process's stack at the trigger: pytest's own frames under the event loop.
    assert "(_pytest/" in files["stacks-dump.txt"].decode()
    assert manifest["result"] == last["result"] == "ok"
    page = await (await client.get("/")).text()
    assert f'href="captures/{last["archive"]}"' in page


async def test_one_capture_at_a_time_and_no_sooner_than_the_minimum_interval(
    poller_for, backend_url, aiohttp_client, tmp_path
) -> None:
    poller = poller_for(backend_url)
    await poller.poll_once()
    app = make_app(poller, run_poller=False, capture=settings(tmp_path, min_interval=3600.0))
    client = await aiohttp_client(app)
    assert (await client.post("/capture", json={})).status == 202
    busy = await client.post("/capture", json={})
    assert busy.status == 409 and (await busy.json())["result"] == "busy"
    await finished(client)
    soon = await client.post("/capture", json={})
    assert soon.status == 429
    assert 3500 < int(soon.headers["Retry-After"]) <= 3600
    assert "minimum interval is 3600 s" in (await soon.json())["message"]
    await poller.poll_once()
    page = await (await client.get("/metrics")).text()
    for result in ("ok", "busy", "too_soon"):
        value = page_value(page, "inferwatch_captures_total", trigger="manual", result=result)
        assert value == 1.0, result
    assert page_value(page, "inferwatch_last_capture_timestamp_seconds") > 1.7e9
    assert len(app[CAPTURER].store.archives()) == 1


async def test_polls_go_on_while_a_capture_runs(
    poller_for, backend_url, aiohttp_client, tmp_path
) -> None:
    poller = poller_for(backend_url, interval=0.05)
    client = await aiohttp_client(make_app(poller, capture=settings(tmp_path, seconds=2.0)))
    while poller.last_poll_at is None:
        await asyncio.sleep(0.01)
    assert (await client.post("/capture", json={})).status == 202
    polls = set()
    while (await (await client.get("/captures")).json())["running"]:
        polls.add(poller.last_poll_at)
        assert (await client.get("/metrics")).status == 200
        await asyncio.sleep(0.05)
    assert len(polls) >= 5, "polls stopped while the capture ran"


def test_the_store_deletes_the_oldest_archives_to_make_room_for_a_capture(tmp_path: Path) -> None:
    # Room for a 100 kB capture and its archive (both on disk while it is packed) beside one
    # archive of 100 kB: a capture that does not compress needs about twice its size.
    store = CaptureStore(tmp_path / "captures", max_bytes=350_000)
    store.open()
    names = []
    for i in range(4):
        work = store.workdir()
        (work.path / "noise.bin").write_bytes(os.urandom(100_000))  # does not compress
        archive = store.pack(work, f"capture-20261201T00000{i}Z-manual")
        names.append(archive.name)
        os.utime(store.directory / archive.name, (1e9 + i, 1e9 + i))
    kept = [a.name for a in store.archives()]
    assert kept == [names[3], names[2]], kept  # newest first
    assert not list(store.directory.glob(".incomplete-*"))
    # A capture that cannot fit even alone is not packed, and no archive is deleted for it.
    small = CaptureStore(store.directory, max_bytes=150_000)
    work = small.workdir()
    (work.path / "noise.bin").write_bytes(os.urandom(100_000))
    with pytest.raises(OverBound, match="do not fit --capture-max-bytes 150000"):
        small.pack(work, "capture-20261201T000009Z-manual")
    assert [a.name for a in small.archives()] == kept
    assert not list(store.directory.glob(".incomplete-*"))


@pytest.mark.parametrize(
    "path",
    ["/captures/..%2F..%2Fetc%2Fpasswd", "/captures/capture-x.tar.gz", "/captures/manifest.json"],
)
async def test_downloads_name_only_archives_of_the_store(
    poller_for, backend_url, aiohttp_client, tmp_path, path: str
) -> None:
    client = await aiohttp_client(
        make_app(poller_for(backend_url), run_poller=False, capture=settings(tmp_path))
    )
    assert (await client.get(path)).status == 404


async def test_capture_routes_need_the_web_configs_password(
    poller_for, backend_url, aiohttp_client, tmp_path
) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    config_file = tmp_path / "web-config.yml"
    config_file.write_text(json.dumps({"basic_auth_users": {"alice": hashed}}))  # JSON is YAML
    web_config = load_web_config(config_file)
    app = make_app(
        poller_for(backend_url), run_poller=False, web_config=web_config, capture=settings(tmp_path)
    )
    client = await aiohttp_client(app)
    assert (await client.post("/capture", json={})).status == 401
    assert (await client.get("/captures")).status == 401
    password = {"Authorization": encode_basic_auth("alice", "s3cret")}
    ok = await client.post("/capture", headers=password, json={})
    assert ok.status == 202


async def test_captures_off_by_default(poller_for, backend_url, aiohttp_client) -> None:
    client = await aiohttp_client(make_app(poller_for(backend_url), run_poller=False))
    for resp in (await client.post("/capture", json={}), await client.get("/captures")):
        assert resp.status == 404
        assert "captures are off" in (await resp.json())["error"]


async def test_a_cause_held_for_its_for_triggers_one_capture_per_spell(
    poller_for, backend_url, aiohttp_client, tmp_path
) -> None:
    poller = poller_for(backend_url)
    await poller.poll_once()
    app = make_app(
        poller, run_poller=False, capture=settings(tmp_path, on=(STALL,), min_interval=3600.0)
    )
    await aiohttp_client(app)
    capturer = app[CAPTURER]
    now = [1000.0]
    capturer._clock = lambda: now[0]
    held = Verdict("findings", True, 10.0, "none", "", findings=(Finding(ALERTS[STALL], {}, ()),))
    quiet = Verdict("healthy", True, 10.0, "none", "")
    for_seconds = 60.0  # InferenceQueuedWhileIdle's default `for`: 1m
    for at, verdict in ((0, held), (for_seconds - 1, held)):
        now[0] = 1000.0 + at
        capturer.observe(verdict)
    assert not capturer.running and capturer.last_started is None
    now[0] = 1000.0 + for_seconds
    capturer.observe(held)
    assert capturer.running
    now[0] += 5
    capturer.observe(held)  # the same spell: nothing more
    while capturer.running:
        await asyncio.sleep(0.05)
    assert capturer.counts == {(STALL, "ok"): 1}
    # A new spell within the minimum interval: refused, counted once.
    for step in (1, 2, 3 + for_seconds, 4 + for_seconds):
        now[0] += step
        capturer.observe(quiet if step == 1 else held)
    assert capturer.counts == {(STALL, "ok"): 1, (STALL, "too_soon"): 1}


# --- the command line ---------------------------------------------------------------------


@pytest.fixture
def loopback_backend() -> Iterator[str]:
    """The real capture at /metrics, from a thread (the exporter is another process)."""

    def answer(request: BaseHTTPRequestHandler) -> tuple[int, bytes]:
        return (200 if request.path == "/metrics" else 404), CAPTURE.encode()

    with thread_server(answer) as address:
        yield f"http://{address}"


def test_inferwatch_capture_downloads_the_archive(cli, loopback_backend, tmp_path) -> None:
    captures = tmp_path / "captures"
    sidecar = Inferwatch(
        tmp_path,
        loopback_backend,
        ["--backend", "vllm", "--gpu", "off", "--capture-dir", str(captures),
         "--capture-seconds", "1", "--capture-min-interval", "3600"],
    ).start()  # fmt: skip
    try:
        got = cli("capture", "--exporter", sidecar.url, "--out", str(tmp_path))
        assert got.returncode == 0, got.stderr
        archive = Path(got.stdout.splitlines()[0])
        assert archive.parent == tmp_path and archive.name.endswith("-manual.tar.gz")
        assert "server-metrics-before.txt" in members(archive.read_bytes())
        assert "  profiler trace: not_possible: --capture-profiler-dir not given" in got.stdout
        again = cli("capture", "--exporter", sidecar.url, "--out", str(tmp_path))
        assert again.returncode == 1 and "minimum interval is 3600 s" in again.stderr
        listing = http_json(f"{sidecar.url}/captures")
        assert [c["name"] for c in listing["captures"]] == [archive.name]
    finally:
        sidecar.stop()
    off = Inferwatch(tmp_path / "off", loopback_backend, ["--backend", "vllm", "--gpu", "off"])
    (tmp_path / "off").mkdir()
    off.start()
    try:
        refused = cli("capture", "--exporter", off.url)
        assert refused.returncode == 5 and "captures are off" in refused.stderr
    finally:
        off.stop()


def test_capture_options_are_checked_before_serving(cli, tmp_path) -> None:
    bad = cli("serve", "--capture-on", "InferenceNoSuchThing", "--capture-dir", str(tmp_path))
    assert bad.returncode == 2 and "not an inferwatch alert: InferenceNoSuchThing" in bad.stderr
    config = tmp_path / "inferwatch.yaml"
    config.write_text(f"capture_on: [{STALL}, InferenceNoSuchThing]\n")
    listed = cli("serve", "--config", str(config), "--capture-dir", str(tmp_path))
    assert (
        listed.returncode == 2 and "not an inferwatch alert: InferenceNoSuchThing" in listed.stderr
    )
    lonely = cli("serve", "--capture-on", STALL)
    assert lonely.returncode == 2 and "need --capture-dir" in lonely.stderr
    blocked = tmp_path / "file"
    blocked.write_text("")
    cant = cli("serve", "--capture-dir", str(blocked / "sub"))
    assert cant.returncode == 2 and "--capture-dir" in cant.stderr
    assert len(cant.stderr.strip().splitlines()) == 1
