"""Text from outside never drives the terminal or splits a log line: a backend's label values
in the sidecar's log and in ``diagnose``'s report, an exporter's messages in ``inferwatch
capture``'s output. Each is run as the user runs it (a real ``inferwatch`` process), and what it
wrote must hold no control character but its own line breaks, the hostile text escaped."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from aiohttp import web

from demo.stack import Inferwatch
from inferwatch.logs import printable

from conftest import exporter_page, fixture_text

# Sets the terminal's window title, then clears the screen; a line break to forge a line.
HOSTILE = "m\x1b]0;pwned\x07\x1b[2J\u2028forged"
ESCAPED = "m\\x1b]0;pwned\\x07\\x1b[2J\\u2028forged"
# What a terminal would act on, or break a line at, besides the writer's own line breaks.
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def test_printable_escapes_control_characters_and_keeps_the_rest() -> None:
    assert printable(HOSTILE) == ESCAPED
    assert printable("a\nb\tc") == "a\\nb\\tc"
    assert printable("a\nb\x1b", lines=True) == "a\nb\\x1b"
    assert printable("naïve µs — ok") == "naïve µs — ok"


def inferwatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferwatch", *args], capture_output=True, text=True, timeout=60
    )


def test_a_backends_label_values_are_escaped_in_the_sidecars_log(tmp_path: Path) -> None:
    series = f'vllm:num_requests_running{{engine="0",model_name="{HOSTILE}"}} 1'
    page = f"{series}\n{series}\n"  # repeated: the sidecar logs the series it left out

    class Backend(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sidecar = Inferwatch(
        tmp_path,
        f"http://127.0.0.1:{server.server_address[1]}",
        ["--backend", "vllm", "--gpu", "off", "--poll-interval", "0.2"],
    )
    log = tmp_path / "inferwatch.log"
    try:
        sidecar.start()
        deadline = time.monotonic() + 20
        while "repeated" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    finally:
        sidecar.stop()
        server.shutdown()
        server.server_close()
    text = log.read_text()
    line = next(line for line in text.splitlines() if "repeated" in line)
    assert ESCAPED in line and line.startswith("ts="), line
    assert not CONTROL.search(text), repr(text)


async def test_a_backends_label_values_are_escaped_in_diagnoses_report(aiohttp_server) -> None:
    def hostile(fixture: str) -> str:
        return exporter_page(fixture_text(fixture)).replace('model="tiny"', f'model="{HOSTILE}"')

    pages = iter([hostile("vllm-0.32.0-cpu-loaded-kv-full.prom")])
    after = hostile("vllm-0.32.0-cpu-after-preemptions.prom")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=next(pages, after), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app)
    url = str(server.make_url("")).rstrip("/")
    out = await asyncio.to_thread(inferwatch, "diagnose", "--exporter", url, "--interval", "1")
    assert out.returncode == 3, out.stderr
    assert "WARNING  InferenceKVCachePressure" in out.stdout
    assert f"model={ESCAPED}" in out.stdout
    assert not CONTROL.search(out.stdout + out.stderr), repr(out.stdout)


@pytest.fixture
def chatty_exporter() -> Iterator[str]:
    """An exporter whose every message is hostile, and whose capture fails."""
    name = "capture-20260101T000000Z-manual"

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, doc: dict) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            self._send(202, {"name": name, "message": HOSTILE})

        def do_GET(self) -> None:
            last = {"name": name, "result": "failed", "error": HOSTILE}
            self._send(200, {"last": last})

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_exporters_messages_are_escaped_in_captures_output(
    chatty_exporter: str, tmp_path: Path
) -> None:
    got = inferwatch("capture", "--exporter", chatty_exporter, "--out", str(tmp_path))
    assert got.returncode == 1, got.stderr
    assert got.stderr.splitlines() == [
        f"capturing at {chatty_exporter}: {ESCAPED}",
        f"inferwatch: capture capture-20260101T000000Z-manual failed: {ESCAPED}",
    ]
    assert not CONTROL.search(got.stdout + got.stderr)
