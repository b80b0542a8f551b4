"""Exporter security against real processes: TLS and basic auth from ``--web.config.file``
(exporter-toolkit format) with a real TLS client, mutual TLS, and a backend that demands a
bearer token or an API-key header. No secret may reach a log, a page or an error."""

from __future__ import annotations

import asyncio
import base64
import datetime
import http.client
import ipaddress
import json
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import bcrypt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from demo.stack import Inferwatch, Process, StackError, free_port, http_get
from inferwatch.serve import basic_auth, webconfig
from inferwatch.serve.command import OPTIONS, ServeConfig
from inferwatch.settings import ConfigError, header_line, read_secret, resolve

from conftest import fixture_text

PASSWORD = "correct horse battery staple"
TOKEN = "tok-3f9c1e7d2b8a4c6e"
API_KEY = "key-9d2e4b7a1c3f5e8d"
CAPTURE = fixture_text("vllm-0.32.0-cpu-loaded-kv-full.prom")


# -- certificates ------------------------------------------------------------------------


class Pki:
    """A throwaway CA with a server certificate for 127.0.0.1 and a client certificate."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        self._ca = self._certificate("inferwatch test CA", self._ca_key, None, ca=True)
        self.ca_file = self._write("ca.crt", self._ca)
        self.cert_file, self.key_file = self._leaf("server", ExtendedKeyUsageOID.SERVER_AUTH)
        self.client_cert, self.client_key = self._leaf("client", ExtendedKeyUsageOID.CLIENT_AUTH)

    def _certificate(
        self,
        name: str,
        key: ec.EllipticCurvePrivateKey,
        usage: x509.ObjectIdentifier | None,
        ca: bool = False,
    ) -> x509.Certificate:
        now = datetime.datetime.now(datetime.timezone.utc)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        issuer = subject if ca else self._ca.subject
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if usage is not None:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if usage == ExtendedKeyUsageOID.SERVER_AUTH:
            san = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(self._ca_key, hashes.SHA256())

    def _leaf(self, name: str, usage: x509.ObjectIdentifier) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        key_file = self.folder / f"{name}.key"
        key_file.write_bytes(key_pem)
        return self._write(f"{name}.crt", self._certificate(name, key, usage)), key_file

    def _write(self, name: str, cert: x509.Certificate) -> Path:
        path = self.folder / name
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    def client_context(self, with_certificate: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        if with_certificate:
            ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx


@pytest.fixture
def pki(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Pki:
    """The PKI, trusted by urllib's default context in this process (``SSL_CERT_FILE``), so
    demo.stack's readiness wait can reach an https ``/healthz``."""
    pki = Pki(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca_file))
    return pki


def basic(user: str, password: str) -> dict[str, str]:
    """The Authorization header for basic auth (aiohttp 3.14 deprecates ``BasicAuth``)."""
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def bcrypt_hash(password: str, cost: int = 4) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=cost)).decode()


def start_tls_exporter(
    workdir: Path, web_config: dict[str, Any], name: str = "web-config.yml"
) -> tuple[Process, str]:
    """``inferwatch serve`` with ``web_config``, polling a port nobody listens on."""
    config_file = workdir / name
    config_file.write_text(json.dumps(web_config))  # JSON is YAML
    port = free_port()
    argv = [
        sys.executable, "-m", "inferwatch", "serve",
        "--backend", "vllm",
        "--backend-url", f"http://127.0.0.1:{free_port()}",
        "--web.listen-address", f"127.0.0.1:{port}",
        "--web.config.file", str(config_file),
        "--log.level", "debug",
    ]  # fmt: skip
    process = Process(name, argv, workdir / f"{name}.log").start()
    url = f"https://127.0.0.1:{port}"
    process.wait_http(f"{url}/healthz", timeout=30)  # /healthz needs no password
    return process, url


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in started:
        process.stop()


# -- TLS and basic auth --------------------------------------------------------------------


async def test_tls_and_basic_auth_with_a_real_client(pki: Pki, tmp_path: Path, processes) -> None:
    hsts = "max-age=31536000"
    config = {
        "tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"},
        "http_server_config": {"headers": {"Strict-Transport-Security": hsts}},
        "basic_auth_users": {"alice": bcrypt_hash(PASSWORD)},
    }
    process, url = start_tls_exporter(tmp_path, config)  # cert paths relative to the file
    processes.append(process)
    connector = aiohttp.TCPConnector(ssl=pki.client_context())
    async with aiohttp.ClientSession(connector=connector) as client:
        wrong = ({}, basic("alice", "wrong"), basic("bob", PASSWORD), {"Authorization": "Basic"})
        for headers in wrong:
            for path in ("/metrics", "/"):
                async with client.get(url + path, headers=headers) as resp:
                    assert resp.status == 401, (headers, path)
                    assert resp.headers["WWW-Authenticate"] == "Basic"
                    assert resp.headers["Strict-Transport-Security"] == hsts
        right = basic("alice", PASSWORD)
        for _ in range(3):  # later scrapes hit the verification cache
            async with client.get(f"{url}/metrics", headers=right) as resp:
                assert resp.status == 200
                assert resp.headers["Strict-Transport-Security"] == hsts
                assert "inferwatch_build_info{" in await resp.text()
        async with client.get(f"{url}/healthz") as resp:
            assert resp.status == 200  # health checks need no credential
        async with client.get(f"{url}/", headers=right) as resp:
            landing = await resp.text()
    # Plain HTTP to the TLS port gets no answer, and an unverified server is refused.
    with pytest.raises((OSError, http.client.HTTPException)):
        http_get(url.replace("https://", "http://") + "/healthz")
    trusts_nothing = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    async with aiohttp.ClientSession() as client:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await client.get(f"{url}/healthz", ssl=trusts_nothing)
    log = process.log.read_text()
    assert "TLS on, basic auth for 1 user(s)" in log
    for secret in (PASSWORD, config["basic_auth_users"]["alice"]):
        assert secret not in log
        assert secret not in landing


async def test_mutual_tls_needs_a_client_certificate(pki: Pki, tmp_path: Path, processes) -> None:
    config = {
        "tls_server_config": {
            "cert_file": str(pki.cert_file),
            "key_file": str(pki.key_file),
            "client_auth_type": "RequireAndVerifyClientCert",
            "client_ca_file": str(pki.ca_file),
            "min_version": "TLS13",
        }
    }
    config_file = tmp_path / "mtls.yml"
    config_file.write_text(json.dumps(config))
    port = free_port()
    argv = [sys.executable, "-m", "inferwatch", "serve", "--backend-url", "http://127.0.0.1:9"]
    argv += ["--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(config_file)]
    process = Process("mtls", argv, tmp_path / "mtls.log").start()
    processes.append(process)
    url = f"https://127.0.0.1:{port}/healthz"
    async with aiohttp.ClientSession() as client:
        # demo.stack's readiness wait cannot present a certificate: retry the request itself.
        deadline = time.monotonic() + 30
        while True:
            assert process.alive(), process.tail()
            try:
                async with client.get(url, ssl=pki.client_context(with_certificate=True)) as resp:
                    assert resp.status in (200, 503)  # answered: the handshake passed
                    break
            except aiohttp.ClientConnectorError:
                assert time.monotonic() < deadline, process.tail()
                await asyncio.sleep(0.2)
        with pytest.raises(aiohttp.ClientError):
            async with client.get(url, ssl=pki.client_context()) as resp:
                await resp.read()


# -- a backend that wants a bearer token or an API key -------------------------------------


class ProtectedBackend:
    """A loopback vLLM look-alike, like vLLM behind ``--api-key`` or an auth proxy: 401 unless
    the request carries the bearer token or the API-key header. Threaded, so the exporter
    processes can poll it while the test blocks."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bool]] = []
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                ok = self.headers.get("Authorization") == f"Bearer {TOKEN}"
                ok = ok or self.headers.get("X-Api-Key") == API_KEY
                backend.seen.append((self.path, ok))
                if not ok:
                    self._send(401, "text/plain", b"missing or bad credentials\n")
                elif self.path == "/metrics":
                    self._send(200, "text/plain; version=0.0.4", CAPTURE.encode())
                elif self.path == "/version":
                    self._send(200, "application/json", b'{"version": "0.32.0"}')
                else:
                    self._send(404, "text/plain", b"not found\n")

            def _send(self, status: int, ctype: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def protected_backend() -> Iterator[ProtectedBackend]:
    backend = ProtectedBackend()
    yield backend
    backend.stop()


def wait_for_metric(exporter: Inferwatch, name: str, value: float, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while exporter.metric(name) != value:
        if time.monotonic() > deadline:
            raise StackError(f"{name} never became {value}:\n{exporter.process.tail()}")
        time.sleep(0.1)


def test_backend_credentials_are_sent_and_never_shown(protected_backend, tmp_path: Path) -> None:
    token_file = tmp_path / "bearer-token"
    token_file.write_text(f"{TOKEN}\n")  # trailing newline, as `kubectl create secret` keeps
    debug = ["--backend", "vllm", "--log.level", "debug"]
    exporters = {
        "token": Inferwatch(
            tmp_path / "token",
            protected_backend.url,
            [*debug, "--backend-bearer-token-file", str(token_file)],
        ),
        "header": Inferwatch(
            tmp_path / "header",
            protected_backend.url,
            [*debug, "--backend-header", f"X-Api-Key: {API_KEY}"],
        ),
        "none": Inferwatch(tmp_path / "none", protected_backend.url, debug),
    }
    pages = []
    try:
        for exporter in exporters.values():
            exporter.start()
        wait_for_metric(exporters["token"], "inferwatch_backend_up", 1.0)
        wait_for_metric(exporters["header"], "inferwatch_backend_up", 1.0)
        assert exporters["token"].metric("inferwatch_requests_waiting") == 20.0
        info = "inferwatch_backend_info"
        assert exporters["header"].metric(info, 'version="0.32.0"') == 1.0  # /version too
        assert exporters["none"].metric("inferwatch_backend_up") == 0.0
        assert {path for path, ok in protected_backend.seen if ok} >= {"/metrics", "/version"}
        for exporter in exporters.values():
            pages += [http_get(f"{exporter.url}{path}")[1].decode() for path in ("/", "/metrics")]
    finally:
        for exporter in exporters.values():
            exporter.stop()
    assert "HTTP 401 from" in exporters["none"].process.log.read_text()
    assert "sending header(s) Authorization" in exporters["token"].process.log.read_text()
    logs = [exporter.process.log.read_text() for exporter in exporters.values()]
    for secret in (TOKEN, API_KEY):
        assert all(secret not in text for text in logs + pages)


# -- strict parsing and one-line errors ------------------------------------------------------


@pytest.fixture
def tls_files(tmp_path: Path) -> Path:
    """A folder with a server certificate and key, for parse tests that need real files."""
    Pki(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ({"basic_auth_user": {}}, "unknown key 'basic_auth_user'"),
        ({"tls_server_config": {"certfile": "x"}}, "unknown key 'certfile'"),
        ({"http_server_config": {"headers": {"Server": "x"}}}, "unknown key 'Server'"),
        ({"rate_limit": {"burst": 1}}, "'rate_limit' is not supported"),
        ({"tls_server_config": {"cipher_suites": []}}, "'cipher_suites' is not supported"),
        ({"tls_server_config": {"cert_file": "server.crt"}}, "missing key_file"),
        ({"tls_server_config": {"cert_file": "nope.crt", "key_file": "x"}}, "no such file"),
        ({"tls_server_config": {"min_version": "TLS12"}}, "needs cert_file and key_file"),
        (
            {"tls_server_config": {"client_auth_type": "RequireAnyClientCert"}},
            "RequireAnyClientCert is not supported",
        ),
        (
            {
                "tls_server_config": {
                    "cert_file": "server.crt",
                    "key_file": "server.key",
                    "client_auth_type": "RequireAndVerifyClientCert",
                }
            },
            "needs client_ca_file",
        ),
        (
            {
                "tls_server_config": {
                    "cert_file": "server.crt",
                    "key_file": "server.key",
                    "min_version": "TLS13",
                    "max_version": "TLS12",
                }
            },
            "min_version is above max_version",
        ),
        (
            {"tls_server_config": {"cert_file": "server.crt", "key_file": "server.crt"}},
            "cannot load cert_file",
        ),
        ({"basic_auth_users": {"alice": "hunter2"}}, "basic_auth_users.alice: not a bcrypt hash"),
        ({"http_server_config": {"headers": {"X-Frame-Options": "allow"}}}, "deny or sameorigin"),
        ({"http_server_config": {"http2": "yes"}}, "http2 must be true or false"),
        ({"tls_server_config": "on"}, "tls_server_config must be a mapping"),
    ],
)
def test_web_config_is_parsed_strictly(tls_files: Path, doc: dict, fragment: str) -> None:
    path = tls_files / "web.yml"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as err:
        webconfig.load(path).ssl_context()
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)
    assert "hunter2" not in str(err.value)


def test_empty_web_config_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("# nothing yet\n")
    config = webconfig.load(path)
    assert config.ssl_context() is None and config.middlewares() == []


async def test_password_checks_are_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return real(password, hashed)

    monkeypatch.setattr(basic_auth.bcrypt, "checkpw", counting)
    users = basic_auth.BasicAuthUsers({"alice": bcrypt_hash(PASSWORD).encode()})
    for _ in range(3):
        assert await users.check("alice", PASSWORD)
        assert not await users.check("alice", "wrong")
        assert not await users.check("mallory", PASSWORD)  # unknown user: bcrypt runs anyway
        assert not await users.check("ålice", "x" * 100)  # neither ASCII nor 72 bytes: no error
    assert len(calls) == 4


async def test_unknown_users_are_checked_at_the_highest_configured_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A wrong user name must cost as much bcrypt time as a wrong password of the slowest
    # user, or timing tells which user names exist.
    path = tmp_path / "web.yml"
    hashes = {"alice": bcrypt_hash(PASSWORD, cost=4), "bob": bcrypt_hash(PASSWORD, cost=6)}
    path.write_text(json.dumps({"basic_auth_users": hashes}))
    users = webconfig.load(path).users
    assert users is not None
    checked: list[bytes] = []
    real = bcrypt.checkpw

    def recording(password: bytes, hashed: bytes) -> bool:
        checked.append(hashed)
        return real(password, hashed)

    monkeypatch.setattr(basic_auth.bcrypt, "checkpw", recording)
    assert not await users.check("mallory", PASSWORD)
    assert not await users.check("bob", "wrong")
    assert [h[:7] for h in checked] == [b"$2b$06$", hashes["bob"][:7].encode()]


def run_serve(*args: str) -> tuple[int, str]:
    """``inferwatch serve`` that is expected to exit at once: (code, stderr)."""
    backend = ("--backend-url", "http://127.0.0.1:9")
    listen = ("--web.listen-address", f"127.0.0.1:{free_port()}")  # never a taken :10177
    proc = subprocess.run(
        [sys.executable, "-m", "inferwatch", "serve", *backend, *listen, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, proc.stderr


def test_bad_web_config_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("tls_server_config:\n  cert_file: a\n  keyfile: b\n")
    code, stderr = run_serve("--web.config.file", str(path))
    assert code == 2
    assert stderr.strip().splitlines() == [
        f"inferwatch: error: {path}: tls_server_config: unknown key 'keyfile' "
        "(known: cert_file, client_auth_type, client_ca_file, key_file, max_version, min_version)"
    ]


@pytest.mark.parametrize(
    "header", [f"X-Api-Key {API_KEY}", f"X Api Key: {API_KEY}", f"X-Api-Key: {API_KEY}\r\nX: y"]
)
def test_bad_backend_header_is_refused_without_echoing_it(header: str) -> None:
    with pytest.raises(ValueError) as err:
        header_line(header)
    assert "expected 'Name: value'" in str(err.value) and API_KEY not in str(err.value)


@pytest.mark.parametrize("content", ["", "\n", f"{TOKEN} {TOKEN}\n", f"{TOKEN}\x00\n", "tök"])
def test_bad_token_file_is_refused_without_echoing_it(tmp_path: Path, content: str) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(content)
    with pytest.raises(ConfigError) as err:
        read_secret(token_file)
    assert str(token_file) in str(err.value) and TOKEN not in str(err.value)


def test_bad_secrets_on_the_command_line_exit_2_without_echo(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"{TOKEN} {TOKEN}")
    for args in (
        ["--backend-header", f"X-Api-Key {API_KEY}"],
        ["--backend-bearer-token-file", str(token_file), "--gpu", "off"],
    ):
        code, stderr = run_serve(*args)
        assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
        assert API_KEY not in stderr and TOKEN not in stderr


def test_config_repr_hides_the_backend_header() -> None:
    values = resolve(OPTIONS, {"backend_header": ("X-Api-Key", API_KEY)}, {}, {})
    config = ServeConfig.from_values(values)
    assert API_KEY not in repr(config)
    assert config.backend_headers() == {"X-Api-Key": API_KEY}


def test_two_ways_to_set_authorization_is_an_error(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    flags = {
        "backend_header": ("authorization", "Basic x"),
        "backend_bearer_token_file": token_file,
    }
    with pytest.raises(
        ConfigError, match="set by --backend-bearer-token-file and --backend-header"
    ):
        ServeConfig.from_values(resolve(OPTIONS, flags, {}, {}))


@pytest.mark.parametrize(
    ("flags", "conflict"),
    [
        ({"backend_header": ("Authorization", "Basic x")}, "--backend-header Authorization"),
        ({"backend_header": ("X-Api-Key", API_KEY)}, None),
        ({}, None),
    ],
)
def test_credentials_in_the_url_and_another_authorization_is_an_error(
    flags: dict, conflict: str | None
) -> None:
    values = resolve(
        OPTIONS, {"backend_url": f"http://user:{TOKEN}@127.0.0.1:8000", **flags}, {}, {}
    )
    if conflict is None:
        ServeConfig.from_values(values)
        return
    with pytest.raises(ConfigError) as err:
        ServeConfig.from_values(values)
    assert f"--backend-url user:password@ and {conflict}" in str(err.value)
    assert TOKEN not in str(err.value)
