"""Options from flags, ``INFERWATCH_*`` environment variables and a strict YAML config file.

Every option is declared once in an :class:`Option` table. Precedence: command-line flag,
then environment variable, then config file, then the default. The config file uses the
flag names with ``-`` and ``.`` turned into ``_`` (``--web.listen-address`` ->
``web_listen_address``); an unknown key is an error naming it, so a typo never silently
falls back to a default.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from inferwatch.urls import at_past_authority, redact_url

ENV_PREFIX = "INFERWATCH_"


class ConfigError(ValueError):
    """Bad input from a flag, environment variable or config file; str() is one line."""


@dataclass(frozen=True)
class Option:
    """One setting; ``parse`` turns text (flag or env value) into the typed value."""

    flag: str
    _: KW_ONLY
    parse: Callable[[str], Any]
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    # A comma-separated list: the config file may also give a YAML list.
    many: bool = False

    @property
    def key(self) -> str:
        return self.flag.lstrip("-").replace("-", "_").replace(".", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        default_text = "" if self.default is None else f" (default: {self.default})"
        parser.add_argument(
            self.flag,
            dest=self.key,
            type=self._parse_flag,
            default=argparse.SUPPRESS,
            metavar=self.metavar or self.key.upper(),
            help=f"{self.help}{default_text} [env {self.env}]",
        )

    def _parse_flag(self, text: str) -> Any:
        return flag_type(self.convert)(text)

    def convert(self, value: Any) -> Any:
        """Validate a value from any source; raises ConfigError saying what is wrong."""
        if isinstance(value, bool) and self.choices and {"on", "off"} <= set(self.choices):
            value = "on" if value else "off"  # YAML 1.1 reads a bare `off` as false
        if self.many and isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = ",".join(value)
        if isinstance(value, (dict, list)):
            raise ConfigError(f"expected a single value, got a {type(value).__name__}")
        text = str(value).strip()
        if self.choices and text not in self.choices:
            raise ConfigError(f"{text!r} is not one of {', '.join(self.choices)}")
        try:
            return self.parse(text)
        except (ValueError, TypeError) as exc:
            raise ConfigError(str(exc)) from None


def flag_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` as an argparse type: its error message becomes argparse's."""

    def parse_flag(text: str) -> Any:
        try:
            return parse(text)
        except (ConfigError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse_flag


def _number(text: str) -> float:
    """A finite number: ``inf``, ``nan`` and overflowing values such as ``1e400`` are refused."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    return value


def positive_float(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise ValueError(f"{text!r} must be greater than 0")
    return value


def ratio(text: str) -> float:
    value = _number(text)
    if not 0 <= value <= 1:
        raise ValueError(f"{text!r} must be between 0 and 1")
    return value


def bounded_float(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = _number(text)
        if not low <= value <= high:
            raise ValueError(f"{text!r} must be between {low:g} and {high:g}")
        return value

    return parse


def positive_int(text: str) -> int:
    number = _number(text)
    if number != int(number):
        raise ValueError(f"{text!r} is not a whole number")
    value = int(number)
    if value <= 0:
        raise ValueError(f"{text!r} must be a positive integer")
    return value


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = positive_int(text) if low > 0 else int(_number(text))
        if not low <= value <= high:
            raise ValueError(f"{text!r} must be between {low} and {high}")
        return value

    return parse


def http_url(text: str) -> str:
    """An ``http://`` or ``https://`` URL with a host, and a port from 1 to 65535 if it names one.

    Errors quote the URL without its ``user:password@``; one with an ``@`` past its host
    part, which may end a password holding an unencoded ``/``, ``?`` or ``#``, is refused
    without quoting any of it.
    """
    if at_past_authority(text):
        raise ValueError(
            "a URL with an '@' past its host part is refused (not shown): in a user or "
            "password, percent-encode '/' '?' '#' '@' as %2F %3F %23 %40"
        )
    shown = repr(redact_url(text))
    if not text.startswith(("http://", "https://")):
        raise ValueError(f"{shown} is not an http:// or https:// URL")
    if not text.isprintable() or " " in text:
        raise ValueError(f"{shown} holds a space or a control character")
    try:
        url = urlsplit(text)
        port = url.port
    except ValueError as exc:  # "Port out of range 0-65535", "Invalid IPv6 URL"
        raise ValueError(f"{shown} is not a usable URL: {exc}") from None
    if not url.hostname:
        raise ValueError(f"{shown} names no host")
    if port == 0:
        raise ValueError(f"{shown}: port 0 cannot be connected to")
    return text


def listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` (all interfaces) or ``[v6]:PORT`` -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


# RFC 9110 token characters: what a header name may hold.
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def _printable(text: str) -> bool:
    """Visible ASCII and inner spaces only: nothing that could split or smuggle a header."""
    return all(" " <= c <= "~" for c in text)


def header_line(text: str) -> tuple[str, str]:
    """``Name: value`` -> (name, value). Errors never echo the text: the value is a secret."""
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not _HEADER_NAME.match(name) or not value or not _printable(value):
        raise ValueError("expected 'Name: value': a header name, a colon and a one-line value")
    return name, value


def read_secret(path: Path) -> str:
    """The one-line secret in ``path`` (e.g. a bearer token), surrounding whitespace removed.

    Errors name the file, never its content.
    """
    try:
        secret = path.read_text(encoding="ascii").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not ASCII text") from None
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None
    if not secret:
        raise ConfigError(f"{path}: empty")
    if " " in secret or not _printable(secret):
        raise ConfigError(f"{path}: expected one token of printable ASCII on one line")
    return secret


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise ValueError(f"{text}: no such file")
    return path


def existing_dir(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise ValueError(f"{text}: no such directory")
    return path


def read_text(path: Path) -> str:
    """The UTF-8 text of ``path``; ConfigError naming the file when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def load_config_file(path: Path | None) -> dict[str, Any]:
    """The YAML mapping in ``path`` (empty when None); errors name the file."""
    if path is None:
        return {}
    text = read_text(path)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark is not None else ""
        # A ReaderError (e.g. a NUL byte) has a reason instead of a problem.
        problem = getattr(exc, "problem", None) or getattr(exc, "reason", None) or "invalid YAML"
        raise ConfigError(f"{path}:{where} {problem}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(doc).__name__}")
    return doc


def check_keys(doc: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    allowed = set(allowed)
    for key in doc:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(allowed))})")


def non_negative_number(value: Any, where: str) -> float:
    """A document's number that must be finite and >= 0 (YAML's bools are not numbers)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ConfigError(f"{where}: {value!r} is not a non-negative number")
    return float(value)


def check_fields(doc: Any, kind: type, where: str, optional: Iterable[str] = ()) -> None:
    """A document mapping that has every field of the dataclass ``kind`` but ``optional``,
    and no other key; ValueError names the first that is wrong."""
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: expected a mapping")
    fields = set(kind.__dataclass_fields__)  # type: ignore[attr-defined]
    unknown = set(doc) - fields
    if unknown:
        raise ValueError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    missing = fields - set(doc) - set(optional)
    if missing:
        raise ValueError(f"{where}: missing {sorted(missing)[0]!r}")


def non_negative_int(value: Any, where: str) -> int:
    """A document's integer that must be >= 0 (YAML's bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: {value!r} is not a non-negative integer")
    return value


def resolve(
    options: Iterable[Option],
    flags: Mapping[str, Any],
    config: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Each option's value: flag, else environment, else config file, else default."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for option in options:
        if option.key in flags:
            values[option.key] = flags[option.key]
        elif env.get(option.env, "") != "":
            try:
                values[option.key] = option.convert(env[option.env])
            except ConfigError as exc:
                raise ConfigError(f"{option.env}: {exc}") from None
        elif option.key in config:
            try:
                values[option.key] = option.convert(config[option.key])
            except ConfigError as exc:
                raise ConfigError(f"config key {option.key!r}: {exc}") from None
        else:
            values[option.key] = None if option.default is None else option.convert(option.default)
    return values
