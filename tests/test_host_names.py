"""DNS rebinding without ``--web.allowed-host``: a real ``inferwatch serve`` answers only the
listen address's own names (addresses, ``localhost``, the name it listens on, this host's
name on every interface) on every route. A browser sends a rebound name (the attacker's,
resolved to the sidecar) as ``Host`` and ``Origin``, and ``Sec-Fetch-Site: same-origin``:
that reaches neither a capture nor any page, while Prometheus scraping by address and a
user on ``localhost`` are answered as before."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.stack import Inferwatch, chromium, free_port

ROUTES = (
    "/", "/metrics", "/healthz", "/captures", "/verdict.json", "/spec.json",
    "/runbooks/InferenceBackendDown",
)  # fmt: skip
REFUSED = "this Host is not the listen address's own (see --web.allowed-host)\n"


def request(
    port: int, host: str, method: str = "GET", path: str = "/metrics", to: str = "127.0.0.1"
) -> tuple[int, bytes]:
    """(status, body) of a request to ``to:port`` that names ``host`` as a browser would,
    with its Origin and Sec-Fetch-Site."""
    headers = {
        "Host": f"{host}:{port}",
        "Origin": f"http://{host}:{port}",
        "Sec-Fetch-Site": "same-origin",
        "Content-Type": "application/json",
    }
    connection = http.client.HTTPConnection(to, port, timeout=10)
    try:
        connection.request(method, path, body="{}" if method == "POST" else None, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


@pytest.fixture
def loopback_capturing_sidecar(tmp_path: Path) -> Iterator[Inferwatch]:
    """Captures on, no authentication, no --web.allowed-host: allowed on loopback only."""
    args = ["--backend", "vllm", "--gpu", "off", "--capture-dir", str(tmp_path / "captures")]
    sidecar = Inferwatch(tmp_path, "http://127.0.0.1:9", [*args, "--capture-seconds", "1"])
    yield sidecar.start()
    sidecar.stop()


def test_a_rebound_name_reaches_no_route_and_no_capture(loopback_capturing_sidecar) -> None:
    port = loopback_capturing_sidecar.port
    for path in ROUTES:
        assert request(port, "evil.test", path=path) == (403, REFUSED.encode()), path
    assert request(port, "evil.test", "POST", "/capture")[0] == 403
    status, body = request(port, "127.0.0.1", "POST", "/capture")  # the exporter's own origin
    assert status == 202, body
    name = json.loads(body)["name"]
    deadline = time.monotonic() + 30
    while (listing := json.loads(request(port, "localhost", path="/captures")[1]))["running"]:
        assert time.monotonic() < deadline, listing
        time.sleep(0.2)
    assert listing["last"]["name"] == name
    archive = f"/captures/{listing['last']['archive']}"
    assert request(port, "evil.test", path=archive)[0] == 403
    assert request(port, "localhost", path=archive)[0] == 200


def test_a_rebound_name_is_refused_in_chromium(tmp_path: Path) -> None:
    sidecar = Inferwatch(tmp_path, "http://127.0.0.1:9", ["--backend", "vllm", "--gpu", "off"])
    sidecar.start()
    try:
        dom = chromium(
            "--host-resolver-rules=MAP rebind.test 127.0.0.1",
            "--dump-dom",
            f"http://rebind.test:{sidecar.port}/metrics",
            profile=tmp_path / "profile",
        ).stdout
        assert REFUSED.strip() in dom and "inferwatch_build_info" not in dom, dom
    finally:
        sidecar.stop()


def this_hosts_address() -> str | None:
    """An address of this machine that is not loopback (the route to a test network's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # nothing is sent
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_on_every_interface_addresses_and_this_hosts_names_are_answered(tmp_path: Path) -> None:
    port = free_port()
    sidecar = Inferwatch(
        tmp_path,
        "http://127.0.0.1:9",
        ["--backend", "vllm", "--gpu", "off", "--web.listen-address", f":{port}"],
        port=port,
    )
    sidecar.start()
    try:
        for host in ("127.0.0.1", "localhost", "LocalHost", socket.gethostname()):
            assert request(port, host)[0] == 200, host
        address = this_hosts_address()
        if address is not None:  # Prometheus scraping the pod by its address
            assert request(port, address, to=address)[0] == 200
        for host in ("evil.test", f"{socket.gethostname()}.evil.test", "localhost.evil.test"):
            assert request(port, host) == (403, REFUSED.encode()), host
    finally:
        sidecar.stop()
