"""What a server or a config says stays data on the sidecar's pages: the config's values that
become URLs and selectors are refused unless they are one, the runbook page escapes raw HTML,
and every answer carries a Content-Security-Policy under which no script runs. Proven in a
real headless Chromium against the real aiohttp app: a script injected into the runbook page,
or put on a page of the app, neither runs nor starts a capture (same-origin, as JSON: what the
CSRF checks let through)."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from demo.stack import chromium
from inferwatch.capture.capturer import CaptureSettings
from inferwatch.capture.store import CaptureStore
from inferwatch.method.spec import spec_from_config
from inferwatch.serve.sidecar import make_app
from inferwatch.serve.web import CAPTURER, CONTENT_SECURITY_POLICY
from inferwatch.serve.webconfig import WebConfig

# A synchronous same-origin JSON POST, so that the capture is started (or not) before
# Chromium dumps the page; the page then says what the exporter answered.
SCRIPT = (
    'var x = new XMLHttpRequest(); x.open("POST", "/capture", false); '
    'x.setRequestHeader("Content-Type", "application/json"); x.send("{}"); '
    'document.body.insertAdjacentHTML("beforeend", "<p id=injected>" + x.status + "</p>");'
)
# Out of the runbook's PromQL code block, a script, and back into a block.
SELECTOR = f"job=\"x\"}}\n```\n<script>{SCRIPT}</script>\n<img src=x onerror='{SCRIPT}'>\n```\nup{{"


def inferwatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferwatch", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("alerting", "fragment"),
    [
        ({"runbook_url_base": "javascript:alert(1)//"}, "is not an http:// or https:// URL"),
        ({"runbook_url_base": "data:text/html,<script>"}, "is not an http:// or https:// URL"),
        ({"runbook_url_base": "https://a b/"}, "holds a space or a control character"),
        ({"runbook_url_base": 7}, "expected an http:// or https:// URL"),
        ({"exporter_selector": SELECTOR}, "is not a PromQL label matcher list"),
        ({"exporter_selector": 'job="x"} or vector(1) #'}, "is not a PromQL label matcher list"),
        ({"exporter_selector": "job=`a\nb`"}, "is not a PromQL label matcher list"),
        ({"exporter_selector": ""}, "is not a PromQL label matcher list"),
        ({"exporter_selector": "job"}, "is not a PromQL label matcher list"),
    ],
)
def test_urls_and_selectors_of_the_config_are_refused_unless_they_are_one(
    tmp_path: Path, alerting: dict, fragment: str
) -> None:
    config = tmp_path / "inferwatch.yaml"
    config.write_text(yaml.safe_dump({"alerting": alerting}))
    got = inferwatch("generate", "--config", str(config), "--out", str(tmp_path / "out"))
    assert got.returncode == 2, got.stderr
    [line] = got.stderr.splitlines()
    assert line.startswith("inferwatch: error: alerting.") and fragment in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "selector",
    ['job="inferwatch"', "job=~'a|b', namespace != \"x\",", "job=`raw\\`", 'a="\\"q\\""'],
)
def test_a_label_matcher_list_is_a_selector(selector: str) -> None:
    assert spec_from_config({"alerting": {"exporter_selector": selector}}).exporter_selector


def test_a_url_base_is_kept() -> None:
    base = "https://runbooks.example/inferwatch/"
    assert spec_from_config({"alerting": {"runbook_url_base": base}}).runbook_url_base == base


@pytest.fixture
def capture(tmp_path: Path) -> CaptureSettings:
    settings = CaptureSettings(directory=tmp_path / "captures", seconds=1.0, min_interval=0.0)
    CaptureStore(settings.directory, settings.max_bytes).open()
    return settings


async def test_no_injected_script_runs_on_the_sidecars_pages_in_chromium(
    poller_for, backend_url, capture, aiohttp_server, tmp_path: Path
) -> None:
    # The selector as a config could have set it before it was checked.
    spec = dataclasses.replace(spec_from_config({}), exporter_selector=SELECTOR)
    app = make_app(poller_for(backend_url), run_poller=False, spec=spec, capture=capture)
    posts: list[int] = []

    async def record(request: web.Request, response: web.StreamResponse) -> None:
        if request.method == "POST":
            posts.append(response.status)

    async def own_script(request: web.Request) -> web.Response:
        """A page of the app with a script in it: only the policy stops it."""
        page = f"<!DOCTYPE html><html><body><p>page</p><script>{SCRIPT}</script></body></html>"
        return web.Response(text=page, content_type="text/html")

    app.on_response_prepare.append(record)
    app.router.add_get("/own-script", own_script)
    server = await aiohttp_server(app)
    for path in ("/runbooks/InferenceBackendDown", "/own-script"):
        url = str(server.make_url(path))
        dom = (await asyncio.to_thread(chromium, "--dump-dom", url, profile=tmp_path / "p")).stdout
        assert "<p>" in dom, dom  # the page was shown
        assert 'id="injected"' not in dom, dom
    assert posts == []
    capturer = app[CAPTURER]
    assert not capturer.running and capturer.last is None


async def test_the_runbook_page_shows_raw_html_as_text(
    poller_for, backend_url, aiohttp_client
) -> None:
    spec = dataclasses.replace(spec_from_config({}), exporter_selector=SELECTOR)
    client = await aiohttp_client(make_app(poller_for(backend_url), run_poller=False, spec=spec))
    page = await (await client.get("/runbooks/InferenceBackendDown")).text()
    assert "<script>" not in page and "<img src=x" not in page
    assert "&lt;script&gt;var x = new XMLHttpRequest();" in page
    assert "&lt;img src=x onerror=" in page


@pytest.mark.parametrize(
    "path", ["/", "/runbooks/InferenceBackendDown", "/metrics", "/verdict.json", "/nowhere"]
)
async def test_every_answer_carries_the_policy(
    poller_for, backend_url, aiohttp_client, path: str
) -> None:
    client = await aiohttp_client(make_app(poller_for(backend_url), run_poller=False))
    resp = await client.get(path)
    assert resp.headers.getall("Content-Security-Policy") == [CONTENT_SECURITY_POLICY]
    assert "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY
    assert "script-src" not in CONTENT_SECURITY_POLICY  # default-src 'none': no script at all


async def test_a_policy_of_the_web_config_is_enforced_beside_ours(
    poller_for, backend_url, aiohttp_client
) -> None:
    web_config = WebConfig(headers={"Content-Security-Policy": "default-src 'self'"})
    app = make_app(poller_for(backend_url), run_poller=False, web_config=web_config)
    resp = await (await aiohttp_client(app)).get("/")
    policies = resp.headers.getall("Content-Security-Policy")
    assert sorted(policies) == sorted(["default-src 'self'", CONTENT_SECURITY_POLICY])
