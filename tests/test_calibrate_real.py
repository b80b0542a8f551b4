"""``inferwatch calibrate`` as a user runs it, against a real vLLM on CPU: every threshold that
depends on the machine measured by the product itself, each with its source.

The sweep, then the sidecar's own parts reading normal traffic (the server's CPU wait from
/proc, the canary's gap, the ITL tail, the frontend's CPU), the longest engine step at the
server's biggest batch, and the capacity. The config it writes reads back with no threshold
uncalibrated, and the rules generated from it keep every alert at its own severity.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from demo.stack import VllmServer
from inferwatch.method.alerts import ALERTS
from inferwatch.method.spec import spec_from_config
from inferwatch.method.thresholds import MACHINE_DEPENDENT
from inferwatch.settings import load_config_file

pytestmark = pytest.mark.vllm

BASE = {
    "poll_interval": 0.25,
    "canary_interval": 1,
    "alerting": {"rate_window": "10s", "evaluation_interval": "1s"},
}


def test_calibrate_measures_every_machine_dependent_threshold(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    vllm_server.ensure_running()
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(BASE))
    out = tmp_path / "inferwatch.yaml"
    argv = [
        sys.executable, "-m", "inferwatch", "calibrate",
        "--url", vllm_server.url, "--model", "tiny", "--config", str(base), "--out", str(out),
        "--concurrency", "2", "--prompt-tokens", "16", "--output-tokens", "16",
        "--requests-per-cell", "60", "--search-seconds", "60", "--normal-windows", "1",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    print(done.stderr)
    assert done.returncode == 0, done.stderr
    config = load_config_file(out)
    spec = spec_from_config(config)
    assert spec.uncalibrated() == []
    assert set(MACHINE_DEPENDENT) <= set(config["thresholds"])
    text = out.read_text()
    # Each with where it came from: the readings of whole rate windows under normal traffic.
    for name in ("server_cpu_wait_share", "client_gap_seconds", "frontend_cpu_cores"):
        comment = text.split(f"\n  {name}: ")[0].rsplit("\n  # measured: ", 1)[1]
        assert "readings of whole rate windows under normal traffic" in " ".join(
            line.removeprefix("  # ") for line in comment.splitlines()
        ), name
    # The server waited for a CPU under normal traffic (2 cores, niced): its threshold sits
    # above what it read, in odds.
    wait = config["thresholds"]["server_cpu_wait_share"]
    assert 0 < wait < 1
    assert config["engine_step_seconds"] > 0
    assert "the longest stretch without an engine step" in text
    baseline = yaml.safe_load(Path(config["baseline"]).read_text())
    assert baseline["capacity"][0]["requests_per_second"] > 0
    assert "uncalibrated" not in done.stderr
    # The rules from this config: no alert held at info for want of a calibration.
    held = [a.name for a in ALERTS.values() if spec.severity(a) == "info" != a.severity]
    assert held == []
