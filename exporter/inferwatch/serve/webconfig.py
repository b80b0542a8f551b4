"""``--web.config.file``: TLS and basic auth in the Prometheus exporter-toolkit format.

The file is the one every Go exporter reads (exporter-toolkit ``docs/web-configuration.md``)::

    tls_server_config:
      cert_file: server.crt            # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional mutual TLS
      client_ca_file: clients-ca.crt
      min_version: TLS12
    http_server_config:
      headers:
        Strict-Transport-Security: max-age=31536000
    basic_auth_users:
      prometheus: $2y$10$X0h1gDsPszWURQaxFh.zoubFi6DXncSjhoQNJgRrnGs7EsimhC7zG

It is parsed strictly: an unknown key, or a toolkit key inferwatch does not implement, is an
error naming it. Unlike the toolkit, the file is read once at start (restart to apply a
change). Basic auth (:mod:`.basic_auth`) protects every path but ``/healthz``; neither
passwords nor hashes are ever logged.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
from aiohttp import web
from aiohttp.typedefs import Middleware

from inferwatch.serve.basic_auth import BasicAuthUsers, bcrypt_cost
from inferwatch.settings import ConfigError, check_keys, load_config_file

_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# client_auth_type values Python's ssl can honour; the toolkit's RequestClientCert and
# RequireAnyClientCert ask for a certificate without verifying it, which ssl cannot do.
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# Toolkit keys with no implementation here: rejected by name rather than ignored.
_UNSUPPORTED = {
    "tls_server_config": (
        "cert",
        "key",
        "client_ca",
        "client_allowed_sans",
        "cipher_suites",
        "prefer_server_cipher_suites",
        "curve_preferences",
    ),
    "top level": ("rate_limit",),
}
_TLS_KEYS = (
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
)
# The response headers the toolkit allows, with the values it accepts where it restricts them.
_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Content-Security-Policy": None,
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-Content-Type-Options": ("nosniff",),
    "X-XSS-Protection": None,
    "Strict-Transport-Security": None,
}
_BCRYPT_HASH = re.compile(r"^\$2[aby]\$(?P<cost>\d\d)\$[./A-Za-z0-9]{53}$")
# The costs (log2 of the key-expansion rounds) bcrypt accepts, and the least that is not
# warned about (htpasswd's default is 5: a stolen hash of it is cheap to crack).
_BCRYPT_COSTS = range(4, 32)
MIN_BCRYPT_COST = 10


@dataclass(frozen=True)
class TlsConfig:
    cert_file: Path
    key_file: Path
    client_auth: ssl.VerifyMode = ssl.CERT_NONE
    client_ca_file: Path | None = None
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3

    def context(self) -> ssl.SSLContext:
        """The server context; ConfigError naming the file when one cannot be loaded."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = self.min_version
        ctx.maximum_version = self.max_version
        try:
            # An empty password: an encrypted key fails to load instead of prompting on a tty.
            ctx.load_cert_chain(self.cert_file, self.key_file, password="")
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot load cert_file {self.cert_file} / key_file {self.key_file}: "
                f"{_reason(exc)} (keys must be unencrypted PEM)"
            ) from None
        if self.client_ca_file is not None:
            try:
                ctx.load_verify_locations(cafile=self.client_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(
                    f"cannot load client_ca_file {self.client_ca_file}: {_reason(exc)}"
                ) from None
        ctx.verify_mode = self.client_auth
        return ctx


@dataclass(frozen=True)
class WebConfig:
    """What the web config file asks for; an empty file asks for nothing."""

    tls: TlsConfig | None = None
    users: BasicAuthUsers | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def ssl_context(self) -> ssl.SSLContext | None:
        return None if self.tls is None else self.tls.context()

    def describe(self) -> str:
        """One line for the start-up log: what is on, never a secret."""
        parts = ["TLS off" if self.tls is None else "TLS on"]
        if self.tls is not None and self.tls.client_auth != ssl.CERT_NONE:
            parts.append("client certificates verified")
        count = len(self.users.hashes) if self.users else 0
        parts.append(f"basic auth for {count} user(s)" if count else "no basic auth")
        return ", ".join(parts)

    def cheap_hashes(self) -> dict[str, int]:
        """Users whose hash costs less than :data:`MIN_BCRYPT_COST`, and its cost."""
        hashes = self.users.hashes if self.users else {}
        costs = {user: bcrypt_cost(hashed) for user, hashed in hashes.items()}
        return {user: cost for user, cost in costs.items() if cost < MIN_BCRYPT_COST}

    def middlewares(self) -> list[Middleware]:
        """aiohttp middlewares enforcing basic auth (none without users)."""
        return [] if self.users is None else [self.users.middleware]

    async def add_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        """``on_response_prepare`` hook: the configured headers on every response."""
        response.headers.update(self.headers)


def load(path: Path) -> WebConfig:
    """Parse ``path`` strictly; ConfigError (one line, naming file and key) on bad input."""
    doc = load_config_file(path)
    where = str(path)
    _reject(
        doc, ("tls_server_config", "http_server_config", "basic_auth_users"), "top level", where
    )
    base = path.parent
    return WebConfig(
        tls=_tls(_section(doc, "tls_server_config", where), base, where),
        users=_users(_section(doc, "basic_auth_users", where), where),
        headers=_headers(_section(doc, "http_server_config", where), where),
    )


def _reject(doc: Mapping[str, Any], known: tuple[str, ...], section: str, where: str) -> None:
    for key in doc:
        if key in _UNSUPPORTED.get(section, ()):
            raise ConfigError(f"{where}: {section} key {key!r} is not supported by inferwatch")
    check_keys(doc, known, f"{where}: {section}")


def _section(doc: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {key} must be a mapping, got {type(value).__name__}")
    return value


def _text(section: Mapping[str, Any], key: str, name: str, where: str) -> str | None:
    value = section.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {name}.{key} must be a string")
    return value


def _file(section: Mapping[str, Any], key: str, base: Path, where: str) -> Path | None:
    text = _text(section, key, "tls_server_config", where)
    if text is None:
        return None
    path = base / text
    if not path.is_file():
        raise ConfigError(f"{where}: tls_server_config.{key}: {path}: no such file")
    return path


def _choice(section: Mapping[str, Any], key: str, choices: Mapping[str, Any], where: str) -> Any:
    text = _text(section, key, "tls_server_config", where)
    if text is None:
        return None
    if text not in choices:
        raise ConfigError(
            f"{where}: tls_server_config.{key}: {text!r} is not one of {', '.join(choices)}"
        )
    return choices[text]


def _tls(section: dict[str, Any], base: Path, where: str) -> TlsConfig | None:
    _reject(section, _TLS_KEYS, "tls_server_config", where)
    auth_type = section.get("client_auth_type")
    if auth_type in ("RequestClientCert", "RequireAnyClientCert"):
        raise ConfigError(
            f"{where}: tls_server_config.client_auth_type {auth_type} is not supported "
            "(Python's TLS cannot ask for a certificate without verifying it); "
            "use RequireAndVerifyClientCert"
        )
    cert = _file(section, "cert_file", base, where)
    key = _file(section, "key_file", base, where)
    client_auth = _choice(section, "client_auth_type", _CLIENT_AUTH, where) or ssl.CERT_NONE
    client_ca = _file(section, "client_ca_file", base, where)
    low = _choice(section, "min_version", _TLS_VERSIONS, where) or ssl.TLSVersion.TLSv1_2
    high = _choice(section, "max_version", _TLS_VERSIONS, where) or ssl.TLSVersion.TLSv1_3
    if cert is None and key is None:
        if section:
            raise ConfigError(f"{where}: tls_server_config needs cert_file and key_file")
        return None
    if cert is None or key is None:
        missing = "cert_file" if cert is None else "key_file"
        raise ConfigError(f"{where}: tls_server_config: missing {missing}")
    if client_auth != ssl.CERT_NONE and client_ca is None:
        raise ConfigError(f"{where}: client_auth_type {auth_type} needs client_ca_file")
    if client_ca is not None and client_auth == ssl.CERT_NONE:
        raise ConfigError(
            f"{where}: client_ca_file is set but client_auth_type is NoClientCert "
            "(client certificates would not be checked)"
        )
    if low > high:
        raise ConfigError(f"{where}: tls_server_config: min_version is above max_version")
    return TlsConfig(cert, key, client_auth, client_ca, low, high)


def _users(section: dict[str, Any], where: str) -> BasicAuthUsers | None:
    hashes = {}
    for user, hashed in section.items():
        # Never echo the hash: it is a secret too (it can be attacked offline).
        if not isinstance(hashed, str) or not _BCRYPT_HASH.match(hashed):
            raise ConfigError(
                f"{where}: basic_auth_users.{user}: not a bcrypt hash "
                "(make one with `htpasswd -nBC 10 '' | tr -d ':\\n'`)"
            )
        hashes[str(user)] = _usable_hash(hashed.encode(), f"{where}: basic_auth_users.{user}")
    return BasicAuthUsers(hashes) if hashes else None


def _usable_hash(hashed: bytes, where: str) -> bytes:
    """``hashed`` if bcrypt can check passwords against it, else ConfigError (no echo)."""
    cost = bcrypt_cost(hashed)
    if cost not in _BCRYPT_COSTS:
        raise ConfigError(
            f"{where}: bcrypt cost {cost} is outside {_BCRYPT_COSTS.start}-{_BCRYPT_COSTS.stop - 1}"
        )
    # bcrypt's own parser decides whether the salt is valid; the lowest cost keeps that cheap.
    cheapest = b"%s%02d%s" % (hashed[:4], _BCRYPT_COSTS.start, hashed[6:])
    try:
        bcrypt.checkpw(b"", cheapest)
    except ValueError:
        raise ConfigError(f"{where}: not a valid bcrypt hash (bad salt)") from None
    return hashed


def _headers(section: dict[str, Any], where: str) -> dict[str, str]:
    # http2 is accepted for files shared with Go exporters; aiohttp serves HTTP/1.1 only.
    _reject(section, ("headers", "http2"), "http_server_config", where)
    if not isinstance(section.get("http2", True), bool):
        raise ConfigError(f"{where}: http_server_config.http2 must be true or false")
    headers = _section(section, "headers", where)
    check_keys(headers, _HEADERS, f"{where}: http_server_config.headers")
    out = {}
    for name, value in headers.items():
        if value is None or value == "":
            continue
        allowed = _HEADERS[name]
        if not isinstance(value, str) or (allowed and value.lower() not in allowed):
            accepted = " or ".join(allowed) if allowed else "a string"
            raise ConfigError(f"{where}: http_server_config.headers.{name} must be {accepted}")
        out[name] = value
    return out


def _reason(exc: Exception) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return exc.strerror or str(exc)
