"""Bad input that used to pass the start or crash it: the ``inferwatch`` command, one line.

Each case expects exit code 2, exactly one line on stderr naming what is wrong, and no
traceback, before anything else starts. Input refused while the command reads its flags,
environment and files runs ``inferwatch.cli.main`` in this process (the ``cli`` fixture);
input that only ``serve``'s start-up refuses (its web config, its listen socket) runs the
installed console script in a subprocess.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import pytest

INFERWATCH = str(Path(sys.executable).with_name("inferwatch"))
# A valid hash ("secret", cost 4) to corrupt; the cases never echo it.
GOOD_HASH = bcrypt.hashpw(b"secret", bcrypt.gensalt(4)).decode()


@dataclass(frozen=True)
class Case:
    """One bad input: ``args`` may hold ``{tmp}`` (a scratch directory) and ``{port}``;
    ``serves``: refused by serve's start-up, so run as the real command."""

    args: tuple[str, ...]
    message: str
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    serves: bool = False


CASES = {
    "max-bytes-inf": Case(
        ("serve", "--backend-max-bytes", "inf"),
        "argument --backend-max-bytes: 'inf' is not a finite number",
    ),
    "weights-overflow": Case(
        ("serve", "--model-weights-bytes", "1e400"),
        "argument --model-weights-bytes: '1e400' is not a finite number",
    ),
    "timeout-inf": Case(
        ("serve", "--backend-timeout", "inf"),
        "argument --backend-timeout: 'inf' is not a finite number",
    ),
    "timeout-too-long": Case(
        ("serve", "--backend-timeout", "1e300"),
        "argument --backend-timeout: '1e300' must be between 0.01 and 60",
    ),
    "env-max-bytes-inf": Case(
        ("serve",),
        "INFERWATCH_BACKEND_MAX_BYTES: 'inf' is not a finite number",
        env={"INFERWATCH_BACKEND_MAX_BYTES": "inf"},
    ),
    "config-timeout-inf": Case(
        ("serve", "--config", "{tmp}/c.yaml"),
        "config key 'backend_timeout': 'inf' is not a finite number",
        files={"c.yaml": b"backend_timeout: .inf\n"},
    ),
    "config-not-utf8": Case(
        ("serve", "--config", "{tmp}/c.yaml"),
        "{tmp}/c.yaml: not UTF-8 text (byte 9)",
        files={"c.yaml": b"backend: \xff\xfe\n"},
    ),
    "config-nul-byte": Case(
        ("serve", "--config", "{tmp}/c.yaml"),
        "{tmp}/c.yaml: special characters are not allowed",
        files={"c.yaml": b"backend: vllm\x00\n"},
    ),
    "url-port-out-of-range": Case(
        ("serve", "--backend-url", "http://127.0.0.1:99999"),
        "'http://127.0.0.1:99999' is not a usable URL: Port out of range 0-65535",
    ),
    "url-port-zero": Case(
        ("serve", "--backend-url", "http://127.0.0.1:0"),
        "'http://127.0.0.1:0': port 0 cannot be connected to",
    ),
    "url-without-host": Case(
        ("serve", "--backend-url", "http://:8000"),
        "'http://:8000' names no host",
    ),
    "url-broken-ipv6": Case(
        ("serve", "--backend-url", "http://[::1:8000"),
        "is not a usable URL: Invalid IPv6 URL",
    ),
    "url-password-not-echoed": Case(
        ("serve", "--backend-url", "http://admin:hunter2@127.0.0.1:99999"),
        "'http://127.0.0.1:99999' is not a usable URL",
    ),
    "diagnose-url-port": Case(
        ("diagnose", "--exporter", "http://127.0.0.1:99999"),
        "argument --exporter: 'http://127.0.0.1:99999' is not a usable URL",
    ),
    "url-credentials-and-token-file": Case(
        (
            "serve",
            "--backend-url",
            "http://admin:hunter2@127.0.0.1:8000",
            "--backend-bearer-token-file",
            "{tmp}/token",
        ),
        "the Authorization header is set by --backend-url user:password@ and "
        "--backend-bearer-token-file; give one",
        files={"token": b"s3cr3t-token\n"},
    ),
    "port-in-use": Case(
        ("serve", "--gpu", "off", "--web.listen-address", "127.0.0.1:{port}"),
        "--web.listen-address 127.0.0.1:{port}: Address already in use",
        serves=True,
    ),
    "bcrypt-cost-out-of-range": Case(
        ("serve", "--web.config.file", "{tmp}/web.yml"),
        "{tmp}/web.yml: basic_auth_users.alice: bcrypt cost 99 is outside 4-31",
        files={"web.yml": f"basic_auth_users:\n  alice: $2b$99${GOOD_HASH[7:]}\n".encode()},
        serves=True,
    ),
    "bcrypt-bad-salt": Case(
        ("serve", "--web.config.file", "{tmp}/web.yml"),
        "{tmp}/web.yml: basic_auth_users.alice: not a valid bcrypt hash (bad salt)",
        # The salt's 22nd character carries 2 bits: 'z' sets bits that do not exist.
        files={
            "web.yml": f"basic_auth_users:\n  alice: {GOOD_HASH[:28]}z{GOOD_HASH[29:]}\n".encode()
        },
        serves=True,
    ),
    "tensor-parallel-size-zero": Case(
        ("serve", "--tensor-parallel-size", "0"),
        "argument --tensor-parallel-size: '0' must be a positive integer",
    ),
    **{
        f"{command}-unknown-threshold": Case(
            (command, *extra, "--config", "{tmp}/c.yaml"),
            "thresholds: unknown key 'ttft_p95_secs'",
            files={"c.yaml": b"thresholds:\n  ttft_p95_secs: 3\n"},
        )
        for command, extra in (("serve", ()), ("generate", ("--out", "{tmp}/out")))
    },
    # A config calibrated by an earlier release: what replaced the key, not only "unknown".
    "replaced-threshold": Case(
        ("serve", "--config", "{tmp}/c.yaml"),
        "thresholds.itl_tail_ratio: replaced by itl_tail_bound_seconds and itl_tail_share "
        "(the share of token gaps above a bucket bound: a ratio of quantiles hid tails in wide "
        "buckets); run `inferwatch calibrate` again or set those",
        files={"c.yaml": b"thresholds:\n  itl_tail_ratio: 11.7\n"},
    ),
}


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port some other process listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")}
    return subprocess.run(
        [INFERWATCH, *args],
        capture_output=True,
        text=True,
        env={**environ, **env},
        timeout=60,
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_one_line_and_exit_2(cli, name: str, tmp_path: Path, taken_port: int) -> None:
    case = CASES[name]
    for file_name, content in case.files.items():
        (tmp_path / file_name).write_bytes(content)

    def fill(text: str) -> str:
        return text.format(tmp=tmp_path, port=taken_port)

    args = [fill(a) for a in case.args]
    proc = run(args, case.env) if case.serves else cli(*args, env=case.env)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert proc.returncode == 2, proc.stderr
    assert fill(case.message) in lines[0]
    assert "hunter2" not in proc.stderr and "s3cr3t" not in proc.stderr
    assert GOOD_HASH[7:] not in proc.stderr
