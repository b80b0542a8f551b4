"""The ``inferwatch`` command: serve, generate, baseline, calibrate, diagnose, capture.

Bad input anywhere (flags, environment, config file) ends in one line on stderr and exit
code 2, never a traceback.

``serve`` is the sidecar: it imports nothing of the tooling (the sweep, diagnose, the
dashboard builder and grafanalib load only for the subcommand that needs them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from inferwatch import __version__
from inferwatch.baseline import load as load_baseline
from inferwatch.calibration import thresholds_from
from inferwatch.logs import LogfmtFormatter, printable
from inferwatch.method.spec import Spec, spec_from_config
from inferwatch.serve import command as serve
from inferwatch.settings import (
    ConfigError,
    Option,
    bounded_float,
    check_keys,
    existing_file,
    flag_type,
    http_url,
    load_config_file,
    positive_float,
    positive_int,
    resolve,
)

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _error(exc: Exception) -> None:
    """The error in one line on stderr, whatever its text holds (it may quote a server)."""
    print(f"inferwatch: error: {printable(str(exc))}", file=sys.stderr)


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp").setLevel(logging.WARNING)


# Config-file sections read by `generate` and `diagnose` (the heuristics spec's overrides).
SPEC_SECTIONS = ("thresholds", "alerting", "slos")


def _config_keys() -> set[str]:
    """Every key a config file may hold (all subcommands share one file)."""
    return {o.key for o in serve.OPTIONS} | set(SPEC_SECTIONS)


def _add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", type=flag_type(existing_file), help="YAML config file [env INFERWATCH_CONFIG]"
    )


COMMANDS = ("serve", "generate", "baseline", "calibrate", "diagnose", "capture")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line; with ``only``, the other subcommands get no flags (so that
    ``serve`` loads none of the tools' option tables)."""
    parser = _Parser(
        prog="inferwatch",
        description="Sidecar Prometheus exporter, rules and dashboards for LLM inference servers.",
    )
    parser.add_argument("--version", action="version", version=f"inferwatch {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    adders = {
        "serve": _add_serve_parser,
        "generate": _add_generate_parser,
        "baseline": _add_baseline_parser,
        "calibrate": _add_calibrate_parser,
        "diagnose": _add_diagnose_parser,
        "capture": _add_capture_parser,
    }
    for name, add in adders.items():
        if only in (None, name):
            add(commands)
        else:
            commands.add_parser(name, help=_SUMMARIES[name])
    return parser


_SUMMARIES = {
    "serve": "run the exporter next to an inference server",
    "generate": "write alert rules, runbooks, Alertmanager example and dashboards",
    "baseline": "load sweep (concurrency x prompt x output tokens) against an "
    "OpenAI-compatible server; writes a baseline file",
    "calibrate": "measure the server (a short baseline sweep), then write the config whose "
    "thresholds come from it",
    "diagnose": "walk the method over live data: phase, layer, evidence, runbook",
    "capture": "ask a running exporter for an evidence capture (profiler trace, stacks, pages) "
    "and download it",
}


def _add_serve_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("serve", help=_SUMMARIES["serve"])
    _add_config_flag(p)
    for option in serve.OPTIONS:
        option.add_to(p)


def _add_generate_parser(commands: argparse._SubParsersAction) -> None:
    g = commands.add_parser("generate", help=_SUMMARIES["generate"])
    g.add_argument("--out", required=True, type=Path, help="directory to write alerts/ under")
    g.add_argument(
        "--baseline",
        type=flag_type(existing_file),
        help="baseline file: latency thresholds become regression_factor x its p95 at the "
        "highest measured concurrency",
    )
    _add_config_flag(g)


def _add_timeout_flag(parser: argparse.ArgumentParser, default: float) -> None:
    parser.add_argument(
        "--timeout",
        type=flag_type(positive_float),
        default=default,
        metavar="S",
        help=f"seconds per request (default: {default:g})",
    )


def _add_diagnose_parser(commands: argparse._SubParsersAction) -> None:
    from inferwatch.tools import credentials

    d = commands.add_parser(
        "diagnose",
        help=_SUMMARIES["diagnose"],
        description="Exit status: 0 nothing holds; 1 only info findings; 3 warning; "
        "4 critical; 2 bad input; 5 the source cannot be read.",
    )
    source = d.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--prometheus",
        type=flag_type(http_url),
        metavar="URL",
        help="a Prometheus that scrapes inferwatch and runs its recording rules",
    )
    source.add_argument(
        "--exporter",
        type=flag_type(http_url),
        metavar="URL",
        help="one inferwatch exporter, scraped twice --interval apart",
    )
    d.add_argument(
        "--interval",
        type=flag_type(bounded_float(1, 300)),
        default=5.0,
        metavar="S",
        help="seconds between the two scrapes of --exporter (default: 5)",
    )
    _add_timeout_flag(d, 10.0)
    d.add_argument("--json", action="store_true", help="print the report as JSON")
    _add_config_flag(d)
    credentials.add_flags(d)


def _add_capture_parser(commands: argparse._SubParsersAction) -> None:
    from inferwatch.tools import credentials

    c = commands.add_parser(
        "capture",
        help=_SUMMARIES["capture"],
        description="Exit status: 0 complete; 1 partial, failed or refused (one runs, or "
        "too soon); 2 bad input; 5 the exporter cannot be reached, has captures off, names "
        "a capture or archive unlike an exporter's, sends an archive over --max-bytes, or "
        "the file to save (<id>.tar.gz under --out) exists already.",
    )
    c.add_argument(
        "--exporter",
        required=True,
        type=flag_type(http_url),
        metavar="URL",
        help="the exporter, started with --capture-dir",
    )
    c.add_argument(
        "--seconds",
        type=flag_type(bounded_float(1, 120)),
        metavar="S",
        help="profile for S seconds (at most the exporter's --capture-seconds)",
    )
    c.add_argument(
        "--out", type=Path, default=Path("."), help="folder to save the archive in (default: .)"
    )
    c.add_argument(
        "--wait",
        type=flag_type(positive_float),
        default=300.0,
        metavar="S",
        help="seconds to wait for the capture (default: 300)",
    )
    _add_timeout_flag(c, 30.0)
    c.add_argument(
        "--max-bytes",
        type=flag_type(positive_int),
        default=1024**3,
        metavar="N",
        help="largest archive downloaded; a bigger one is an error and nothing is saved "
        "(default: 1 GiB)",
    )
    credentials.add_flags(c)


def _capture(args: argparse.Namespace) -> int:
    from inferwatch.tools import capture, credentials

    access = credentials.from_args(args)
    if not args.out.is_dir():
        raise ConfigError(f"--out {args.out}: not a directory")
    try:
        return asyncio.run(
            capture.capture(
                args.exporter,
                seconds=args.seconds,
                out=args.out,
                wait=args.wait,
                timeout=args.timeout,
                max_bytes=args.max_bytes,
                credentials=access,
            )
        )
    except capture.CaptureError as exc:
        _error(exc)
        return capture.EXIT_UNREACHABLE


def _diagnose(args: argparse.Namespace, config: dict) -> int:
    from inferwatch.tools import credentials, diagnose
    from inferwatch.tools import report as output

    path = _config_path(args)
    spec = spec_from_config(config)
    access = credentials.from_args(args)
    try:
        if args.prometheus:
            judged_with = f"--config {path}" if path else "the built-in defaults"
            report = asyncio.run(
                diagnose.from_prometheus(args.prometheus, spec, args.timeout, judged_with, access)
            )
        else:
            # The exporter's own spec unless a config file is given (then it overrides).
            report = asyncio.run(
                diagnose.from_exporter(
                    args.exporter,
                    (spec, f"--config {path}") if path else None,
                    args.interval,
                    args.timeout,
                    access,
                )
            )
    except diagnose.SourceError as exc:
        _error(exc)
        return diagnose.EXIT_UNREADABLE
    if args.json:
        print(json.dumps(output.report_json(report), indent=2))
    else:  # label values come from the servers: escaped for the terminal
        print(printable(output.render(report), lines=True))
    return report.exit_code()


def _add_options_parser(
    commands: argparse._SubParsersAction,
    name: str,
    options: Sequence[Option],
    summary: str,
    description: str,
) -> None:
    """A subcommand whose flags are an option table (plus ``--config``)."""
    p = commands.add_parser(name, help=summary, description=description)
    _add_config_flag(p)
    for option in options:
        option.add_to(p)


def _add_baseline_parser(commands: argparse._SubParsersAction) -> None:
    from inferwatch.tools.sweep import command as sweep

    _add_options_parser(
        commands,
        "baseline",
        sweep.OPTIONS,
        summary=_SUMMARIES["baseline"],
        description="Exit status: 0; 3 when a cell regressed against --previous (the file is "
        "written); 1 when the sweep cannot run; 2 for bad input.",
    )


def _add_calibrate_parser(commands: argparse._SubParsersAction) -> None:
    from inferwatch.tools import calibrate

    _add_options_parser(
        commands,
        "calibrate",
        calibrate.OPTIONS,
        summary=_SUMMARIES["calibrate"],
        description="Writes --out (a config for serve, generate and diagnose: thresholds "
        "from the measured percentiles, each commented with its source) and the baseline "
        "file. Settings of --config are carried over. Exit status: 0; 1 when the sweep "
        "cannot run; 2 for bad input.",
    )


def _config_path(args: argparse.Namespace) -> Path | None:
    path = args.config
    if path is None and os.environ.get("INFERWATCH_CONFIG"):
        try:
            path = existing_file(os.environ["INFERWATCH_CONFIG"])
        except ValueError as exc:
            raise ConfigError(f"INFERWATCH_CONFIG: {exc}") from None
    return path


def _config_from(args: argparse.Namespace) -> dict:
    path = _config_path(args)
    config = load_config_file(path)
    check_keys(config, _config_keys(), str(path))
    spec_from_config(config)  # every subcommand refuses bad `thresholds:`/`alerting:` alike
    return config


def _spec(config: dict, baseline_file: Path | None) -> Spec:
    """The heuristics spec from the config file, latency thresholds from a baseline if given."""
    derived = {}
    if baseline_file is not None:
        spec = spec_from_config(config)
        found = thresholds_from(
            load_baseline(baseline_file), spec.threshold("regression_factor"), spec.window_seconds
        )
        derived = {name: d.value for name, d in found.items()}
    return spec_from_config(config, derived)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(next((a for a in argv if a in COMMANDS), None))
    args = parser.parse_args(argv)
    try:
        if args.command == "capture":  # a client of a running exporter: no config file
            return _capture(args)
        config = _config_from(args)
        if args.command == "serve":
            values = resolve(serve.OPTIONS, vars(args), config)
            _setup_logging(values["log_level"])
            serve.run(serve.ServeConfig.from_values(values), spec=_spec(config, values["baseline"]))
        elif args.command == "generate":
            from inferwatch.tools import generate

            for path in generate.write(args.out, _spec(config, args.baseline)):
                print(path)
        elif args.command == "diagnose":
            return _diagnose(args, config)
        elif args.command == "baseline":
            from inferwatch.tools.sweep import command as sweep

            return sweep.main(vars(args), config)
        elif args.command == "calibrate":
            from inferwatch.tools import calibrate

            path = _config_path(args)
            return calibrate.main(vars(args), config, str(path) if path else "--config")
    except ConfigError as exc:
        _error(exc)
        return EXIT_USAGE
    except OSError as exc:  # e.g. `generate` cannot write under --out
        _error(exc)
        return 1
    return 0
