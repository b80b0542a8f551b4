"""What the exporter's clients refuse, each against loopback servers: a redirect (the poll,
the profiler's calls, the canary), credentials with an ``@`` in the password (start-up log,
verdict page, capture manifest), a hostile archive name or size (``inferwatch capture``),
and a canary whose Authorization is set twice."""

from __future__ import annotations

import base64
import json
import logging
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from test_canary import Fake, Sleeps, run_until
from test_capture import finished, members

import inferwatch
from demo.stack import Inferwatch, http_get
from inferwatch.capture.capturer import CaptureSettings
from inferwatch.capture.store import CaptureStore
from inferwatch.collect.backends import VLLM
from inferwatch.collect.canary import Canary, CanarySettings
from inferwatch.collect.poller import Poller, PollSettings
from inferwatch.collect.upstream import Upstream, UpstreamError
from inferwatch.serve.command import OPTIONS, ServeConfig
from inferwatch.serve.sidecar import make_app
from inferwatch.settings import resolve
from inferwatch.urls import redact_url

from conftest import fixture_text, page_value, thread_server

CAPTURE = fixture_text("vllm-0.32.0-cpu-loaded-kv-full.prom")
SECRET = "s3cret-api-key"
NOT_FOLLOWED = "(redirects are not followed)"


@dataclass
class Site:
    """A loopback server that records every request; a path in ``redirects`` answers
    ``(status, Location)``, /metrics the real vLLM capture, anything else ``{}``."""

    redirects: dict[str, tuple[int, str]] = field(default_factory=dict)
    seen: list[tuple[str, str]] = field(default_factory=list)  # (method, path)
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.method, request.path))
        if request.path in self.redirects:
            status, location = self.redirects[request.path]
            return web.Response(status=status, headers={"Location": location})
        if request.path == "/metrics":
            return web.Response(text=CAPTURE, content_type="text/plain")
        return web.json_response({})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


@pytest.fixture
async def site(aiohttp_server):
    """Makes Sites on loopback ports."""

    async def make() -> Site:
        made = Site()
        server = await aiohttp_server(made.app())
        made.url = str(server.make_url("")).rstrip("/")
        return made

    return make


@pytest.fixture
async def poller_with_header():
    """A vLLM poller of ``url`` sending ``X-Api-Key: SECRET``; closed at teardown."""
    made: list[Poller] = []

    def make(url: str) -> Poller:
        upstream = Upstream(url, timeout=2.0, max_bytes=1 << 24, headers={"X-Api-Key": SECRET})
        made.append(Poller(upstream, VLLM, None, PollSettings(interval=0.2)))
        return made[-1]

    yield make
    for poller in made:
        await poller.upstream.close()


# --- item 3: redirects are never followed --------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 307, 308])
@pytest.mark.parametrize("target", ["other", "same origin"])
async def test_a_redirected_poll_fails_and_nothing_reaches_the_target(
    status: int, target: str, site, poller_with_header, aiohttp_client, caplog
) -> None:
    home, other = await site(), await site()
    location, shown = {
        "other": (f"http://user:pw@{other.url.removeprefix('http://')}/metrics", other.url),
        "same origin": ("/real/metrics", home.url),
    }[target]
    home.redirects["/metrics"] = (status, location)
    poller = poller_with_header(home.url)
    client = await aiohttp_client(make_app(poller, run_poller=False))
    with caplog.at_level(logging.WARNING, logger="inferwatch.poller"):
        await poller.poll_once()
    page = await (await client.get("/metrics")).text()
    assert page_value(page, "inferwatch_backend_up", backend="vllm") == 0.0
    cause = f"HTTP {status} from {home.url}/metrics redirects to {shown} {NOT_FOLLOWED}"
    assert poller.snapshot.collectors["backend"].error == cause
    assert cause in caplog.text and "pw" not in caplog.text and SECRET not in caplog.text
    assert other.seen == []
    assert home.seen == [("GET", "/metrics")]  # no hop, not even at home
    with pytest.raises(UpstreamError) as failed:
        await poller.upstream.get_exposition("/metrics")
    assert failed.value.kind == "redirect"


async def test_the_profiler_calls_are_not_redirected_with_their_header(
    site, poller_with_header, aiohttp_client, tmp_path: Path
) -> None:
    home, other = await site(), await site()
    home.redirects["/start_profile"] = (307, f"{other.url}/start_profile")
    home.redirects["/stop_profile"] = (307, f"{other.url}/stop_profile")
    poller = poller_with_header(home.url)
    await poller.poll_once()
    directory, traces = tmp_path / "captures", tmp_path / "traces"
    traces.mkdir()
    CaptureStore(directory, 1 << 30).open()
    capture = CaptureSettings(directory, seconds=1.0, min_interval=0.0, profiler_dir=traces)
    client = await aiohttp_client(make_app(poller, run_poller=False, capture=capture))
    assert (await client.post("/capture", json={})).status == 202
    last = (await finished(client))["last"]
    profiler = {p["name"]: p for p in last["parts"]}["profiler trace"]
    assert profiler["result"] == "failed"
    start = f"{home.url}/start_profile"
    assert profiler["detail"].startswith(
        f"HTTP 307 from {start} redirects to {other.url} {NOT_FOLLOWED}"
    )
    assert other.seen == []
    assert ("POST", "/start_profile") in home.seen


async def test_a_redirected_canary_probe_fails_and_nothing_reaches_the_target(
    site, aiohttp_server
) -> None:
    home, other = await site(), Fake()
    other.url = str((await aiohttp_server(other.app())).make_url("")).rstrip("/")
    home.redirects["/v1/completions"] = (307, f"{other.url}/v1/completions")
    canary = Canary(CanarySettings(home.url, model="m", api_key=SECRET))
    try:
        sample = await canary.probe_once()
    finally:
        await canary.close()
    assert sample is not None and sample.kind == "http_error" and sample.status == 307
    where = f"{home.url}/v1/completions"
    assert sample.error == f"HTTP 307 from {where} redirects to {other.url} {NOT_FOLLOWED}"
    assert other.bodies == [] and other.headers == []
    assert canary.sample(0.0, None).probes["http_error"] == 1


# --- item 7: a password holding an @ ---------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://admin:p@ss-SECRET@vllm:8000/metrics", "http://vllm:8000/metrics"),
        ("http://a@b:c@d@[::1]:8000", "http://[::1]:8000"),
        ("http://vllm:8000/a@b?c=d@e", "http://vllm:8000/a@b?c=d@e"),  # not the authority's
        ("http://u:p@vllm:8000?q=@x", "http://vllm:8000?q=@x"),
        ("http://[::1:8000", "http://[::1:8000"),  # unparsable: shown as given, no error
    ],
)
def test_redaction_takes_the_authority_up_to_its_last_at(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.fixture
def basic_auth_backend() -> Iterator[tuple[str, list[str]]]:
    """The real capture at /metrics from a thread (the exporter is another process), and
    the passwords of the basic auth it received."""
    passwords: list[str] = []

    def answer(request: BaseHTTPRequestHandler) -> tuple[int, bytes]:
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            passwords.append(base64.b64decode(auth[6:]).decode().partition(":")[2])
        return 200, CAPTURE.encode() if request.path == "/metrics" else b"{}"

    with thread_server(answer) as address:
        yield address, passwords


def test_a_password_with_an_at_never_shows(basic_auth_backend, tmp_path: Path) -> None:
    where, passwords = basic_auth_backend
    sidecar = Inferwatch(
        tmp_path,
        f"http://admin:p@ss-SECRET@{where}",
        ["--backend", "vllm", "--gpu", "off", "--capture-dir", str(tmp_path / "captures"),
         "--capture-seconds", "1", "--canary", "on"],
    ).start()  # fmt: skip
    try:
        _, landing = http_get(f"{sidecar.url}/")
        got = inferwatch_command("capture", "--exporter", sidecar.url, "--out", str(tmp_path))
    finally:
        sidecar.stop()
    assert "p@ss-SECRET" in passwords  # the server was sent the whole password
    log = (tmp_path / "inferwatch.log").read_text()
    assert f"backend at http://{where} every" in log
    assert f"probe of the backend's model at http://{where} every" in log
    assert f"http://{where}/metrics" in landing.decode()
    assert got.returncode == 0, got.stderr
    manifest = json.loads(members(Path(got.stdout.splitlines()[0]).read_bytes())["manifest.json"])
    assert manifest["backend_url"] == f"http://{where}/metrics"
    for shown in (log, landing.decode(), json.dumps(manifest), got.stdout + got.stderr):
        assert "SECRET" not in shown and "admin" not in shown


@pytest.mark.parametrize("delimiter", ["/", "?", "#"])
@pytest.mark.parametrize("where", ["flag", "environment", "config", "diagnose", "capture"])
def test_a_password_with_an_unencoded_delimiter_is_refused_unshown(
    delimiter: str, where: str, tmp_path: Path
) -> None:
    url = f"http://admin:1234{delimiter}S3cret@127.0.0.1:9"  # read as host admin, port 1234
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")}
    argv = {
        "flag": ["serve", "--backend-url", url],
        "environment": ["serve"],
        "config": ["serve", "--config", str(tmp_path / "c.yaml")],
        "diagnose": ["diagnose", "--prometheus", url],
        "capture": ["capture", "--exporter", url],
    }[where]
    if where == "environment":
        env["INFERWATCH_BACKEND_URL"] = url
    (tmp_path / "c.yaml").write_text(json.dumps({"backend_url": url}))
    got = subprocess.run(
        [sys.executable, "-m", "inferwatch", *argv],
        capture_output=True, text=True, env=env, timeout=30,
    )  # fmt: skip
    assert got.returncode == 2, got.stderr
    [line] = got.stderr.splitlines()
    assert line.endswith(
        "a URL with an '@' past its host part is refused (not shown): in a user or password, "
        "percent-encode '/' '?' '#' '@' as %2F %3F %23 %40"
    ), line
    assert "S3cret" not in line and "1234" not in line and "admin" not in line


def test_a_percent_encoded_password_reaches_the_server_and_never_shows(
    basic_auth_backend, tmp_path: Path
) -> None:
    where, passwords = basic_auth_backend
    args = ["--backend", "vllm", "--gpu", "off"]
    sidecar = Inferwatch(tmp_path, f"http://admin:1234%2FS3cret@{where}", args).start()
    try:
        deadline = time.monotonic() + 20
        while "1234/S3cret" not in passwords:
            assert time.monotonic() < deadline, passwords
            time.sleep(0.1)
    finally:
        sidecar.stop()
    log = (tmp_path / "inferwatch.log").read_text()
    assert f"backend at http://{where} every" in log
    assert "S3cret" not in log and "1234" not in log


# --- item 6: the capture client saves under --out, by a plain name, within --max-bytes --------


def inferwatch_command(*args: str) -> subprocess.CompletedProcess[str]:
    """``inferwatch ARGS`` as a separate process, from the package these tests import."""
    exporter = str(Path(inferwatch.__file__).parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([exporter, os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "inferwatch", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


CAPTURE_ID = "capture-20260101T000000Z-manual"
ARCHIVE = f"{CAPTURE_ID}.tar.gz"


@pytest.fixture
def fake_exporter() -> Iterator[Any]:
    """An exporter whose capture completes at once, named and sized as the test sets
    (``server.id``, ``server.archive``, ``server.body``; ``server.length`` False: no
    Content-Length)."""

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: bytes, length: bool = True) -> None:
            self.send_response(status)
            if length:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            self._send(202, json.dumps({"name": server.id, "message": "started"}).encode())

        def do_GET(self) -> None:
            if self.path == "/captures":
                last = {"name": server.id, "archive": server.archive, "parts": [], "result": "ok"}
                self._send(200, json.dumps({"last": last}).encode())
            else:
                self._send(200, server.body, server.length)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.id, server.archive, server.body, server.length = CAPTURE_ID, ARCHIVE, b"archive", True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield server
    server.shutdown()
    server.server_close()


def everything_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# The operator's files the hostile exporter of issue #49 named its archive after.
OPERATORS = {".bashrc": b"# mine\n", "Makefile": b"all:\n"}


def operators_folder(out: Path) -> Path:
    out.mkdir()
    for name, text in OPERATORS.items():
        (out / name).write_bytes(text)
    return out


@pytest.mark.parametrize(
    "name",
    [
        ".bashrc", "Makefile", "../escaped.txt", "ABSOLUTE", "sub/escaped.txt", "..", ".", "",
        "a\\b", "a\x00b", 7, f"{CAPTURE_ID}-x.tar.gz", "capture-20260101T000000Z-other.tar.gz",
        f"{CAPTURE_ID}.tar", f"x{ARCHIVE}",
    ],
)  # fmt: skip
def test_capture_refuses_an_archive_name_that_is_not_its_captures(
    name: object, fake_exporter, tmp_path: Path
) -> None:
    out = operators_folder(tmp_path / "out")
    fake_exporter.archive = str(tmp_path / "escaped.txt") if name == "ABSOLUTE" else name
    got = inferwatch_command("capture", "--exporter", fake_exporter.url, "--out", str(out))
    assert got.returncode == 5, got.stderr
    assert got.stderr.splitlines()[-1].startswith(
        f"inferwatch: error: the exporter named the archive of {CAPTURE_ID} "
    )
    assert got.stderr.splitlines()[-1].endswith(f": not {ARCHIVE}")
    assert "Traceback" not in got.stderr and got.stdout == ""
    assert everything_under(tmp_path) == ["out", *(f"out/{n}" for n in sorted(OPERATORS))]
    assert all((out / n).read_bytes() == text for n, text in OPERATORS.items())


@pytest.mark.parametrize("capture_id", [".bashrc", "Makefile", "capture-1-manual", "", None])
def test_capture_refuses_a_capture_id_it_cannot_name_a_file_after(
    capture_id: object, fake_exporter, tmp_path: Path
) -> None:
    out = operators_folder(tmp_path / "out")
    fake_exporter.id = capture_id
    fake_exporter.archive = f"{capture_id}.tar.gz" if capture_id is not None else ARCHIVE
    got = inferwatch_command("capture", "--exporter", fake_exporter.url, "--out", str(out))
    assert got.returncode == 5, got.stderr
    assert got.stderr.splitlines()[-1] == (
        f"inferwatch: error: the exporter named its capture {capture_id!r}: "
        "not capture-<time>-<trigger>"
    )
    assert everything_under(out) == sorted(OPERATORS)


def test_capture_never_replaces_a_file(fake_exporter, tmp_path: Path) -> None:
    mine = tmp_path / ARCHIVE
    mine.write_bytes(b"an earlier capture")
    got = inferwatch_command("capture", "--exporter", fake_exporter.url, "--out", str(tmp_path))
    assert got.returncode == 5, got.stderr
    assert got.stderr.splitlines()[-1] == (
        f"inferwatch: error: {mine} exists already; it is not replaced"
    )
    assert mine.read_bytes() == b"an earlier capture"
    assert everything_under(tmp_path) == [ARCHIVE]  # and no partial file


@pytest.mark.parametrize("length", [True, False])
def test_capture_bounds_the_download_and_leaves_nothing_behind(
    length: bool, fake_exporter, tmp_path: Path
) -> None:
    fake_exporter.body, fake_exporter.length = b"x" * 5000, length
    small = inferwatch_command(
        "capture", "--exporter", fake_exporter.url, "--out", str(tmp_path), "--max-bytes", "4999"
    )
    assert small.returncode == 5, small.stderr
    assert small.stderr.splitlines()[-1] == (
        f"inferwatch: error: download of {ARCHIVE}: larger than 4999 bytes (--max-bytes)"
    )
    assert everything_under(tmp_path) == []
    fake_exporter.archive = f"{CAPTURE_ID}-2.tar.gz"  # the exporter's second of that second
    whole = inferwatch_command(
        "capture", "--exporter", fake_exporter.url, "--out", str(tmp_path), "--max-bytes", "5000"
    )
    assert whole.returncode == 0, whole.stderr
    assert whole.stdout.splitlines()[0] == str(tmp_path / ARCHIVE)
    assert everything_under(tmp_path) == [ARCHIVE]
    assert (tmp_path / ARCHIVE).read_bytes() == fake_exporter.body
    assert stat.S_IMODE((tmp_path / ARCHIVE).stat().st_mode) == 0o600


# --- item 9: the canary's Authorization, and a probe that raises ---------------------------


@pytest.mark.parametrize("mode", ["on", "auto"])  # auto probes where TTFT is missing
@pytest.mark.parametrize(
    ("flags", "sources"),
    [
        ({"backend_url": "http://u:pw@127.0.0.1:8000"}, "--backend-url user:password@"),
        (
            {"canary_url": "http://u:pw@127.0.0.1:9000", "backend_url": "http://127.0.0.1:8000"},
            "--canary-url user:password@",
        ),
    ],
)
def test_the_canary_may_not_get_two_authorizations(
    flags: dict[str, str], sources: str, mode: str, cli, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text(SECRET)
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]
    got = cli("serve", *argv, "--canary", mode, "--canary-bearer-token-file", str(token))
    assert got.returncode == 2
    assert got.stderr.strip() == (
        f"inferwatch: error: the canary's Authorization header is set by {sources} and "
        "--canary-bearer-token-file; give one"
    )
    assert "pw" not in got.stderr and SECRET not in got.stderr


def test_the_canary_may_have_its_own_url_and_token_beside_backend_credentials(
    tmp_path: Path,
) -> None:
    token = tmp_path / "token"
    token.write_text(SECRET)
    flags = {
        "backend_url": "http://u:pw@127.0.0.1:8000",
        "canary": "on",
        "canary_url": "http://127.0.0.1:9000",
        "canary_bearer_token_file": token,
    }
    settings = ServeConfig.from_values(resolve(OPTIONS, flags, {}, {})).canary_settings()
    assert settings is not None and settings.api_key == SECRET
    off = {**flags, "canary": "off", "canary_url": None}
    assert ServeConfig.from_values(resolve(OPTIONS, off, {}, {})).canary_settings() is None


async def test_a_probe_that_raises_is_counted_and_served(
    site, poller_with_header, aiohttp_client, caplog
) -> None:
    server = await site()
    # What start-up now refuses: URL credentials and a token, which aiohttp will not combine.
    where = server.url.replace("http://", "http://u:pw@")
    canary = Canary(CanarySettings(where, model="m", api_key=SECRET, interval=1.0))
    try:
        with caplog.at_level(logging.DEBUG, logger="inferwatch"):
            await run_until(canary, Sleeps(), 3)
        probes = canary.sample(0.0, None).probes
        assert probes["bad_stream"] >= 3 and sum(probes.values()) == probes["bad_stream"]
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert [r.getMessage() for r in warnings] == [
            "canary probe failing: the probe raised ValueError: Cannot combine AUTHORIZATION "
            "header with AUTH argument or credentials encoded in URL"
        ]
        assert all(r.exc_info is None for r in warnings)
        poller = poller_with_header(server.url)
        poller.register("canary", canary)
        app_client = await aiohttp_client(make_app(poller, run_poller=False))
        await poller.poll_once()
        page = await (await app_client.get("/metrics")).text()
    finally:
        await canary.close()
    failed = page_value(
        page, "inferwatch_canary_probes_total", result="bad_stream", backend="vllm", model="m"
    )
    assert failed == probes["bad_stream"]
    assert [m for m, _ in server.seen] == ["GET"] * len(server.seen)  # no probe got there
