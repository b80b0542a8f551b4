"""The ``inferwatch`` command: serve, generate, baseline, diagnose.

Bad input anywhere (flags, environment, config file) ends in one line on stderr and exit
code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from inferwatch import __version__, generate, serve
from inferwatch.baseline import load as load_baseline
from inferwatch.baseline import thresholds_from
from inferwatch.heuristics import Spec, spec_from_config
from inferwatch.settings import (
    ConfigError,
    check_keys,
    existing_file,
    flag_type,
    load_config_file,
    resolve,
)

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


class _LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = self.formatTime(record, "%Y-%m-%dT%H:%M:%S")
        msg = record.getMessage().replace('"', "'")
        line = f'ts={ts} level={record.levelname.lower()} source={record.name} msg="{msg}"'
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp").setLevel(logging.WARNING)


# Config-file sections read by `generate` and `diagnose` (the heuristics spec's overrides).
SPEC_SECTIONS = ("thresholds", "alerting")


def _config_keys() -> set[str]:
    """Every key a config file may hold (all subcommands share one file)."""
    return {o.key for o in serve.OPTIONS} | set(SPEC_SECTIONS)


def _add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", type=flag_type(existing_file), help="YAML config file [env INFERWATCH_CONFIG]"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="inferwatch",
        description="Sidecar Prometheus exporter, rules and dashboards for LLM inference servers.",
    )
    parser.add_argument("--version", action="version", version=f"inferwatch {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = commands.add_parser("serve", help="run the exporter next to an inference server")
    _add_config_flag(p)
    for option in serve.OPTIONS:
        option.add_to(p)
    g = commands.add_parser(
        "generate", help="write alert rules, runbooks, Alertmanager example and dashboards"
    )
    g.add_argument("--out", required=True, type=Path, help="directory to write alerts/ under")
    g.add_argument(
        "--baseline",
        type=flag_type(existing_file),
        help="baseline file: latency thresholds become regression_factor x its p95 at the "
        "highest measured concurrency",
    )
    _add_config_flag(g)
    return parser


def _config_from(args: argparse.Namespace) -> dict:
    path = args.config
    if path is None and os.environ.get("INFERWATCH_CONFIG"):
        try:
            path = existing_file(os.environ["INFERWATCH_CONFIG"])
        except ValueError as exc:
            raise ConfigError(f"INFERWATCH_CONFIG: {exc}") from None
    config = load_config_file(path)
    check_keys(config, _config_keys(), str(path))
    return config


def _spec(config: dict, baseline_file: Path | None) -> Spec:
    """The heuristics spec from the config file, latency thresholds from a baseline if given."""
    derived = {}
    if baseline_file is not None:
        factor = spec_from_config(config).t("regression_factor")
        derived = thresholds_from(load_baseline(baseline_file), factor)
    return spec_from_config(config, derived)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = _config_from(args)
        if args.command == "serve":
            values = resolve(serve.OPTIONS, vars(args), config)
            _setup_logging(values["log_level"])
            serve.run(serve.ServeConfig.from_values(values))
        elif args.command == "generate":
            for path in generate.write(args.out, _spec(config, args.baseline)):
                print(path)
    except ConfigError as exc:
        print(f"inferwatch: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # e.g. the listen address is taken
        print(f"inferwatch: error: {exc}", file=sys.stderr)
        return 1
    return 0
