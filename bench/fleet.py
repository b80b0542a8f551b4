"""A fleet of replicas: what the generated rules cost a real Prometheus (prints figures; not a test).

One process serves N realistic inferwatch pages, one per replica: the exporter's own page
for a real vLLM 0.32 capture (``CAPTURE``: counters and histograms after a load, nothing
running or waiting, an empty KV cache, so that the faults below stand out) with
two fake H100s and a baseline, from the real poll path (``bench/exposition.py``'s
snapshots), rendered once. Counters and histogram samples then grow at a replica's own pace
(0.5x to 1.5x of the capture's totals per ten minutes); gauges stay, except a few replicas
with a fault (every 50th a KV cache at 97 %, every 70th queued while idle, every 100th a
latency regression against its baseline and one at the decode floor; the others carry no
baseline or floor), so that some alerts go pending. Pending and firing alerts cost more
than quiet ones: Prometheus expands their annotations, and the descriptions query. A real Prometheus (the Debian package) scrapes every replica every 15 s
(``pod``/``namespace``/``instance`` target labels, as a Kubernetes scrape attaches) and
evaluates the generated rules (``alerts/inferwatch-rules.yaml``, groups every 30 s).

After a warm-up (the rate windows filling), the script reads Prometheus' own /metrics every
15 s and prints, per N: head series; raw and recorded series per replica; each rule group's
evaluation time (median and max of ``prometheus_rule_group_last_duration_seconds``) and
skipped evaluations; Prometheus' RSS and CPU (cores, over the measured minutes); with
``--top K``, the K rules that took longest (median of each read's ``evaluationTime`` from
``/api/v1/rules``), which is where a cut pays.

    .venv/bin/python bench/fleet.py [--replicas 10 100 1000] [--warmup 330] [--minutes 3]
        [--rules alerts/inferwatch-rules.yaml OLDER.yaml] [--top 10] [--write-docs]

With ``--write-docs`` the figures, with the date and the machine, also replace the fleet's
region of docs/performance.md: per N, the whole evaluation (the rule groups' medians added
up) and each group's, and with ``--top`` the slowest rules.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/exposition.py's snapshots

from exposition import CAPTURES, snapshots  # noqa: E402

from demo.stack import Prometheus, free_port  # noqa: E402
from inferwatch.method.quantile import histogram_quantile  # noqa: E402
from inferwatch.serve.exposition import render  # noqa: E402
from inferwatch.tools.measured import (  # noqa: E402
    FLEET_BENCH,
    PERFORMANCE,
    this_machine,
    write_figures,
)

RULES = REPO / "alerts" / "inferwatch-rules.yaml"
SCRAPE_SECONDS = 15
GROWING = ("_total", "_bucket", "_sum", "_count")  # cumulative samples
# The capture every replica's page is rendered from, by name: bench/exposition.py's
# snapshots follow the fixtures' sorted names, and a new fixture must not change the fleet.
CAPTURE = "vllm-0.32.0-cpu-api-server-count-2-mfu.prom"


@dataclass(frozen=True)
class Sample:
    series: str  # name{labels}
    value: float
    grows: bool


def template(page: str) -> list[str | Sample]:
    """The page's lines: comments as they are, samples as (series, value, cumulative?).

    The exporter's window quantiles are set to those of the page's own buckets: a replica's
    counters all grow in proportion, so any window of it holds the capture's distribution.
    """
    out: list[str | Sample] = []
    buckets: dict[str, list[tuple[str, float]]] = {}
    for line in page.splitlines():
        if not line or line.startswith("#"):
            out.append(line)
            continue
        series, value = line.rsplit(" ", 1)
        name = series.split("{", 1)[0]
        out.append(Sample(series, float(value), name.endswith(GROWING)))
        if name.endswith("_bucket"):
            le = series.split('le="', 1)[1].split('"', 1)[0]
            buckets.setdefault(name.removesuffix("_bucket"), []).append((le, float(value)))
    for i, line in enumerate(out):
        if isinstance(line, Sample) and "_window_seconds{" in line.series:
            histogram = line.series.split("{", 1)[0].replace("_window_seconds", "_seconds")
            q = float(line.series.split('quantile="', 1)[1].split('"', 1)[0])
            out[i] = Sample(line.series, histogram_quantile(q, buckets[histogram]), False)
    return out


class Fleet:
    """N replicas' pages at /metrics/<i>, each evolving from the same template."""

    def __init__(self, replicas: int, lines: list[str | Sample]) -> None:
        self.replicas = replicas
        self.lines = lines
        self.started = time.monotonic()

    def page(self, replica: int) -> bytes:
        pace = 0.5 + (replica * 0.618) % 1.0  # 0.5x .. 1.5x, spread over the fleet
        growth = 1.0 + pace * (time.monotonic() - self.started) / 600.0
        kv_fault, idle_fault = replica % 50 == 7, replica % 70 == 3
        # The capture's latencies are a regression against the baseline, and decode at its
        # floor against the fake GPUs: both only on a few replicas, as faults.
        regressed, at_floor = replica % 100 == 11, replica % 100 == 13
        out = []
        for line in self.lines:
            if isinstance(line, str):
                out.append(line)
                continue
            if line.series.startswith("inferwatch_baseline_") and not regressed:
                continue
            if line.series.startswith("inferwatch_decode_floor_seconds") and not at_floor:
                continue
            value = line.value * growth if line.grows else line.value
            if kv_fault and line.series.startswith("inferwatch_kv_cache_usage_ratio"):
                value = 0.97
            if idle_fault and line.series.startswith("inferwatch_queued_while_idle{"):
                value = 1.0
            out.append(f"{line.series} {value!r}")
        return ("\n".join(out) + "\n").encode()

    async def handle(self, request: web.Request) -> web.Response:
        replica = int(request.match_info["replica"])
        body = self.page(replica)
        return web.Response(body=body, content_type="text/plain", charset="utf-8")


class FleetPrometheus(Prometheus):
    """The stack's Prometheus, scraping every replica of the fleet at its own path."""

    def __init__(self, workdir: Path, port: int, replicas: int, rules: Path) -> None:
        super().__init__(workdir, [], rule_files=[rules], interval=f"{SCRAPE_SECONDS}s")
        self.fleet_port = port
        self.replicas = replicas

    def config(self) -> dict:
        config = super().config()
        config["global"]["evaluation_interval"] = "30s"  # the rule groups set their own
        config["scrape_configs"] = [
            {
                "job_name": "inferwatch",
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{self.fleet_port}"],
                        "labels": {
                            "__metrics_path__": f"/metrics/{i}",
                            "instance": f"10.1.{i // 250}.{i % 250}:10177",
                            "pod": f"vllm-{i}",
                            "namespace": "fleet",
                        },
                    }
                    for i in range(self.replicas)
                ],
            }
        ]
        return config


def own_metrics(page: str) -> dict[str, Any]:
    """What one read of Prometheus' /metrics says about its cost."""
    out: dict[str, Any] = {"groups": {}, "missed": {}}
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            if s.name == "prometheus_rule_group_last_duration_seconds":
                out["groups"][s.labels["rule_group"].split(";")[-1]] = s.value
            elif s.name == "prometheus_rule_group_iterations_missed_total":
                out["missed"][s.labels["rule_group"].split(";")[-1]] = s.value
            elif s.name in (
                "prometheus_tsdb_head_series",
                "process_resident_memory_bytes",
                "process_cpu_seconds_total",
            ):
                out[s.name] = s.value
    return out


async def measure(
    replicas: int, lines: list[str | Sample], rules: Path, warmup: float, minutes: float
) -> dict[str, Any]:
    """Run the fleet and Prometheus; what Prometheus reported over the measured minutes."""
    fleet = Fleet(replicas, lines)
    app = web.Application()
    app.router.add_get("/metrics/{replica}", fleet.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    with tempfile.TemporaryDirectory(prefix="fleet-") as workdir:
        prometheus = FleetPrometheus(Path(workdir), port, replicas, rules)
        await asyncio.to_thread(prometheus.start)
        try:
            await asyncio.sleep(warmup)
            reads = []
            per_rule: dict[tuple[str, str], list[float]] = {}
            async with aiohttp.ClientSession() as session:
                end = time.monotonic() + minutes * 60
                while True:
                    async with session.get(f"{prometheus.url}/metrics") as response:
                        reads.append((time.monotonic(), own_metrics(await response.text())))
                    async with session.get(f"{prometheus.url}/api/v1/rules") as response:
                        for group in (await response.json())["data"]["groups"]:
                            for rule in group["rules"]:
                                key = (group["name"], rule["name"])
                                per_rule.setdefault(key, []).append(rule["evaluationTime"])
                    if time.monotonic() >= end:
                        break
                    await asyncio.sleep(SCRAPE_SECONDS)
            counts = {
                prefix: await asyncio.to_thread(
                    prometheus.query, f'count({{__name__=~"{prefix}"}})'
                )
                for prefix in ("inferwatch_.+|process_.+|python_.+", "instance:.+", "model:.+")
            }
        finally:
            await asyncio.to_thread(prometheus.stop)
            await runner.cleanup()
    return summary(replicas, reads, counts, per_rule)


def summary(
    replicas: int, reads: list, counts: dict[str, list], per_rule: dict[tuple[str, str], list]
) -> dict[str, Any]:
    (t0, first), (t1, last) = reads[0], reads[-1]

    def count(prefix: str) -> float:
        result = counts[prefix]
        return float(result[0]["value"][1]) if result else 0.0

    groups = {name: [r["groups"].get(name, 0.0) for _, r in reads] for name in last["groups"]}
    return {
        "replicas": replicas,
        "head_series": last["prometheus_tsdb_head_series"],
        "raw_per_replica": count("inferwatch_.+|process_.+|python_.+") / replicas,
        "instance_per_replica": count("instance:.+") / replicas,
        "model_series": count("model:.+"),
        "groups": {n: (statistics.median(v), max(v)) for n, v in groups.items()},
        "missed": {n: last["missed"].get(n, 0.0) - first["missed"].get(n, 0.0) for n in groups},
        "rules": sorted(
            ((statistics.median(v), group, name) for (group, name), v in per_rule.items()),
            reverse=True,
        ),
        "rss_mib": last["process_resident_memory_bytes"] / 2**20,
        "cpu_cores": (last["process_cpu_seconds_total"] - first["process_cpu_seconds_total"])
        / (t1 - t0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--warmup", type=float, default=330.0, help="seconds (5m windows fill)")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--top", type=int, default=0, help="print the K slowest rules per run")
    parser.add_argument(
        "--write-docs", action="store_true", help="also write the figures to docs/performance.md"
    )
    parser.add_argument(
        "--rules",
        type=Path,
        nargs="+",
        default=[RULES],
        help="rule files to compare, each run in turn at every N (e.g. an older generation)",
    )
    args = parser.parse_args()
    version = subprocess.run(["prometheus", "--version"], capture_output=True, text=True)
    print(f"{platform.node()}: {platform.processor() or platform.machine()}, "
          f"{version.stdout.splitlines()[0] if version.stdout else 'prometheus'}")  # fmt: skip
    print(
        "| rules | replicas | head series | raw / replica | instance: / replica | model: series "
        "| recording eval (median / max) | alerts eval | slo eval | skipped | RSS | CPU |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = template(render(snapshots()[[c.name for c in CAPTURES].index(CAPTURE)]).decode())
    # Absolute: Prometheus reads rule_files as globs relative to its config file's folder,
    # and a glob that matches nothing is no error.
    rule_files = [f.resolve(strict=True) for f in args.rules]
    figures: dict[str, str] = {}
    for replicas, rules in ((n, f) for n in args.replicas for f in rule_files):
        r = asyncio.run(measure(replicas, lines, rules, args.warmup, args.minutes))

        def ev(name: str, groups: dict = r["groups"]) -> str:
            median, peak = groups.get(name, (0.0, 0.0))
            return f"{median:.3f} s / {peak:.3f} s"

        print(
            f"| {rules.name} | {replicas:,} | {r['head_series']:,.0f} | {r['raw_per_replica']:.0f} "
            f"| {r['instance_per_replica']:.0f} | {r['model_series']:.0f} "
            f"| {ev('inferwatch.recording')} | {ev('inferwatch.alerts')} "
            f"| {ev('inferwatch.slo')} | {sum(r['missed'].values()):.0f} "
            f"| {r['rss_mib']:.0f} MiB | {r['cpu_cores']:.3f} |",
            flush=True,
        )
        for seconds, group, name in r["rules"][: args.top]:
            print(f"    {seconds:.3f} s  {group}  {name}", flush=True)
        which = f"{replicas:,} replicas" + (f", {rules.name}" if len(rule_files) > 1 else "")
        figures[which] = doc_row(r)
        if args.top:
            figures[f"slowest rules at {which}"] = "; ".join(
                f"{name} {seconds:.3f} s" for seconds, _, name in r["rules"][: args.top]
            )
    if args.write_docs:
        options = f"--warmup {args.warmup:g} --minutes {args.minutes:g} --top {args.top}"
        machine = {**this_machine(), "Prometheus": prometheus_version(version.stdout)}
        write_figures(REPO / PERFORMANCE, figures, {**machine, "options": options}, FLEET_BENCH)


def doc_row(r: dict[str, Any]) -> str:
    """One run's figures as docs/performance.md lists them: the rule groups' median
    evaluation times added up (the whole evaluation), then each group's, and the rest."""
    medians = {name.removeprefix("inferwatch."): m for name, (m, _) in r["groups"].items()}
    groups = " / ".join(f"{name} {m:.3f}" for name, m in medians.items())
    return (
        f"evaluation {sum(medians.values()):.2f} s ({groups}); "
        f"{r['head_series']:,.0f} head series, {r['raw_per_replica']:.0f} raw and "
        f"{r['instance_per_replica']:.0f} recorded series per replica; "
        f"{sum(r['missed'].values()):.0f} skipped; RSS {r['rss_mib']:,.0f} MiB, "
        f"{r['cpu_cores']:.3f} cores"
    )


def prometheus_version(text: str) -> str:
    """``2.42.0+ds`` from ``prometheus --version``'s first line."""
    words = text.split()
    return words[words.index("version") + 1] if "version" in words else "unknown"


if __name__ == "__main__":
    main()
