"""The same rules on VictoriaMetrics: vmalert (replay mode) fires what promtool's tests expect.

Every promtool test group of alerts/tests/*.yaml is expanded into timestamped samples and
imported into one real VictoriaMetrics (Debian's 1.79), each group 60 days after the previous
one (more than the rules' longest window, 28d, so no group sees another's data). vmalert then
replays the generated rules over each group's time range, writing the recorded series and
ALERTS back; the ALERTS samples written at each `alert_rule_test` eval_time must be the
group's `exp_alerts` (alertname and every label, annotations aside).

Replay order: vmalert evaluates one rule over the whole range, then the next, and a chained
rule only sees its inputs once VictoriaMetrics made them searchable (`-replay.rulesDelay`,
1 s per rule: minutes for ~150 rules). Instead the rules file, read here at test time, is
split into layers by dependency depth (a rule only reads series of shallower layers) and
each layer is replayed by its own vmalert run, after a `/internal/force_flush`.

promtool ticks every rule group at the test file's `evaluation_interval` whatever the
group's own `interval`; so that vmalert evaluates at the same instants, every layer's groups
take that interval too (30s for the cause alerts, 1m and 10m for the SLO files).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
TESTS_DIR = REPO / "alerts" / "tests"
# Each group's samples start 60 days after the previous group's: the rules' longest range
# ([28d]) never reaches into another group.
GROUP_SPACING_S = 60 * 86400
# Labels vmalert adds to ALERTS that promtool's exp_labels do not carry.
VMALERT_ONLY = {"__name__", "alertstate", "alertgroup"}
# Recorded series compared value by value with promtool's (Prometheus' engine).
RECORDED_TOLERANCE = 0.01  # relative, or 1e-9 absolute near zero

# ~20 s on 2 cores (all 35 groups replayed at once, 8 vmalert runs in parallel): not `slow`.
# Debian's victoria-metrics comes with `make test`/`make check`; missing, the test fails.


# ---------------------------------------------------------------- promtool's notation


def duration_s(text: str) -> int:
    """A Prometheus duration ("15m", "1h30m", "367m") in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text)
    assert parts and "".join(n + u for n, u in parts) == text, text
    return int(sum(int(n) * units[u] for n, u in parts))


def expand(values: str) -> list[float | None]:
    """promtool's expanding notation: `a+bxN` (N+1 values), `a-bxN`, `axN`, `_`, `_xN`, `stale`.

    None is a missing sample (`_`); `stale` (a staleness marker) reads as missing too, since
    VictoriaMetrics 1.79 has no staleness markers (no scenario uses one today).
    """
    out: list[float | None] = []
    for token in values.split():
        if token in ("_", "stale"):
            out.append(None)
            continue
        if m := re.fullmatch(r"(_|stale)x(\d+)", token):
            out.extend([None] * int(m.group(2)))
            continue
        if m := re.fullmatch(r"([-+]?[\d.eE+-]*?\d)([+-])([\d.eE+-]+)x(\d+)", token):
            start, sign, step, n = m.groups()
            inc = float(step) if sign == "+" else -float(step)
            out.extend(float(start) + i * inc for i in range(int(n) + 1))
            continue
        if m := re.fullmatch(r"([^x]+)x(\d+)", token):
            out.extend([float(m.group(1))] * (int(m.group(2)) + 1))
            continue
        out.append(float(token))
    return out


def parse_series(text: str) -> dict[str, str]:
    """`name{a="b",...}` -> labels, __name__ included."""
    m = re.fullmatch(r"([a-zA-Z_:][\w:]*)?(?:\{(.*)\})?", text.strip())
    assert m, text
    labels = {
        k: v.encode().decode("unicode_escape")
        for k, v in re.findall(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"', m.group(2) or "")
    }
    if m.group(1):
        labels["__name__"] = m.group(1)
    return labels


def test_expand_follows_promtool() -> None:
    assert expand("0+30x3") == [0, 30, 60, 90]
    assert expand("5-1x2 _ 7 _x2 1x1 stale") == [5, 4, 3, None, 7, None, None, 1, 1, None]
    assert expand("519582+1182x1") == [519582, 520764]
    assert parse_series('a_b{le="+Inf",x="y"}') == {"__name__": "a_b", "le": "+Inf", "x": "y"}


# ---------------------------------------------------------------- the scenarios


@dataclass
class Group:
    file: str  # alerts/tests/<file>
    name: str
    doc: dict  # the promtool test group
    rules: Path  # the rules file it tests
    interval_s: int  # the test file's evaluation_interval
    start: int  # unix seconds of promtool's time 0

    @property
    def end(self) -> int:
        times = [duration_s(c["eval_time"]) for c in self.doc.get("alert_rule_test", [])]
        times += [duration_s(c["eval_time"]) for c in self.doc.get("promql_expr_test", [])]
        return self.start + max(times)

    def alert_checks(self) -> Iterator[tuple[str, int, list[dict[str, str]]]]:
        """(alertname, eval seconds, the firing alerts' labels) of every alert check."""
        for check in self.doc.get("alert_rule_test", []):
            expected = [dict(a.get("exp_labels") or {}) for a in check.get("exp_alerts") or []]
            for labels in expected:
                labels["alertname"] = check["alertname"]
            yield check["alertname"], duration_s(check["eval_time"]), expected
        for check in self.doc.get("promql_expr_test", []):
            found = re.fullmatch(r'ALERTS\{alertname="(\w+)",alertstate="firing"\}', check["expr"])
            if found:
                expected = [
                    {k: v for k, v in parse_series(s["labels"]).items() if k not in VMALERT_ONLY}
                    for s in check.get("exp_samples") or []
                ]
                yield found.group(1), duration_s(check["eval_time"]), expected


def load_groups(base: int) -> list[Group]:
    groups = []
    for path in sorted(TESTS_DIR.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        (rule_file,) = doc["rule_files"]
        for test in doc["tests"]:
            groups.append(
                Group(
                    file=path.name,
                    name=test["name"],
                    doc=test,
                    rules=(path.parent / rule_file).resolve(),
                    interval_s=duration_s(doc.get("evaluation_interval", "1m")),
                    start=base + len(groups) * GROUP_SPACING_S,
                )
            )
    return groups


def import_lines(group: Group) -> Iterator[str]:
    """The group's input_series as /api/v1/import JSON lines."""
    step = duration_s(group.doc.get("interval", "1m"))
    for series in group.doc["input_series"]:
        samples = [
            ((group.start + i * step) * 1000, v)
            for i, v in enumerate(expand(str(series["values"])))
            if v is not None
        ]
        yield json.dumps(
            {
                "metric": parse_series(series["series"]),
                "values": [v for _, v in samples],
                "timestamps": [t for t, _ in samples],
            }
        )


# ---------------------------------------------------------------- rule layers


def layers(rules_file: Path, interval_s: int) -> list[dict]:
    """The rules file as rules documents by dependency depth, every group at `interval_s`."""
    doc = yaml.safe_load(rules_file.read_text())
    rules = [(g["name"], r) for g in doc["groups"] for r in g["rules"]]
    records = {r["record"] for _, r in rules if "record" in r}
    depth: dict[str, int] = {}

    def rule_depth(rule: dict) -> int:
        names = set(re.findall(r"[a-zA-Z_:][\w:]*", rule["expr"])) & records
        return 1 + max((depth[n] for n in names), default=-1)

    out: list[dict] = []
    for group_name, rule in rules:  # a record is defined before it is read
        d = rule_depth(rule)
        if "annotations" in rule:
            # vmalert's replay mode refuses the `query` template function (fatal: "`query`
            # template isn't supported in replay mode"); live vmalert supports it.
            rule = {
                **rule,
                "annotations": {k: v for k, v in rule["annotations"].items() if "query" not in v},
            }
        if "record" in rule:
            depth[rule["record"]] = max(depth.get(rule["record"], 0), d)
        while len(out) <= d:
            out.append({"groups": []})
        groups = out[d]["groups"]
        if not groups or groups[-1]["name"] != group_name:
            groups.append({"name": group_name, "interval": f"{interval_s}s", "rules": []})
        groups[-1]["rules"].append(rule)
    return out


# ---------------------------------------------------------------- the real components


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, data: bytes | None = None) -> bytes:
    with urllib.request.urlopen(url, data=data, timeout=60) as r:
        return r.read()


def rfc3339(t: int) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Replayed:
    url: str
    groups: list[Group]
    seconds: float

    def export(self, selector: str, t: int) -> list[dict]:
        """The raw samples of `selector` at exactly t (no lookback: what vmalert wrote at t)."""
        query = urllib.parse.urlencode({"match[]": selector, "start": t, "end": t})
        lines = http(f"{self.url}/api/v1/export?{query}").decode().splitlines()
        return [json.loads(line) for line in lines if line]

    def firing(self, group: Group, alertname: str, at: int) -> list[dict[str, str]]:
        selector = f'ALERTS{{alertname="{alertname}",alertstate="firing"}}'
        return [
            {k: v for k, v in s["metric"].items() if k not in VMALERT_ONLY}
            for s in self.export(selector, group.start + at)
        ]


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replayed]:
    tmp = tmp_path_factory.mktemp("vm")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp / "victoria-metrics.log").open("w")
    vm = subprocess.Popen(
        [
            "victoria-metrics",
            f"-storageDataPath={tmp / 'data'}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-retentionPeriod=100y",
            "-search.disableCache",  # backfilling: no response cache of earlier replays
            "-loggerLevel=ERROR",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(100):
            try:
                http(f"{url}/health")
                break
            except OSError:
                time.sleep(0.1)
        started = time.monotonic()
        day = 86400
        base = (int(time.time()) // day - 20 * 365) * day  # 20 years ago, at midnight
        groups = load_groups(base)
        body = "\n".join(line for g in groups for line in import_lines(g)).encode()
        http(f"{url}/api/v1/import", data=body)
        http(f"{url}/internal/force_flush")

        rule_layers: dict[tuple[Path, int], list[Path]] = {}
        for g in groups:
            key = (g.rules, g.interval_s)
            if key not in rule_layers:
                paths = []
                for i, layer in enumerate(layers(g.rules, g.interval_s)):
                    path = tmp / f"{g.rules.stem}-{g.interval_s}s-layer{i}.yaml"
                    path.write_text(yaml.safe_dump(layer, sort_keys=False))
                    paths.append(path)
                rule_layers[key] = paths

        def replay(g: Group, rules: Path) -> None:
            out = subprocess.run(
                [
                    "vmalert",
                    f"-rule={rules}",
                    f"-datasource.url={url}",
                    f"-remoteWrite.url={url}",
                    f"-replay.timeFrom={rfc3339(g.start)}",
                    f"-replay.timeTo={rfc3339(g.end)}",
                    # The range queries' step (the 1.79 default is 5m, not the interval).
                    f"-datasource.queryStep={g.interval_s}s",
                    "-replay.rulesDelay=0s",  # the layers are independent within
                    "-replay.disableProgressBar",
                    "-disableAlertgroupLabel",
                    f"-httpListenAddr=127.0.0.1:{free_port()}",
                    "-loggerLevel=ERROR",
                ],
                capture_output=True,
                text=True,
                timeout=600,
                env={"GOMAXPROCS": "1"},
            )
            assert out.returncode == 0, f"{g.name}: {out.stdout}{out.stderr}"

        depth = max(len(p) for p in rule_layers.values())
        with ThreadPoolExecutor(max_workers=8) as pool:
            for i in range(depth):
                jobs = [
                    pool.submit(replay, g, rule_layers[(g.rules, g.interval_s)][i])
                    for g in groups
                    if i < len(rule_layers[(g.rules, g.interval_s)])
                ]
                for job in jobs:
                    job.result()
                http(f"{url}/internal/force_flush")
        yield Replayed(url, groups, time.monotonic() - started)
    finally:
        vm.terminate()
        vm.wait(timeout=30)
        log.close()


# ---------------------------------------------------------------- the comparisons


def _ids() -> list[str]:
    return [f"{g.file}:{g.name}" for g in load_groups(0)]


# Scenarios where vmalert and promtool disagree, and why (MetricsQL semantics).
XFAIL: dict[str, str] = {}


@pytest.mark.parametrize(
    "index",
    [
        pytest.param(i, id=ident, marks=[pytest.mark.xfail(strict=True, reason=XFAIL[ident])])
        if ident in XFAIL
        else pytest.param(i, id=ident)
        for i, ident in enumerate(_ids())
    ],
)
def test_vmalert_fires_what_promtool_expects(replayed: Replayed, index: int) -> None:
    group = replayed.groups[index]
    key = lambda labels: sorted(labels.items())  # noqa: E731
    for alertname, at, expected in group.alert_checks():
        got = replayed.firing(group, alertname, at)
        assert sorted(got, key=key) == sorted(expected, key=key), (
            f"{alertname} at {at}s: vmalert {got}, promtool expects {expected}"
        )


# A cause-alert scenario per family (histograms, counters, gauges) and an SLO one.
RECORDED_GROUPS = [
    "phase.yaml:prefill-bound: long prompts on both replicas",
    "availability.yaml:request errors across replicas",
    "memory.yaml:KV-cache pressure",
    "slos-fast.yaml:fast burn: every request of llama-3-8b fails (99.9 % objective): page in 1 min",
]


def promtool_values(group: Group, records: list[str], at: int, tmp: Path) -> dict[str, dict]:
    """Prometheus' values of `records` at `at` on the group's data: promtool test rules with
    an empty `exp_samples` per record, which fails and prints what it got."""
    test = {
        "name": group.name,
        "interval": group.doc["interval"],
        "input_series": group.doc["input_series"],
        "promql_expr_test": [
            {"expr": r, "eval_time": f"{at}s", "exp_samples": []} for r in records
        ],
    }
    doc = {
        "rule_files": [str(group.rules)],
        "evaluation_interval": f"{group.interval_s}s",
        "tests": [test],
    }
    path = tmp / "promtool-test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=300
    )
    values: dict[str, dict] = {r: {} for r in records}
    for record, got in re.findall(
        r'expr: "([^"]+)", time: .*\n.*exp: .*\n\s*got: (.*)', out.stdout + out.stderr
    ):
        for labels, value in re.findall(r"(\{[^}]*\}) (\S+?)(?:, |$)", got.strip()):
            key = frozenset(parse_series(labels).items())
            values[record][key] = float(value)
    return values


def longer_than_the_series(record: str, at: int) -> bool:
    """A raw rate whose window is longer than the series have lived at ``at`` seconds (the
    SLO's finished requests over 30m and 1h in 20-minute scenarios): MetricsQL divides the
    increase by the time its samples cover, PromQL extrapolates it to the window, so the
    values differ by design. The burn rates made of them are ratios and are compared."""
    window = re.search(r"_finished:rate(\w+)$", record)
    return window is not None and duration_s(window.group(1)) > at


@pytest.mark.parametrize("ident", RECORDED_GROUPS)
def test_recorded_series_equal_prometheus(replayed: Replayed, ident: str, tmp_path: Path) -> None:
    (group,) = [g for g in replayed.groups if f"{g.file}:{g.name}" == ident]
    doc = yaml.safe_load(group.rules.read_text())
    records = sorted({r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r})
    at = min(at for _, at, _ in group.alert_checks())
    prometheus = promtool_values(group, records, at, tmp_path)
    assert sum(len(v) for v in prometheus.values()) >= 10, "promtool returned too little"
    compared = 0
    for record in records:
        vm = {
            frozenset(s["metric"].items()): s["values"][-1]
            for s in replayed.export(record, group.start + at)
        }
        assert set(vm) == set(prometheus[record]), f"{record}: series differ"
        if longer_than_the_series(record, at):
            continue
        for key, expected in prometheus[record].items():
            assert vm[key] == pytest.approx(expected, rel=RECORDED_TOLERANCE, abs=1e-9), (
                f"{record}{dict(key)}: vmalert {vm[key]}, Prometheus {expected}"
            )
            compared += 1
    assert compared >= 10
