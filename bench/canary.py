"""The canary's CPU cost, measured (prints figures; not a test).

Two ``inferwatch serve`` processes run side by side against the same real vLLM on CPU (or
``--backend-url``), with the same flags (``--backend vllm --gpu off``, the default
``--poll-interval``), one of them with ``--canary on --canary-interval 15``: it sends one
small streamed request every 15 s and times it. No other traffic; each exporter's
``/metrics`` is scraped every 15 s, as Prometheus would. Over ``--seconds`` the script
counts each process's CPU time (utime + stime from /proc, its children's included) and
prints, for each, the CPU cores used (CPU seconds / wall seconds) and the RSS at the end,
then the CPU per probe (the difference over the probes the canary sent meanwhile) and the
ratio with / without. Both run in the same window, so a busy machine slows both alike.

    .venv/bin/python bench/canary.py [--seconds 300] [--canary-interval 15] [--backend-url URL]
                                     [--write-docs]

With ``--write-docs`` the figures, with the date and the machine, also replace the canary's
generated region of docs/performance.md.

Sample output (2 cores, vLLM 0.32 on CPU, tiny model):

    300 s, polls every 0.5 s, a scrape of each every 15 s, canary every 15 s
                        CPU s    cores  RSS MiB
    without canary       2.51   0.0084     43.5
    with canary          2.68   0.0089     44.0
    probes sent: 20 (ok 20); CPU per probe: 8.5 ms; with / without: 1.068x
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from demo.stack import Inferwatch, VllmServer, children_of, http_get  # noqa: E402
from inferwatch.serve.command import OPTIONS  # noqa: E402
from inferwatch.tools.measured import (  # noqa: E402
    CANARY_BENCH,
    PERFORMANCE,
    this_machine,
    write_figures,
)

PROBES = "inferwatch_canary_probes_total"


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid``, with its reaped children's and its live children's."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    own = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return own + sum(cpu_seconds(child) for child, _ in children_of(pid))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def probes(page: str) -> dict[str, float]:
    """The canary's probes on ``page``, by result (empty before the first one)."""
    out: dict[str, float] = {}
    for line in page.splitlines():
        if line.startswith(PROBES + "{"):
            result = line.split('result="', 1)[1].split('"', 1)[0]
            out[result] = out.get(result, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def default_poll_interval() -> float:
    return next(o.default for o in OPTIONS if o.flag == "--poll-interval")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=300.0, help="length of the window")
    parser.add_argument(
        "--canary-interval", type=float, default=15.0, help="seconds between probes"
    )
    parser.add_argument(
        "--scrape-interval", type=float, default=15.0, help="seconds between scrapes"
    )
    parser.add_argument("--backend-url", help="a running vLLM (default: start one on CPU)")
    parser.add_argument(
        "--write-docs", action="store_true", help="also write the figures to docs/performance.md"
    )
    args = parser.parse_args()
    poll = default_poll_interval()
    flags = ["--backend", "vllm", "--gpu", "off", "--poll-interval", str(poll)]
    canary = ["--canary", "on", "--canary-interval", str(args.canary_interval)]
    with tempfile.TemporaryDirectory(prefix="inferwatch-canary-") as tmp:
        workdir = Path(tmp)
        server = None if args.backend_url else VllmServer(workdir / "vllm")
        exporters: dict[str, Inferwatch] = {}
        try:
            url = args.backend_url or server.start().url
            for label, extra in (("without canary", []), ("with canary", canary)):
                exporters[label] = Inferwatch(workdir / label, url, flags + extra).start()
            time.sleep(2)  # past the start-up (imports, first polls)
            pids = {label: ex.process.pid for label, ex in exporters.items()}
            before = probes(exporters["with canary"].page())
            cpu0 = {label: cpu_seconds(pid) for label, pid in pids.items()}
            start = time.monotonic()
            end = start + args.seconds
            next_scrape = start
            while (now := time.monotonic()) < end:
                if now >= next_scrape:
                    for ex in exporters.values():
                        http_get(f"{ex.url}/metrics")
                    next_scrape += args.scrape_interval
                time.sleep(max(0.0, min(next_scrape, end) - time.monotonic()))
            cpu = {label: cpu_seconds(pid) - cpu0[label] for label, pid in pids.items()}
            wall = time.monotonic() - start
            rss = {label: rss_mib(pid) for label, pid in pids.items()}
            page = exporters["with canary"].page()
        finally:
            for ex in exporters.values():
                ex.stop()
            if server is not None:
                server.stop()
    results = {r: n - before.get(r, 0.0) for r, n in probes(page).items()}
    sent = sum(results.values())
    extra_cpu = cpu["with canary"] - cpu["without canary"]
    conditions = (
        f"{wall:.0f} s, polls every {poll:g} s, a scrape of each every "
        f"{args.scrape_interval:g} s, canary every {args.canary_interval:g} s"
    )
    print(conditions)
    print(f"{'':16s} {'CPU s':>8s} {'cores':>8s} {'RSS MiB':>8s}")
    for label in exporters:
        print(f"{label:16s} {cpu[label]:8.2f} {cpu[label] / wall:8.4f} {rss[label]:8.1f}")
    per_probe = f"{extra_cpu / sent * 1000:.1f} ms" if sent else "n/a"
    sent_text = f"{sent:g} ({', '.join(f'{r} {n:g}' for r, n in results.items() if n)})"
    ratio = f"{cpu['with canary'] / cpu['without canary']:.3f}x"
    print(f"probes sent: {sent_text}; CPU per probe: {per_probe}; with / without: {ratio}")
    if args.write_docs:
        figures = {"window": conditions, "probes sent": sent_text}
        for label in exporters:
            figures[f"exporter {label}"] = (
                f"{cpu[label] / wall * 100:.2f} % of one core, RSS {rss[label]:.1f} MiB"
            )
        figures["CPU per probe"] = per_probe
        figures["CPU with / without the canary"] = ratio
        write_figures(REPO / PERFORMANCE, figures, machine(args), CANARY_BENCH)


def machine(args: argparse.Namespace) -> dict[str, str]:
    """Where and when the figures were measured, and with which options."""
    options = f"--seconds {args.seconds:g} --canary-interval {args.canary_interval:g}"
    return {**this_machine(), "options": options}


if __name__ == "__main__":
    main()
