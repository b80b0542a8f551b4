"""The HTTP app against hostile clients, through the real aiohttp app: a page on another origin
in a real headless Chromium cannot start a capture (CSRF), a rebound host name is not answered
(DNS rebinding), a flood of wrong passwords is refused beyond the password-check slots while a
known scraper is answered, and malformed requests are one log line per kind."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import json
import logging
import os
import shutil
import signal
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import bcrypt
import pytest
from aiohttp import web

from demo.stack import Inferwatch, chromium
from inferwatch.capture.capturer import CaptureSettings
from inferwatch.capture.store import CaptureStore
from inferwatch.serve import basic_auth
from inferwatch.serve.basic_auth import CHECK_SLOTS, BasicAuthUsers
from inferwatch.serve.request_checks import host_names
from inferwatch.serve.sidecar import make_app
from inferwatch.serve.web import CAPTURER, RENDERER
from inferwatch.serve.webconfig import WebConfig

from conftest import fixture_text

CAPTURE = fixture_text("vllm-0.32.0-cpu-loaded-kv-full.prom")
PASSWORD = "correct horse battery staple"
GUARD = 60.0  # seconds: a guard against a hang, not a speed bound
JSON = {"Content-Type": "application/json"}


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.fixture
def capture(tmp_path: Path) -> CaptureSettings:
    settings = CaptureSettings(directory=tmp_path / "captures", seconds=1.0, min_interval=0.0)
    CaptureStore(settings.directory, settings.max_bytes).open()
    return settings


def no_capture_started(app: web.Application) -> bool:
    capturer = app[CAPTURER]
    return not capturer.running and capturer.last is None and capturer.store.archives() == []


@contextlib.asynccontextmanager
async def headless_chromium(url: str, profile: Path) -> AsyncIterator[None]:
    """Chromium showing ``url`` until the caller is done with it."""
    browser = shutil.which("chromium")
    assert browser is not None, "no chromium on PATH (make debs installs it)"
    process = await asyncio.create_subprocess_exec(
        browser,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        f"--user-data-dir={profile}",
        url,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,  # its renderers and helpers go with it
    )
    try:
        yield
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        await process.wait()


# -- CSRF and DNS rebinding (item 4) ---------------------------------------------------------

ATTACK = """<!DOCTYPE html>
<html><body>
<iframe name="sink"></iframe>
<form id="form" method="POST" action="{target}/capture" target="sink">
<input name="seconds" value="5"></form>
<script>
document.getElementById("form").submit();
const simple = fetch("{target}/capture", {{method: "POST", mode: "no-cors", body: "{{}}"}})
  .then(r => r.type, e => e.name);
const json = fetch("{target}/capture",
  {{method: "POST", headers: {{"Content-Type": "application/json"}}, body: "{{}}"}})
  .then(r => String(r.status), e => e.name);
Promise.all([simple, json]).then(got => fetch("/done", {{method: "POST", body: JSON.stringify(got)}}));
</script>
</body></html>
"""


async def test_a_page_on_another_origin_cannot_start_a_capture_in_chromium(
    poller_for, backend_url, capture, aiohttp_server, tmp_path: Path
) -> None:
    app = make_app(poller_for(backend_url), run_poller=False, capture=capture)
    answered: list[tuple[str, str, int]] = []  # (method, Content-Type, status) at the exporter
    form_answered = asyncio.Event()

    async def record(request: web.Request, response: web.StreamResponse) -> None:
        media = request.headers.get("Content-Type", "")
        answered.append((request.method, media, response.status))
        if media == "application/x-www-form-urlencoded":
            form_answered.set()

    app.on_response_prepare.append(record)
    exporter = await aiohttp_server(app)
    target = str(exporter.make_url("")).rstrip("/")

    reports: list[list[str]] = []
    done = asyncio.Event()

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=ATTACK.format(target=target), content_type="text/html")

    async def report(request: web.Request) -> web.Response:
        reports.append(json.loads(await request.text()))
        done.set()
        return web.Response()

    attacker = web.Application()
    attacker.router.add_get("/", page)
    attacker.router.add_post("/done", report)
    site = await aiohttp_server(attacker)  # 127.0.0.1 too, another port: another origin
    async with headless_chromium(str(site.make_url("/")), tmp_path / "profile"):
        await asyncio.wait_for(asyncio.gather(done.wait(), form_answered.wait()), GUARD)

    # The form and the no-cors fetch reached the exporter and were refused; the JSON fetch
    # never left the browser: its preflight was refused, and nothing answers CORS.
    assert reports == [["opaque", "TypeError"]]
    posts = [(media, status) for method, media, status in answered if method == "POST"]
    assert sorted(posts) == [
        ("application/x-www-form-urlencoded", 403),
        ("text/plain;charset=UTF-8", 403),
    ]
    assert all(status >= 400 for _, _, status in answered), answered
    assert no_capture_started(app)

    # The exporter's own origin, as JSON, still starts one.
    same_origin = {**JSON, "Origin": target, "Sec-Fetch-Site": "same-origin"}
    async with (
        aiohttp.ClientSession() as client,
        client.post(f"{target}/capture", headers=same_origin, data="{}") as resp,
    ):
        assert resp.status == 202, await resp.text()


@pytest.mark.parametrize(
    ("headers", "status", "reason"),
    [
        ({**JSON, "Sec-Fetch-Site": "cross-site"}, 403, "another origin (Sec-Fetch-Site)"),
        ({**JSON, "Sec-Fetch-Site": "same-site"}, 403, "another origin (Sec-Fetch-Site)"),
        ({**JSON, "Origin": "http://evil.example"}, 403, "its Origin is not this Host"),
        ({**JSON, "Origin": "null"}, 403, "its Origin is not this Host"),
        ({}, 415, "POST needs Content-Type: application/json"),
        ({"Content-Type": "text/plain"}, 415, "POST needs Content-Type: application/json"),
    ],
    ids=["cross-site", "same-site", "another-origin", "opaque-origin", "no-body", "text-plain"],
)
async def test_a_cross_origin_or_simple_post_is_refused_even_with_the_password(
    poller_for, backend_url, capture, aiohttp_client, headers, status, reason
) -> None:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4))
    web_config = WebConfig(users=BasicAuthUsers({"alice": hashed}))
    app = make_app(
        poller_for(backend_url), run_poller=False, web_config=web_config, capture=capture
    )
    client = await aiohttp_client(app)
    refused = await client.post("/capture", headers={**basic("alice", PASSWORD), **headers})
    assert refused.status == status
    assert (await refused.text()).strip().endswith(reason)
    assert no_capture_started(app)
    # The checks come before the password, which still applies to a same-origin JSON POST.
    origin = str(client.make_url("")).rstrip("/")
    own = {**JSON, "Origin": origin, "Sec-Fetch-Site": "same-origin"}
    assert (await client.post("/capture", headers=own, data="{}")).status == 401
    accepted = await client.post("/capture", headers={**own, **basic("alice", PASSWORD)}, data="{}")
    assert accepted.status == 202


async def test_only_the_allowed_host_names_are_answered(
    poller_for, backend_url, aiohttp_client
) -> None:
    app = make_app(poller_for(backend_url), run_poller=False, allowed_hosts=("127.0.0.1",))
    client = await aiohttp_client(app)
    rebound = {"Host": f"rebind.test:{client.port}"}
    refused = await client.get("/metrics", headers=rebound)
    assert refused.status == 403
    assert await refused.text() == "this Host is not one of --web.allowed-host\n"
    assert (await client.get("/", headers=rebound)).status == 403
    assert (await client.get("/healthz", headers=rebound)).status in (200, 503)  # no data
    assert (await client.get("/metrics")).status == 200
    # Without the option only the listen address's own names are (tests/test_host_names.py).
    own = await aiohttp_client(make_app(poller_for(backend_url), run_poller=False))
    assert (await own.get("/metrics", headers=rebound)).status == 403
    assert (await own.get("/metrics")).status == 200


def test_web_allowed_host_reaches_the_server_and_refuses_a_rebound_name_in_chromium(
    tmp_path: Path,
) -> None:
    sidecar = Inferwatch(
        tmp_path,
        "http://127.0.0.1:9",
        ["--backend", "vllm", "--gpu", "off", "--web.allowed-host", "127.0.0.1,localhost"],
    ).start()
    try:
        # DNS rebinding: the attacker's name now resolves to the exporter's address.
        rebound = f"http://rebind.test:{sidecar.port}/metrics"
        dom = chromium(
            "--host-resolver-rules=MAP rebind.test 127.0.0.1",
            "--dump-dom",
            rebound,
            profile=tmp_path / "profile",
        ).stdout
        assert "this Host is not one of --web.allowed-host" in dom, dom
        assert "inferwatch_build_info" not in dom
        for host in ("127.0.0.1", "LOCALHOST"):
            connection = http.client.HTTPConnection("127.0.0.1", sidecar.port, timeout=10)
            connection.request("GET", "/metrics", headers={"Host": f"{host}:{sidecar.port}"})
            answer = connection.getresponse()
            assert answer.status == 200 and b"inferwatch_build_info" in answer.read()
            connection.close()
    finally:
        sidecar.stop()


@pytest.mark.parametrize("text", ["a:80", "[::1]:9", "::1", "http://a", "a/b", "u@a", "a:"])
def test_allowed_hosts_are_names_without_ports(text: str) -> None:
    with pytest.raises(ValueError, match="not a host name or address without a port"):
        host_names(text)


def test_allowed_hosts_are_compared_as_the_host_header_names_them() -> None:
    assert host_names(" Example.COM,127.0.0.1,[::1] ,") == ("example.com", "127.0.0.1", "::1")


# -- the password checks under a flood (item 5) ----------------------------------------------


class GatedBcrypt:
    """bcrypt that holds every wrong password's check until :meth:`release`: a slow hash
    the test controls. ``entered`` counts the checks that reached bcrypt."""

    def __init__(self, loop: asyncio.AbstractEventLoop, good: bytes) -> None:
        self.good = good
        self.entered = 0
        self.reached: dict[int, asyncio.Event] = {}
        self._loop = loop
        self._gate = threading.Event()
        self._lock = threading.Lock()
        self._real: Callable[[bytes, bytes], bool] = bcrypt.checkpw

    def reach(self, count: int) -> asyncio.Event:
        """Set once ``count`` wrong passwords have reached bcrypt."""
        return self.reached.setdefault(count, asyncio.Event())

    def checkpw(self, password: bytes, hashed: bytes) -> bool:
        if password != self.good:
            with self._lock:
                self.entered += 1
                count = self.entered
            if count in self.reached:
                self._loop.call_soon_threadsafe(self.reached[count].set)
            self._gate.wait()
        return self._real(password, hashed)

    def release(self) -> None:
        self._gate.set()


@pytest.fixture
async def gated(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[GatedBcrypt]:
    gate = GatedBcrypt(asyncio.get_running_loop(), PASSWORD.encode())
    monkeypatch.setattr(basic_auth.bcrypt, "checkpw", gate.checkpw)
    yield gate
    gate.release()  # even when the test failed: no thread is left waiting


async def test_a_flood_beyond_the_check_slots_is_refused_at_once_and_a_scraper_answered(
    poller_for, backend_url, aiohttp_client, gated: GatedBcrypt
) -> None:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4))
    web_config = WebConfig(users=BasicAuthUsers({"alice": hashed}))
    poller = poller_for(backend_url)
    app = make_app(poller, run_poller=False, web_config=web_config)
    client = await aiohttp_client(app)
    scraper = basic("alice", PASSWORD)
    assert (await client.get("/metrics", headers=scraper)).status == 200  # its pass is cached

    def wrong(i: int) -> asyncio.Task[aiohttp.ClientResponse]:
        return asyncio.ensure_future(client.get("/metrics", headers=basic("alice", f"guess {i}")))

    held = [wrong(i) for i in range(CHECK_SLOTS)]
    await asyncio.wait_for(gated.reach(CHECK_SLOTS).wait(), GUARD)  # every slot is taken
    flood = asyncio.ensure_future(asyncio.gather(*(wrong(i) for i in range(CHECK_SLOTS, 50))))
    one_more_in_bcrypt = asyncio.ensure_future(gated.reach(CHECK_SLOTS + 1).wait())
    finished, _ = await asyncio.wait(
        {flood, one_more_in_bcrypt}, timeout=GUARD, return_when=asyncio.FIRST_COMPLETED
    )
    one_more_in_bcrypt.cancel()
    assert finished == {flood}, f"{gated.entered} checks reached bcrypt; the flood queued"
    refusals = flood.result()
    assert [r.status for r in refusals] == [503] * len(refusals)
    assert {r.headers["Retry-After"] for r in refusals} == {"1"}

    # While every slot is held, polls go on and the scraper with its cached pass is answered
    # with a page rendered for it: rendering never waits for a password check.
    await poller.poll_once()
    assert app[RENDERER].cached() is None
    answer = await client.get("/metrics", headers=scraper)
    assert (
        answer.status == 200 and 'inferwatch_backend_up{backend="vllm"} 1.0' in await answer.text()
    )
    assert not any(task.done() for task in held)

    gated.release()
    assert [(await task).status for task in held] == [401] * CHECK_SLOTS


async def test_wrong_passwords_do_not_push_a_scrapers_pass_out_of_the_cache(
    poller_for, backend_url, aiohttp_client, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[bytes] = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        checked.append(password)
        return real(password, hashed)

    monkeypatch.setattr(basic_auth.bcrypt, "checkpw", counting)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4))
    web_config = WebConfig(users=BasicAuthUsers({"alice": hashed}))
    client = await aiohttp_client(
        make_app(poller_for(backend_url), run_poller=False, web_config=web_config)
    )
    scraper = basic("alice", PASSWORD)
    assert (await client.get("/metrics", headers=scraper)).status == 200
    for i in range(2 * basic_auth._CACHE_SIZE):  # one at a time: never beyond the slots
        assert (await client.get("/metrics", headers=basic("alice", f"guess {i}"))).status == 401
    assert (await client.get("/metrics", headers=scraper)).status == 200
    assert checked.count(PASSWORD.encode()) == 1  # the pass was still cached


# -- malformed requests in the log (item 12) -------------------------------------------------

SECRET = "s3cr3t-in-the-request"
MALFORMED = [
    f"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Token: {SECRET}\x01\r\n\r\n",  # control character
    f"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Token: {SECRET}\x02\r\n\r\n",
    f"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Token: {SECRET}\x7f\r\n\r\n",
    f"POST /capture HTTP/1.1\r\nHost: x\r\nContent-Length: {SECRET}\r\n\r\n",
    f"GET /{SECRET} HTTP/1.1 and more\r\nHost: x\r\n\r\n",  # a bad request line
    f"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Token: {SECRET}{'a' * 10000}\r\n\r\n",  # too long
    f"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Other: {SECRET}{'b' * 10000}\r\n\r\n",
]


async def test_malformed_requests_are_one_line_per_kind_without_their_bytes(
    poller_for, backend_url, aiohttp_server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    server = await aiohttp_server(make_app(poller_for(backend_url), run_poller=False))
    for raw in MALFORMED:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(raw.encode("latin-1"))
        answer = await reader.read()  # the server answers and hangs up
        writer.close()
        await writer.wait_closed()
        assert answer.startswith(b"HTTP/1.0 400 Bad Request"), answer[:80]
    # The access log (off in `inferwatch serve`, on in the test server) is left out.
    served = [r for r in caplog.records if r.name != "aiohttp.access"]
    assert [r.getMessage() for r in served] == [
        f"refused a malformed HTTP request ({kind}; 0 more held back since the last line)"
        for kind in ("BadHttpMessage", "BadStatusLine", "LineTooLong")
    ]
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in served)
    assert SECRET not in caplog.text
