"""Evidence capture against a hostile folder, a server with secrets on its command line and a
listener anyone can reach: links and second names in the profiler folder are not followed,
secrets are masked in every part, planted files in the capture folder are neither listed
nor served, py-spy samples the process on the backend's address, the disk bound holds with
a capture in flight, and the capture folder must be the sidecar's own, behind
authentication.

The servers are real: in-process aiohttp servers on loopback, or a Python HTTP server in a
child process whose command line holds the secrets (py-spy reads it from ``/proc``).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import bcrypt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from test_capture import finished, members, settings
from test_security import Pki

from demo.stack import Inferwatch, Process, free_port
from inferwatch.capture import redact
from inferwatch.capture.store import CaptureStore, packed_bound
from inferwatch.collect.processes import server_pid
from inferwatch.serve.sidecar import make_app

from conftest import fixture_text

CAPTURE = fixture_text("vllm-0.32.0-cpu-loaded-kv-full.prom")
API_KEY = "sk-test-4f1d9a7c2e8b6d3f"
HF_TOKEN = "hf_Zq8Xv2Lm9Kp4Rt7Wn3Ys"
SHADOW = b"root:$6$SECRET-SHADOW-HASH:19000:0:99999:7:::\n"

# A server with its secrets on its command line: /metrics, and the profiler endpoints of
# vLLM, whose stop call writes a gzip trace that names the command line.
SECRET_SERVER = r"""
import gzip, json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

host, port, page, traces = sys.argv[1], int(sys.argv[2]), open(sys.argv[3], "rb").read(), sys.argv[4]

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.answer(200 if self.path == "/metrics" else 404, page, "text/plain; version=0.0.4")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/stop_profile":
            with gzip.open(f"{traces}/server.pt.trace.json.gz", "wt") as f:
                json.dump({"traceEvents": [], "argv": " ".join(sys.argv)}, f)
        self.answer(200, b"{}", "application/json")

    def answer(self, status, body, kind):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

ThreadingHTTPServer((host, port), Handler).serve_forever()
"""


def start_secret_server(tmp_path: Path, host: str, port: int) -> tuple[Process, str, Path]:
    """The child server on ``host:port``: (its process, its URL, its trace folder)."""
    page, traces = tmp_path / "page.prom", tmp_path / "traces"
    page.write_text(CAPTURE)
    traces.mkdir()
    argv = [sys.executable, "-c", SECRET_SERVER, host, str(port), str(page), str(traces)]
    argv += ["--api-key", API_KEY, f"--hf-token={HF_TOKEN}"]
    server = Process("secret-server", argv, tmp_path / "secret-server.log").start()
    url = f"http://{host}:{port}"
    server.wait_http(f"{url}/metrics", timeout=30)
    return server, url, traces


@pytest.fixture
def secret_server(tmp_path: Path) -> Iterator[tuple[Process, str, Path]]:
    server, url, traces = start_secret_server(tmp_path, "127.0.0.1", free_port())
    yield server, url, traces
    server.stop()


def opened(archive: bytes) -> dict[str, bytes]:
    """An archive's files, a gzip one decompressed."""
    return {
        name: gzip.decompress(body) if name.endswith(".gz") else body
        for name, body in members(archive).items()
    }


async def capture_once(client: TestClient) -> tuple[dict, dict[str, bytes]]:
    """Take a capture: (the listing's ``last``, the downloaded archive's files)."""
    assert (await client.post("/capture", json={})).status == 202
    last = (await finished(client))["last"]
    assert "archive" in last, last
    download = await client.get(f"/captures/{last['archive']}")
    assert download.status == 200
    return last, opened(await download.read())


def parts_of(last: dict) -> dict[str, dict]:
    return {p["name"]: p for p in last["parts"]}


# --- the profiler folder ------------------------------------------------------------------


@pytest.fixture
async def profiler_backend(aiohttp_server) -> Callable[[Callable[[], None]], Awaitable[str]]:
    """A vLLM-like server whose stop call runs ``on_stop`` (it writes the "trace")."""

    async def start(on_stop: Callable[[], None]) -> str:
        async def metrics(request: web.Request) -> web.Response:
            return web.Response(text=CAPTURE, content_type="text/plain")

        async def profile(request: web.Request) -> web.Response:
            if request.path == "/stop_profile":
                on_stop()
            return web.json_response({})

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_post("/start_profile", profile)
        app.router.add_post("/stop_profile", profile)
        server = await aiohttp_server(app)
        return str(server.make_url("")).rstrip("/")

    return start


async def test_the_trace_takes_regular_files_never_what_a_link_or_a_second_name_points_at(
    profiler_backend, poller_for, aiohttp_client, tmp_path
) -> None:
    shadow, traces = tmp_path / "shadow", tmp_path / "traces"
    shadow.write_bytes(SHADOW)
    traces.mkdir()

    def leave_a_trap() -> None:
        (traces / "engine.pt.trace.json").write_text('{"traceEvents": []}')
        (traces / "shadow.pt.trace.json").symlink_to(shadow)
        (traces / "environ.pt.trace.json").symlink_to("/proc/self/environ")
        os.link(shadow, traces / "linked.pt.trace.json")
        os.mkfifo(traces / "fifo.pt.trace.json")

    poller = poller_for(await profiler_backend(leave_a_trap))
    await poller.poll_once()
    capture = settings(tmp_path, profiler_dir=traces)
    client = await aiohttp_client(make_app(poller, run_poller=False, capture=capture))
    last, files = await capture_once(client)
    trace = parts_of(last)["profiler trace"]
    assert trace["result"] == "ok" and trace["files"] == ["trace/engine.pt.trace.json"], trace
    assert [n for n in files if n.startswith("trace/")] == ["trace/engine.pt.trace.json"]
    assert all(b"SECRET-SHADOW-HASH" not in body for body in files.values())
    assert trace["detail"] == (
        "left out: environ.pt.trace.json (a symbolic link); fifo.pt.trace.json (not a regular "
        "file); linked.pt.trace.json (a hard link: 2 names); shadow.pt.trace.json "
        "(a symbolic link)"
    )
    # What was taken was moved; what was left out is left where it was.
    assert sorted(p.name for p in traces.iterdir()) == [
        "environ.pt.trace.json",
        "fifo.pt.trace.json",
        "linked.pt.trace.json",
        "shadow.pt.trace.json",
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
async def test_a_trace_file_of_another_user_is_left_out(
    profiler_backend, poller_for, aiohttp_client, tmp_path
) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()

    def write_as_someone_else() -> None:
        (traces / "engine.pt.trace.json").write_text('{"traceEvents": []}')
        (traces / "other.pt.trace.json").write_bytes(SHADOW)
        os.chown(traces / "other.pt.trace.json", 54321, 54321)

    poller = poller_for(await profiler_backend(write_as_someone_else))
    await poller.poll_once()
    capture = settings(tmp_path, profiler_dir=traces)
    client = await aiohttp_client(make_app(poller, run_poller=False, capture=capture))
    last, files = await capture_once(client)
    trace = parts_of(last)["profiler trace"]
    assert trace["files"] == ["trace/engine.pt.trace.json"]
    assert "other.pt.trace.json (owned by uid 54321, not by the server's" in trace["detail"]
    assert all(b"SECRET-SHADOW-HASH" not in body for body in files.values())


# --- secrets ------------------------------------------------------------------------------


async def test_the_servers_secrets_are_masked_in_every_part_and_the_manifest_says_so(
    secret_server, poller_for, aiohttp_client, tmp_path
) -> None:
    server, url, traces = secret_server
    poller = poller_for(url)
    await poller.poll_once()
    capture = settings(tmp_path, profiler_dir=traces)
    client = await aiohttp_client(make_app(poller, run_poller=False, capture=capture))
    last, files = await capture_once(client)
    parts = parts_of(last)
    assert last["server_pid"] == server.pid, last
    for name in ("stacks dump", "stacks sampled", "profiler trace"):
        assert parts[name]["result"] == "ok", parts[name]
    assert {"trace/server.pt.trace.json.gz", "stacks-dump.txt", "stacks.speedscope.json"} <= set(
        files
    )
    for name, body in files.items():
        assert API_KEY.encode() not in body and HF_TOKEN.encode() not in body, name
    # py-spy's dump names the process by its command line, masked where it stands.
    masked = f"--api-key {'*' * len(API_KEY)} --hf-token={'*' * len(HF_TOKEN)}"
    assert masked in files["stacks-dump.txt"].decode()
    assert masked in json.loads(files["trace/server.pt.trace.json.gz"])["argv"]
    assert parts["stacks dump"]["redacted"] == {"--api-key": 1, "--hf-token": 1}
    assert parts["profiler trace"]["redacted"] == {"--api-key": 1, "--hf-token": 1}
    assert parts["stacks sampled"]["redacted"]["--api-key"] >= 1
    manifest = json.loads(files["manifest.json"])
    assert manifest["parts"] == last["parts"] and "masked" in manifest["redaction"]


@pytest.mark.parametrize(
    ("text", "masked", "what"),
    [
        ("vllm --api-key sk-1 --port 8000", "vllm --api-key **** --port 8000", {"--api-key": 1}),
        ("--hf-token=hf_a --password 'a b'", "--hf-token=**** --password '***'",
         {"--hf-token": 1, "--password": 1}),
        ("HF_TOKEN=hf_a\0PWD=/root\0H=X-Api-Key: k\0", "HF_TOKEN=****\0PWD=/root\0H=X-Api-Key: *\0",
         {"HF_TOKEN": 1, "X-Api-Key": 1}),
        ('{"api_key": "sk 1", "token_type": "prompt", "password": 12}',
         '{"api_key": "****", "token_type": "prompt", "password": 12}', {"api_key": 1}),
        ("Authorization: Bearer abc\nx: Bearer d", "Authorization: **********\nx: Bearer *",
         {"Authorization": 1, "Bearer": 1}),
        ("https://u:pw@h/?accessToken=t&n=1", "https://u:**@h/?accessToken=*&n=1",
         {"URL password": 1, "accessToken": 1}),
        ("--tokenizer /m --max-num-batched-tokens 8 --api-key-file /k monkey=1",
         "--tokenizer /m --max-num-batched-tokens 8 --api-key-file /k monkey=1", {}),
        ('vllm:prompt_tokens_total{token_type="prompt"} 3',
         'vllm:prompt_tokens_total{token_type="prompt"} 3', {}),
    ],
)  # fmt: skip
def test_masking_takes_values_named_like_a_secret_and_keeps_their_length(
    text: str, masked: str, what: dict[str, int]
) -> None:
    hits: Counter[str] = Counter()
    assert redact.mask(text.encode(), hits).decode() == masked
    assert hits == what


def serve_exits(*args: str) -> tuple[int, str]:
    """``inferwatch serve`` that must refuse its input: (exit code, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "inferwatch", "serve", "--backend-url", "http://127.0.0.1:9", *args],
        capture_output=True,
        text=True,
        timeout=30,  # a serve that was let start never exits: a failure, not a hang
    )
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("listen", [":{port}", "0.0.0.0:{port}"])
def test_captures_without_authentication_are_refused_on_a_listener_others_reach(
    tmp_path: Path, listen: str
) -> None:
    code, stderr = serve_exits(
        "--capture-dir",
        str(tmp_path / "captures"),
        "--web.listen-address",
        listen.format(port=free_port()),
    )
    assert code == 2
    assert stderr.strip().splitlines() == [
        "inferwatch: error: --capture-dir needs authentication: a capture holds the server's "
        "stacks, pages and trace; give a --web.config.file with basic_auth_users or client "
        "certificates (client_auth_type: RequireAndVerifyClientCert), or listen on loopback "
        "only (--web.listen-address 127.0.0.1:PORT)"
    ]


def test_tls_that_verifies_no_client_is_no_authentication_for_captures(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    tls = {"cert_file": str(pki.cert_file), "key_file": str(pki.key_file)}
    tls |= {"client_auth_type": "VerifyClientCertIfGiven", "client_ca_file": str(pki.ca_file)}
    web_config = tmp_path / "web.yml"
    web_config.write_text(json.dumps({"tls_server_config": tls}))
    code, stderr = serve_exits(
        "--capture-dir",
        str(tmp_path / "captures"),
        "--web.config.file",
        str(web_config),
        "--web.listen-address",
        f"0.0.0.0:{free_port()}",
    )
    assert code == 2
    assert stderr.startswith("inferwatch: error: --capture-dir needs authentication: ")


def test_captures_behind_basic_auth_may_listen_on_every_interface(tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web_config = tmp_path / "web.yml"
    web_config.write_text(json.dumps({"basic_auth_users": {"alice": hashed}}))
    port = free_port()
    argv = [sys.executable, "-m", "inferwatch", "serve", "--backend-url", "http://127.0.0.1:9"]
    argv += ["--gpu", "off", "--capture-dir", str(tmp_path / "captures")]
    argv += ["--web.config.file", str(web_config), "--web.listen-address", f":{port}"]
    sidecar = Process("inferwatch", argv, tmp_path / "inferwatch.log").start()
    try:
        sidecar.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=30, ok=(200, 503))
    finally:
        sidecar.stop()


# --- the capture folder -------------------------------------------------------------------


async def test_links_and_planted_files_in_the_capture_folder_are_neither_listed_nor_served(
    poller_for, aiohttp_client, tmp_path, profiler_backend
) -> None:
    poller = poller_for(await profiler_backend(lambda: None))
    await poller.poll_once()
    capture = settings(tmp_path)
    shadow = tmp_path / "shadow"
    shadow.write_bytes(SHADOW)
    planted = [f"capture-20260101T00000{i}Z-manual.tar.gz" for i in range(3)]
    (capture.directory / planted[0]).symlink_to(shadow)
    os.link(shadow, capture.directory / planted[1])
    (capture.directory / planted[2]).symlink_to("/proc/self/environ")
    client = await aiohttp_client(make_app(poller, run_poller=False, capture=capture))
    last, _ = await capture_once(client)
    listing = await (await client.get("/captures")).json()
    assert [c["name"] for c in listing["captures"]] == [last["archive"]]
    for name in planted:
        resp = await client.get(f"/captures/{name}")
        assert resp.status == 404, name
        assert SHADOW not in await resp.read()
    assert f'href="captures/{planted[0]}"' not in await (await client.get("/")).text()


def test_a_capture_folder_or_web_config_others_can_write_is_warned_about_at_start(
    tmp_path: Path,
) -> None:
    captures, web_config = tmp_path / "captures", tmp_path / "web.yml"
    captures.mkdir()
    captures.chmod(0o777)
    web_config.write_text("{}\n")
    web_config.chmod(0o666)
    args = ["--backend", "vllm", "--gpu", "off", "--capture-dir", str(captures)]
    sidecar = Inferwatch(
        tmp_path, "http://127.0.0.1:9", [*args, "--web.config.file", str(web_config)]
    )
    sidecar.start()
    sidecar.stop()
    log = (tmp_path / "inferwatch.log").read_text()
    assert (
        f"--capture-dir {captures} is writable by its group or by others (mode 777): they can "
        "change what lies beside the archives; make it writable by this user only (chmod go-w)"
    ) in log
    assert f"--web.config.file {web_config} is writable by its group or by others (mode 666)" in log


@pytest.mark.parametrize("folder", ["/", "/proc", "/proc/inferwatch", "/etc", "/usr/../sys/kernel"])
def test_a_system_folder_is_refused_as_the_capture_folder(cli, folder: str) -> None:
    got = cli("serve", "--capture-dir", folder)
    assert got.returncode == 2
    real = Path(folder).resolve()
    assert got.stderr.strip().splitlines() == [
        f"inferwatch: error: --capture-dir {folder}: {real} is a system folder; give a folder "
        "of its own"
    ]


def test_a_folder_with_files_the_sidecar_did_not_make_is_refused(cli, tmp_path: Path) -> None:
    folder = tmp_path / "home"
    folder.mkdir()
    for name in ("notes.txt", ".bashrc", "capture-x.tar.gz", "id_rsa"):
        (folder / name).write_text("")
    got = cli("serve", "--capture-dir", str(folder))
    assert got.returncode == 2
    assert got.stderr.strip().splitlines() == [
        f"inferwatch: error: --capture-dir {folder}: not empty and not a capture folder (it "
        "holds .bashrc, capture-x.tar.gz, id_rsa and 1 more); give an empty or a new folder"
    ]
    assert sorted(p.name for p in folder.iterdir()) == [
        ".bashrc",
        "capture-x.tar.gz",
        "id_rsa",
        "notes.txt",
    ]


def test_a_capture_folder_of_before_is_taken_again(tmp_path: Path) -> None:
    folder = tmp_path / "captures"
    (folder / "lost+found").mkdir(parents=True)
    (folder / "capture-20260101T000000Z-manual.tar.gz").write_bytes(b"")
    (folder / ".incomplete-abc").mkdir()  # an interrupted capture
    (folder / ".incomplete-abc.tar.gz").write_bytes(b"")
    CaptureStore(folder, 1 << 20).open()
    assert sorted(p.name for p in folder.iterdir()) == [
        "capture-20260101T000000Z-manual.tar.gz",
        "lost+found",
    ]


# --- which process py-spy samples ---------------------------------------------------------


async def test_py_spy_samples_the_process_on_the_backends_address_not_another_on_its_port(
    poller_for, aiohttp_client, tmp_path
) -> None:
    with socket.socket() as decoy:  # this process, on 127.0.0.1 and the server's port
        decoy.bind(("127.0.0.1", 0))
        decoy.listen()
        port = decoy.getsockname()[1]
        server, url, _ = start_secret_server(tmp_path, "127.0.0.3", port)
        try:
            poller = poller_for(url)
            await poller.poll_once()
            client = await aiohttp_client(
                make_app(poller, run_poller=False, capture=settings(tmp_path))
            )
            last, _ = await capture_once(client)
        finally:
            server.stop()
    assert last["server_pid"] == server.pid != os.getpid()


async def test_py_spy_takes_no_local_process_for_a_backend_on_another_host(
    poller_for, aiohttp_client, tmp_path
) -> None:
    with socket.socket() as decoy:  # this process, on every interface and the server's port
        decoy.bind(("0.0.0.0", 0))
        decoy.listen()
        port = decoy.getsockname()[1]
        remote = f"http://198.51.100.7:{port}"  # TEST-NET-2: never this host's
        assert server_pid(remote) == (
            None,
            "198.51.100.7 is not an address of this host or pod: no local process serves "
            "it, so none can be profiled",
        )
        assert server_pid(f"http://127.0.0.1:{port}")[0] == os.getpid()  # a local one is
        client = await aiohttp_client(
            make_app(poller_for(remote, timeout=0.2), run_poller=False, capture=settings(tmp_path))
        )
        last, _ = await capture_once(client)
    assert last["server_pid"] is None
    stacks = [p for p in last["parts"] if p["name"].startswith("stacks ")]
    assert stacks and all("no local process serves it" in p["detail"] for p in stacks), stacks


# --- the disk bound -----------------------------------------------------------------------

BOUND = 8 << 20


class FolderSize:
    """The most bytes a folder held (every file under it, links not followed), sampled from
    a thread until stopped."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.most = folder, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            held = 0
            for parent, _, files in os.walk(self.folder):
                for name in files:
                    try:
                        held += os.lstat(os.path.join(parent, name)).st_size
                    except OSError:  # gone meanwhile
                        continue
            self.most = max(self.most, held)
            self._stop.wait(0.0005)

    def __enter__(self) -> FolderSize:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.parametrize(
    ("trace_bytes", "old_archives", "trace_taken"),
    [(BOUND * 3 // 10, 2, True), (BOUND * 6 // 10, 0, False)],
    ids=["beside-old-archives", "too-big-for-the-bound"],
)
async def test_a_capture_in_flight_never_takes_the_folder_past_its_bound(
    profiler_backend,
    poller_for,
    aiohttp_client,
    tmp_path,
    trace_bytes: int,
    old_archives: int,
    trace_taken: bool,
) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    noise = os.urandom(trace_bytes)  # does not compress: its archive is as big

    def write_trace() -> None:
        (traces / "engine.pt.trace.json").write_bytes(noise)

    poller = poller_for(await profiler_backend(write_trace))
    await poller.poll_once()
    capture = settings(tmp_path, profiler_dir=traces, max_bytes=BOUND)
    old = [f"capture-2026010{i}T000000Z-manual.tar.gz" for i in range(old_archives)]
    for i, name in enumerate(old):
        (capture.directory / name).write_bytes(os.urandom(BOUND // 4))
        os.utime(capture.directory / name, (1e9 + i, 1e9 + i))
    client = await aiohttp_client(make_app(poller, run_poller=False, capture=capture))
    with FolderSize(capture.directory) as held:
        last, files = await capture_once(client)
    assert held.most <= BOUND, f"the folder held {held.most} bytes, over its bound {BOUND}"
    trace = parts_of(last)["profiler trace"]
    assert ("trace/engine.pt.trace.json" in files) == trace_taken, trace
    kept = sorted(p.name for p in capture.directory.glob("capture-*"))
    if trace_taken:  # room was made: the oldest archive went
        assert kept == sorted([*old[1:], last["archive"]])
    else:
        assert trace["result"] == "failed"
        assert trace["detail"].endswith(
            f"engine.pt.trace.json ({trace_bytes} bytes: it would not fit --capture-max-bytes "
            "beside the archives kept)"
        )
    assert sum((capture.directory / n).stat().st_size for n in kept) <= BOUND


def test_a_capture_archive_fits_its_packed_bound(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path / "captures", max_bytes=1 << 30)
    store.open()
    work = store.workdir()
    (work.path / "trace").mkdir()
    sizes = [0, 1, 511, 512, 100_000, 1 << 20]
    for i, size in enumerate(sizes):
        (work.path / "trace" / f"{'x' * 120}-{i}.bin").write_bytes(os.urandom(size))
    raw, count = work.size()
    assert (raw, count) == (sum(sizes), 2 + len(sizes))
    archive = store.pack(work, "capture-20260101T000000Z-manual")
    assert archive.bytes <= packed_bound(raw, count)
    with tarfile.open(fileobj=io.BytesIO((store.directory / archive.name).read_bytes())) as tar:
        assert len(tar.getmembers()) == count
