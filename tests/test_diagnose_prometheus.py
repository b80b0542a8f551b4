"""``diagnose --prometheus`` lists what Prometheus holds as firing, against a real Prometheus.

An alert fires for its ``for`` and is resolved an evaluation later than its condition stops
holding; a page that arrives in that gap must not meet "nothing holds". The rule file here
fires ``InferenceBackendDown`` on a constant (its real condition, a backend reporting down,
is absent), so only the ``ALERTS`` series can make diagnose list it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import yaml

from demo.stack import Prometheus
from inferwatch import diagnose
from inferwatch.heuristics import spec_from_config

SPEC = spec_from_config({})


def rules(path: Path) -> Path:
    group = {
        "name": "firing-without-its-condition",
        "interval": "1s",
        "rules": [
            # diagnose checks that the source runs inferwatch's recording rules.
            {"record": f"instance:inferwatch_requests_finished:{SPEC.w}", "expr": "vector(1)"},
            {
                "alert": "InferenceBackendDown",
                "expr": 'label_replace(vector(1), "instance", "pod-a:9477", "", "")',
                "labels": {"severity": "critical", "phase": "any", "layer": "availability"},
            },
        ],
    }
    path.write_text(yaml.safe_dump({"groups": [group]}))
    return path


def test_a_firing_alert_is_listed_even_when_its_condition_no_longer_holds(tmp_path: Path) -> None:
    prometheus = Prometheus(tmp_path, [], rule_files=[rules(tmp_path / "rules.yaml")]).start()
    try:
        deadline = time.monotonic() + 60
        while not prometheus.query('ALERTS{alertstate="firing"}'):
            assert time.monotonic() < deadline, "the test rule never fired"
            time.sleep(0.5)
        report = asyncio.run(diagnose.from_prometheus(prometheus.url, SPEC))
    finally:
        prometheus.stop()
    (finding,) = report.findings
    assert finding.alert.name == "InferenceBackendDown"
    assert finding.labels == {"instance": "pod-a:9477"}
    assert (finding.firing, finding.holds) == (True, False)
    assert report.exit_code() == 4
    text = diagnose.render(report)
    assert "CRITICAL InferenceBackendDown" in text
    assert "firing in Prometheus; its condition no longer holds now" in text
    assert "layer: availability" in text
