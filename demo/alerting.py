"""The alerting side of the local stack: a real Prometheus and Alertmanager (Debian
packages) on loopback, and a webhook receiver that records what Alertmanager sends.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
import urllib.parse
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from demo.processes import Process, StackError, free_port, http_get, http_json, metric_value


class WebhookReceiver:
    """Records Alertmanager webhook notifications (payload version 4) with arrival times."""

    def __init__(self) -> None:
        self.notifications: list[tuple[float, dict]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                with receiver._lock:
                    receiver.notifications.append((time.monotonic(), body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/alerts"

    def start(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for a serve_forever that never ran
            self.server.shutdown()
        self.server.server_close()

    def firing(self, since: int = 0) -> list[tuple[float, dict]]:
        """(arrival time, alert) for every firing alert received (from notification
        number ``since`` on)."""
        with self._lock:
            return [
                (t, alert)
                for t, body in self.notifications[since:]
                for alert in body.get("alerts", [])
                if alert.get("status") == "firing"
            ]


class Prometheus:
    """A real Prometheus (Debian package) scraping inferwatch, with the generated rules."""

    def __init__(
        self,
        workdir: Path,
        targets: Sequence[str],
        rule_files: Sequence[Path] = (),
        alertmanager: str | None = None,
        interval: str = "1s",
        port: int | None = None,
        web_config: Path | None = None,
    ):
        self.workdir = workdir
        self.targets = list(targets)
        self.rule_files = list(rule_files)
        self.alertmanager = alertmanager
        self.interval = interval
        self.port = port or free_port()
        # Its own --web.config.file (TLS, basic auth); the helpers below then do not reach it.
        self.web_config = web_config
        self.process: Process | None = None

    @property
    def url(self) -> str:
        tls = self.web_config is not None and "tls_server_config" in self.web_config.read_text()
        return f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"

    def config(self) -> dict:
        config: dict[str, Any] = {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [
                {"job_name": "inferwatch", "static_configs": [{"targets": self.targets}]}
            ],
        }
        if self.alertmanager:
            config["alerting"] = {
                "alertmanagers": [{"static_configs": [{"targets": [self.alertmanager]}]}]
            }
        return config

    def start(self, timeout: float = 60.0) -> Prometheus:
        config_file = self.workdir / "prometheus.yml"
        config_file.parent.mkdir(parents=True, exist_ok=True)
        config_file.write_text(json.dumps(self.config(), indent=2))  # JSON is valid YAML
        argv = [
            "prometheus",
            f"--config.file={config_file}",
            f"--storage.tsdb.path={self.workdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            # The exemplars on inferwatch's latency buckets: a slow bucket's trace id.
            "--enable-feature=exemplar-storage",
        ]
        if self.web_config is not None:
            argv.append(f"--web.config.file={self.web_config}")
        self.process = Process("prometheus", argv, self.workdir / "prometheus.log").start()
        ready = (200,) if self.web_config is None else (200, 401)  # 401: up, asking who
        self.process.wait_http(f"{self.url}/-/ready", timeout, ok=ready)
        return self

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """Instant query; raises StackError with Prometheus' message on a bad expression."""
        params = {"query": expr}
        if at is not None:
            params["time"] = str(at)
        return self._api("query", params)["result"]

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict]:
        """Range query over [start, end] (Unix time); StackError as for :meth:`query`."""
        range_params = {"query": expr, "start": str(start), "end": str(end), "step": str(step)}
        return self._api("query_range", range_params)["result"]

    def exemplars(self, expr: str, start: float, end: float) -> list[dict]:
        """The exemplars stored over [start, end] of the series ``expr`` selects: one entry
        per series, ``{"seriesLabels": {...}, "exemplars": [{"labels", "value",
        "timestamp"}]}``."""
        return self._api("query_exemplars", {"query": expr, "start": str(start), "end": str(end)})

    def _api(self, endpoint: str, params: dict[str, str]) -> Any:
        url = f"{self.url}/api/v1/{endpoint}?{urllib.parse.urlencode(params)}"
        status, body = http_get(url, timeout=30.0)
        doc = json.loads(body)
        if status != 200 or doc.get("status") != "success":
            raise StackError(f"query {params['query']!r} failed: {doc.get('error', status)}")
        return doc["data"]

    def alerts(self) -> list[dict]:
        """Pending and firing alerts. Generous timeout: on a machine shared with vLLM under
        load, an answer can take seconds."""
        return http_json(f"{self.url}/api/v1/alerts", timeout=30.0)["data"]["alerts"]

    def missed_evaluations(self) -> dict[str, float]:
        """Per rule group, the evaluations skipped so far because the one before overran its
        interval (an overloaded machine): each delays that group's results by an interval."""
        page = http_get(f"{self.url}/metrics", timeout=30.0)[1].decode()
        name = "prometheus_rule_group_iterations_missed_total"
        return {
            sample.labels["rule_group"]: sample.value
            for family in text_string_to_metric_families(page)
            for sample in family.samples
            if sample.name == name
        }

    def reload(self, timeout: float = 30.0) -> None:
        """Re-read the config and rule files (SIGHUP); returns once the reload succeeded."""
        assert self.process is not None
        name = "prometheus_config_last_reload_success_timestamp_seconds"
        before = metric_value(http_get(f"{self.url}/metrics")[1].decode(), name)
        os.kill(self.process.pid, signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while metric_value(http_get(f"{self.url}/metrics")[1].decode(), name) <= before:
            if time.monotonic() > deadline:
                raise StackError(
                    f"prometheus did not reload within {timeout:g} s:\n{self.process.tail()}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def start_afresh(self) -> Prometheus:
        """Start again, on the same port, with no samples: what happened before is not
        the history the rules judge (a calibration's load on the server, say)."""
        self.stop()
        shutil.rmtree(self.workdir / "prometheus-data", ignore_errors=True)
        return self.start()


class Alertmanager:
    """A real Alertmanager (Debian package) on loopback, no gossip port."""

    def __init__(self, workdir: Path, config_file: Path, port: int | None = None):
        self.workdir = workdir
        self.config_file = config_file
        self.port = port or free_port()
        self.process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> Alertmanager:
        argv = [
            "prometheus-alertmanager",
            f"--config.file={self.config_file}",
            f"--storage.path={self.workdir / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",
        ]
        self.process = Process("alertmanager", argv, self.workdir / "alertmanager.log").start()
        self.process.wait_http(f"{self.url}/-/ready", timeout)
        return self

    def alerts(self) -> list[dict]:
        """Alerts not resolved yet (active, inhibited); a generous timeout, as Prometheus'."""
        return http_json(f"{self.url}/api/v2/alerts", timeout=30.0)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
