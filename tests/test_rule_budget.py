"""The recording rules' series budget: what one replica costs in recorded series.

At fleet size every recorded series is stored like a raw one (bench/fleet.py measures it), so
the generated rules may record at most ``BUDGET`` series per replica: a new rule that records
a histogram's buckets per instance, or a quantile nobody reads, fails here. The replica is
the exporter's page for a real vLLM 0.32 server (two captures of it 10 s apart, during and
after a burst) with two GPUs, scraped by promtool with the generated rules.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from inferwatch.collect.textparse import read_page
from inferwatch.collect.window import LatencyWindow
from inferwatch.method.local import Samples
from inferwatch.method.rules import dump_yaml, rules_document
from inferwatch.method.spec import spec_from_config
from inferwatch.model import GpuSample

from conftest import exporter_page, fixture_text, promtool_series

BUDGET = 60  # recorded series per replica (instance: rules); bench/fleet.py's figures
TARGET = {"instance": "10.0.0.7:10177", "job": "inferwatch", "pod": "vllm-0"}
CAPTURES = ("vllm-0.32.0-cpu-loaded-kv-full.prom", "vllm-0.32.0-cpu-after-preemptions.prom")


def page(capture: str, step: int, window: LatencyWindow) -> Samples:
    """The exporter's page; its latency window has polled the captures a window apart."""
    gpus = tuple(
        GpuSample(k, f"GPU-{k}", "NVIDIA H100 80GB HBM3", busy_seconds_total=10.0 * step)
        for k in (0, 1)
    )
    at = window.seconds * step
    return read_page(exporter_page(fixture_text(capture), gpus, (window, at)))


def test_one_replica_records_at_most_the_budget(tmp_path: Path) -> None:
    spec = spec_from_config({})
    window = LatencyWindow(spec.window_seconds)
    (tmp_path / "rules.yaml").write_text(dump_yaml(rules_document(spec)))
    recorded = 'count({__name__=~"instance:.+"})'
    doc = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "10s",
        "tests": [
            {
                "interval": "10s",
                "input_series": promtool_series(
                    [page(c, step, window) for step, c in enumerate(CAPTURES)], TARGET
                ),
                "promql_expr_test": [
                    # promtool prints the count it got when this fails.
                    {"expr": f"{recorded} > {BUDGET}", "eval_time": "10s", "exp_samples": []},
                    # ...and the rules did record this replica (the check above can fail).
                    {
                        "expr": f"{recorded} > bool 10",
                        "eval_time": "10s",
                        "exp_samples": [{"labels": "{}", "value": 1}],
                    },
                ],
            }
        ],
    }
    (tmp_path / "budget_test.yaml").write_text(dump_yaml(doc))
    out = subprocess.run(
        ["promtool", "test", "rules", "budget_test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
