"""Files that hold secrets: capture archives are for the sidecar's user only, and a real
``inferwatch serve`` warns at start about secrets files others can read (the web config's
password hashes, the TLS key, bearer tokens) and about password hashes cheap to crack."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest
from test_capture import settings
from test_capture_security import capture_once
from test_security import Pki, bcrypt_hash

from demo.stack import Process, free_port
from inferwatch.serve.sidecar import make_app


async def test_capture_archives_are_for_the_sidecars_user_only(
    poller_for, backend_url, aiohttp_client, tmp_path: Path
) -> None:
    capture = settings(tmp_path)
    capture.directory.chmod(0o755)  # a folder made by the operator, open to all
    client = await aiohttp_client(
        make_app(poller_for(backend_url), run_poller=False, capture=capture)
    )
    last, files = await capture_once(client)
    assert "manifest.json" in files
    archive = capture.directory / last["archive"]
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600


def serve_log(workdir: Path, web_config: dict, mode: int, token_mode: int) -> str:
    """The start-up log of ``inferwatch serve`` with ``web_config`` (its file and the TLS
    key at ``mode``) and a bearer token file at ``token_mode``."""
    config_file = workdir / "web.yml"
    config_file.write_text(json.dumps(web_config))
    token = workdir / "token"
    token.write_text("tok-secret\n")
    for path, each in ((config_file, mode), (workdir / "server.key", mode), (token, token_mode)):
        path.chmod(each)
    port = free_port()
    argv = [
        sys.executable, "-m", "inferwatch", "serve", "--gpu", "off",
        "--backend-url", "http://127.0.0.1:9", "--backend-bearer-token-file", str(token),
        "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(config_file),
    ]  # fmt: skip
    log = workdir / f"serve-{mode:o}.log"
    process = Process("inferwatch", argv, log).start()
    try:
        process.wait_http(f"https://127.0.0.1:{port}/healthz", timeout=30, ok=(200, 503))
    finally:
        process.stop()
    return log.read_text()


def test_secrets_others_can_read_and_cheap_hashes_are_warned_about_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = Pki(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca_file))  # the readiness wait trusts it
    tls = {"cert_file": "server.crt", "key_file": "server.key"}
    cheap = {"tls_server_config": tls, "basic_auth_users": {"alice": bcrypt_hash("pw", cost=4)}}
    log = serve_log(tmp_path, cheap, 0o644, 0o604)
    config, key, token = tmp_path / "web.yml", tmp_path / "server.key", tmp_path / "token"
    for line in (
        f"--web.config.file {config} is readable by others (mode 644) and holds password hashes",
        f"key_file {key} is readable by others (mode 644) and holds the TLS private key",
        f"--backend-bearer-token-file {token} is readable by others (mode 604) and holds a token",
        "basic_auth_users.alice: bcrypt cost 4 is below 10: a stolen hash is cheap to crack; "
        "make one with htpasswd -nBC 10",
    ):
        assert line in log, log
    assert "$2b$04$" not in log  # the hash itself is never shown
    kept = {"tls_server_config": tls, "basic_auth_users": {"alice": bcrypt_hash("pw", cost=10)}}
    log = serve_log(tmp_path, kept, 0o640, 0o600)
    assert "readable by others" not in log and "bcrypt cost" not in log, log
