"""The verdict page (``/``): :meth:`VerdictHistory.document` as server-rendered HTML.

Built from the same document as ``/verdict.json``, so the two always agree. Plain HTML and
inline SVG: no script, no stylesheet or font fetched from anywhere; every text from the
backend or the config is escaped. The page refreshes itself every ``REFRESH_SECONDS``.
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from typing import Any

from inferwatch import __version__
from inferwatch.method.findings import SEVERITY_ORDER, fmt

REFRESH_SECONDS = 10
WIDTH, HEIGHT = 260, 56

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:70em}
h1{font-size:1.4em;margin:0 0 .3em}
.banner{padding:.6em 1em;border-radius:4px;margin:1em 0;font-size:1.15em}
.ok{background:#e3f4e1}.warn{background:#fdf0d5}.bad{background:#f8d7d7}.wait{background:#eee}
table{border-collapse:collapse;margin:.5em 0}
td,th{padding:.25em .6em;text-align:left;vertical-align:top;border-bottom:1px solid #ddd}
.finding{margin:.8em 0;padding:.5em 1em;border-left:4px solid #c80}
.finding.critical{border-color:#c00}.finding.info{border-color:#08c}
.held{color:#070}.nothold{color:#888}
.sparks{display:flex;flex-wrap:wrap;gap:1em}
.spark{border:1px solid #ddd;padding:.4em;width:270px}
.spark svg{display:block;background:#fafafa}
.nodata{color:#888;font-style:italic}
small,.muted{color:#666}
small.agree{color:#070}small.disagree{color:#c00;font-weight:bold}
.wide{overflow-x:auto;max-width:100%}.wide td{white-space:nowrap}
.wide td.id{font-family:monospace;font-size:.85em;white-space:normal;word-break:break-all;min-width:16ch}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _banner(doc: Mapping[str, Any]) -> str:
    if doc["latest_poll_backend_up"] is False:
        return '<div class="banner bad" id="status">backend down: the last poll failed</div>'
    state = doc["state"]
    if state == "collecting":
        return '<div class="banner wait" id="status">collecting: waiting for two polls</div>'
    if state == "healthy":
        text = "healthy: no alert condition of the heuristics spec holds"
        return f'<div class="banner ok" id="status">{text}</div>'
    worst = min(doc["findings"], key=lambda f: SEVERITY_ORDER.index(f["severity"]))
    kind = "bad" if worst["severity"] == "critical" else "warn"
    names = ", ".join(f["alert"] for f in doc["findings"])
    return f'<div class="banner {kind}" id="status">{_e(worst["severity"])}: {_e(names)}</div>'


def _phase(doc: Mapping[str, Any]) -> str:
    if doc["state"] == "collecting":
        return ""
    window = doc["window_seconds"]
    phase = f"<b>phase: {_e(doc['phase'])}</b> ({_e(doc['phase_detail'])})"
    if doc["router"]:
        phase = "<b>a router</b>: each worker's phase is on the sidecar next to it"
    return (
        f'<p id="phase">{phase}<br>'
        f"<small>over the last {window:.0f} s of polls (rate window {_e(doc['rate_window'])})"
        "</small></p>"
    )


def _finding(f: Mapping[str, Any], labels: Mapping[str, str]) -> str:
    """One finding; ``labels``: the exporter's, so only what names its subject is shown (a
    router's worker)."""
    about = " ".join(f"{k}={v}" for k, v in sorted(f["labels"].items()) if k not in labels)
    rows = "".join(
        f'<tr class="{"held" if e["holds"] else "nothold"}"><td>{_e(e["role"])}</td>'
        f"<td>{_e(e['label'])}</td><td>{_e(fmt(e['value'], e['unit']))}</td>"
        f"<td>{_e(e['op'])}</td><td>{_e(fmt(e['threshold'], e['unit']))}</td>"
        f"<td><small>{_e(e['threshold_name'] or '')}</small></td></tr>"
        for e in f["evidence"]
    )
    explained = (
        f"<br><small>explained by {_e(f['explained_by'])}"
        f"{' (inhibited in Alertmanager)' if f['inhibited'] else ''}</small>"
        if f["explained_by"]
        else ""
    )
    said = f.get("requests")
    spans = (
        f'<br><small class="{"agree" if said["agree"] else "disagree"}">{_e(said["text"])}</small>'
        if said
        else ""
    )
    indent = f' style="margin-left: {2 * f["depth"]}em"' if f["depth"] else ""
    pending = (
        f" <small class='muted'>pending: held {_e(_held(f['holding_seconds']))} of its "
        f"{_e(f['for'])} (the rules fire it after that)</small>"
        if f["pending"]
        else ""
    )
    return (
        f'<div class="finding {_e(f["severity"])}" data-alert="{_e(f["alert"])}"{indent}>'
        f"<b>{_e(f['severity'].upper())} {_e(f['alert'])}</b>{pending} {_e(about)} "
        f"<span class='muted'>{_e(f['phase'])} / {_e(f['layer'])}</span>{explained}{spans}"
        "<table><tr><th></th><th>signal</th><th>measured</th><th></th><th>threshold</th>"
        f"<th></th></tr>{rows}</table>"
        f'<a href="{_e(f["runbook"])}">runbook</a></div>'
    )


def _held(holding: float | None) -> str:
    return "n/a" if holding is None else f"{holding:.0f} s"


def _polylines(points: Sequence[Sequence[Any]], span: tuple[float, float]) -> str:
    """The points as SVG polylines, one per run without gaps."""
    values = [v for _, v in points if v is not None]
    low, high = min(0.0, *values), max(values)
    high = high if high > low else low + 1.0
    start, end = span
    width = end - start or 1.0

    def xy(t: float, v: float) -> str:
        x = (t - start) / width * (WIDTH - 4) + 2
        y = HEIGHT - 2 - (v - low) / (high - low) * (HEIGHT - 4)
        return f"{x:.1f},{y:.1f}"

    runs: list[list[str]] = [[]]
    for t, v in points:
        if v is None:
            runs.append([])
        else:
            runs[-1].append(xy(t, v))
    lines = []
    for run in runs:
        if len(run) == 1:  # a lone point: a dot
            x, y = run[0].split(",")
            lines.append(f'<circle cx="{x}" cy="{y}" r="1.5" fill="#36c"/>')
        elif run:
            lines.append(
                f'<polyline fill="none" stroke="#36c" stroke-width="1.5" points="{" ".join(run)}"/>'
            )
    return "".join(lines)


def _spark(name: str, info: Mapping[str, str], points: Sequence[Sequence[Any]], span) -> str:
    values = [v for _, v in points if v is not None]
    head = f"<b>{_e(info['label'])}</b>"
    if not values:
        return f'<div class="spark" data-series="{_e(name)}">{head}<div class="nodata">no data</div></div>'
    latest = next(v for _, v in reversed(points) if v is not None)
    svg = (
        f'<svg width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{_e(info["label"])}">{_polylines(points, span)}</svg>'
    )
    return (
        f'<div class="spark" data-series="{_e(name)}">{head} '
        f"<span>{_e(fmt(latest, info['unit']))}</span>"
        f"<br><small>max {_e(fmt(max(values), info['unit']))}</small>{svg}</div>"
    )


def _sparks(doc: Mapping[str, Any]) -> str:
    times = [t for points in doc["series"].values() for t, _ in points]
    end = max(times, default=0.0)
    span = (end - doc["keep_seconds"], end)
    cells = "".join(
        _spark(name, doc["series_info"][name], points, span)
        for name, points in doc["series"].items()
    )
    return (
        f"<h2>last {doc['keep_seconds'] / 60:.0f} minutes</h2>"
        f"<small>each point: the signal over {doc['series_window_step_seconds']:g}+ s "
        f'between two polls</small><div class="sparks">{cells}</div>'
    )


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def _captures(doc: Mapping[str, Any] | None) -> str:
    """The evidence captures (``GET /captures``' document), newest first; nothing when off."""
    if doc is None:
        return ""
    rows = "".join(
        f'<tr><td><a href="{_e(c["url"])}">{_e(c["name"])}</a></td>'
        f"<td>{_size(c['bytes'])}</td>"
        f"<td>{_e(time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(c['time'])))}</td></tr>"
        for c in doc["captures"]
    )
    last = doc["last"]
    state = "a capture is running" if doc["running"] else ""
    if last is not None and not doc["running"]:
        parts = ", ".join(f"{p['name']}: {p['result']}" for p in last.get("parts", []))
        state = f"last: {last['name']} ({last['result']}{'; ' + parts if parts else ''})"
    table = f"<table>{rows}</table>" if rows else '<p class="nodata">none yet</p>'
    return (
        f'<div id="captures"><h2>Evidence captures</h2><p><small>{_e(state)}</small></p>'
        f"{table}</div>"
    )


_SLOW_KINDS = {"ttft": "by time to first token", "per_token": "by time per output token"}


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value * 1000:.1f} ms"


def _slow_row(r: Mapping[str, Any]) -> str:
    finished = r.get("finished")
    cells = (
        r.get("request_id", ""),
        r.get("trace_id", ""),
        _seconds(r.get("ttft_seconds")),
        _seconds(r.get("queue_seconds")),
        _seconds(r.get("prefill_seconds")),
        _seconds(r.get("decode_seconds")),
        _seconds(r.get("per_token_seconds")),
        r.get("prompt_tokens", ""),
        r.get("output_tokens", ""),
        "" if finished is None else time.strftime("%H:%M:%S", time.gmtime(finished)),
        r.get("ttft_dominated_by", ""),
        r.get("dominated_by", ""),
    )
    # The two ids (a request's can be long) wrap within their cells, as a copy reads them.
    return (
        "<tr>"
        + "".join(f'<td class="id">{_e(c)}</td>' for c in cells[:2])
        + "".join(f"<td>{_e(c)}</td>" for c in cells[2:])
        + "</tr>"
    )


def _slow_requests(doc: Mapping[str, Any] | None) -> str:
    """The window's slowest requests from the server's spans; nothing when not received."""
    if doc is None:
        return ""
    head = (
        "<tr><th>request</th><th>trace</th><th>TTFT</th><th>queue</th><th>prefill</th>"
        "<th>decode</th><th>per token</th><th>prompt</th><th>output</th><th>finished (UTC)</th>"
        "<th>TTFT mostly</th><th>mostly</th></tr>"
    )
    tables = "".join(
        f'<h3>{_e(title)}</h3><div class="wide"><table data-slowest="{_e(kind)}">{head}'
        f"{''.join(_slow_row(r) for r in doc[kind])}</table></div>"
        if doc[kind]
        else f'<h3>{_e(title)}</h3><p class="nodata">no request spans in the window</p>'
        for kind, title in _SLOW_KINDS.items()
    )
    lines = "".join(f"<li>{_e(line)}</li>" for line in doc["summary"])
    return (
        f'<div id="slow-requests"><h2>Slowest requests</h2><p><small>the {doc["most"]:d} '
        f"slowest of the last {doc['window_seconds']:g} s, from the server's request spans "
        f"(OTLP)</small></p><ul>{lines}</ul>{tables}</div>"
    )


def render_page(
    doc: Mapping[str, Any],
    backend: str,
    url: str,
    interval: float,
    captures: Mapping[str, Any] | None = None,
) -> str:
    """The verdict page for ``doc`` (from :meth:`VerdictHistory.document`); with
    ``captures``, their list."""
    findings = "".join(_finding(f, doc["labels"]) for f in doc["findings"])
    labels = " ".join(f"{k}={v}" for k, v in sorted(doc["labels"].items()))
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">'
        f"<title>inferwatch verdict</title><style>{_STYLE}</style></head><body>"
        f"<h1>inferwatch {_e(__version__)}</h1>"
        f"<p>Sidecar exporter for LLM inference servers: backend <b>{_e(backend)}</b> at "
        f"<code>{_e(url)}</code>, polled every {interval:g} s. <small>{_e(labels)}</small></p>"
        f'{_banner(doc)}{_phase(doc)}<div id="findings">{findings}</div>{_sparks(doc)}'
        f"{_slow_requests(doc.get('slow_requests'))}{_captures(captures)}"
        '<p><a href="metrics">metrics</a> · <a href="healthz">healthz</a> · '
        '<a href="verdict.json">verdict.json</a></p>'
        f"<p><small>refreshes every {REFRESH_SECONDS} s; the same conditions as the alert "
        "rules and <code>inferwatch diagnose</code>.</small></p></body></html>\n"
    )
