"""Bad input on the command line, in the environment or in the config file: one line, exit 2.

The cases run ``inferwatch.cli.main`` in this process (the ``cli`` fixture); the one that
gets as far as starting ``serve`` runs ``python -m inferwatch`` in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from demo.stack import free_port
from inferwatch.collect.backends import BACKENDS
from inferwatch.serve.command import OPTIONS
from inferwatch.settings import ConfigError, resolve

from conftest import CliResult


def inferwatch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m inferwatch ARGS`` in a subprocess."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")}
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "inferwatch", *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
    )


def one_line_error(proc: subprocess.CompletedProcess | CliResult, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["serve", "--poll-interval", "fast"], ["--poll-interval", "'fast' is not a number"]),
        (["serve", "--poll-interval", "0"], ["must be between 0.05 and 60"]),
        (["serve", "--backend", "ollama"], [f"'ollama' is not one of auto, {', '.join(BACKENDS)}"]),
        (["serve", "--backend-url", "localhost:8000"], ["is not an http:// or https:// URL"]),
        (["serve", "--web.listen-address", "10177"], ["is not HOST:PORT"]),
        (["serve", "--model-path", "/nonexistent"], ["/nonexistent: no such directory"]),
        (["serve", "--model-weights-bytes", "-5"], ["must be a positive integer"]),
        (["serve", "--bogus"], ["unrecognized arguments: --bogus"]),
        (["frobnicate"], ["invalid choice: 'frobnicate'"]),
    ],
)
def test_bad_flags(cli, args: list[str], fragments: list[str]) -> None:
    one_line_error(cli(*args), *fragments)


def test_bad_environment_variable_names_it(cli) -> None:
    proc = cli("serve", env={"INFERWATCH_IDLE_THRESHOLD": "1.5"})
    one_line_error(proc, "INFERWATCH_IDLE_THRESHOLD", "'1.5' must be between 0 and 1")


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        ("backend: vllm\npoll_intervall: 1\n", ["unknown key 'poll_intervall'"]),
        ("gpu: maybe\n", ["config key 'gpu'", "'maybe' is not one of auto, on, off"]),
        ("poll_interval: [1, 2]\n", ["config key 'poll_interval'", "expected a single value"]),
        ("backend: [\n", ["line 2"]),
        ("- just\n- a list\n", ["expected a mapping of settings"]),
    ],
)
def test_bad_config_file(cli, tmp_path: Path, content: str, fragments: list[str]) -> None:
    config = tmp_path / "inferwatch.yaml"
    config.write_text(content)
    one_line_error(
        cli("serve", "--config", str(config)),
        str(config) if "line" in fragments[0] else "",
        *fragments,
    )


def test_missing_config_file(cli) -> None:
    one_line_error(cli("serve", "--config", "/nope.yaml"), "/nope.yaml: no such file")


def test_both_weight_sources_is_an_error(cli, tmp_path: Path) -> None:
    proc = cli("serve", "--model-weights-bytes", "10", "--model-path", str(tmp_path))
    one_line_error(proc, "not both")


def test_gpu_on_without_nvml_exits_with_the_reason() -> None:
    """Refused by serve's start-up (after its listen socket is bound): the real command."""
    listen = f"127.0.0.1:{free_port()}"  # the error must be NVML's, never a taken :10177
    proc = inferwatch(
        "serve",
        "--gpu",
        "on",
        "--backend-url",
        "http://127.0.0.1:9",
        "--web.listen-address",
        listen,
    )
    one_line_error(proc, "--gpu on: NVML")


def test_precedence_flag_then_env_then_file_then_default() -> None:
    config = {"poll_interval": 2.0, "idle_threshold": 0.3, "gpu": False}
    env = {"INFERWATCH_POLL_INTERVAL": "1.0", "INFERWATCH_IDLE_THRESHOLD": ""}
    values = resolve(OPTIONS, {"poll_interval": 0.25}, config, env)
    assert values["poll_interval"] == 0.25  # flag
    values = resolve(OPTIONS, {}, config, env)
    assert values["poll_interval"] == 1.0  # env
    assert values["idle_threshold"] == 0.3  # file (an empty env var does not count)
    assert values["gpu"] == "off"  # YAML's bare `off` (false) means "off"
    assert values["backend_url"] == "http://127.0.0.1:8000"  # default
    assert values["web_listen_address"] == ("", 10177)


def test_env_error_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="INFERWATCH_GPU"):
        resolve(OPTIONS, {}, {}, {"INFERWATCH_GPU": "sometimes"})


def test_serve_loads_none_of_the_tooling() -> None:
    """The sidecar's start-up imports neither the tools nor the dashboard builder."""
    code = (
        "import sys; from inferwatch import cli; cli.build_parser('serve');"
        "import inferwatch.serve.command;"
        "print(sorted(m for m in sys.modules"
        " if m.startswith(('grafanalib', 'inferwatch.tools', 'inferwatch.dashboards'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
