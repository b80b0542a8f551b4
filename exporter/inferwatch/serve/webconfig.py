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
change). Basic auth protects every path but ``/healthz``, which carries no metric data, so
kubelet and container health checks work without a credential in the pod spec. Passwords are
checked with bcrypt on a small pool of its own (never the threads that render ``/metrics``),
at most :data:`CHECK_SLOTS` at once: a request that finds every slot taken is answered 503 at
once instead of queueing. Each outcome is cached under a SHA-256 digest of (user, password,
hash), passes and failures apart (a flood of wrong passwords cannot push a scraper's pass
out), so a scraper pays the bcrypt cost once, not on every scrape. Neither passwords nor
hashes are ever logged.

:func:`request_checks` guards the app against browsers: state-changing requests from another
origin are refused (CSRF), and with ``--web.allowed-host`` only those Host names are answered
(DNS rebinding).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import re
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import bcrypt
from aiohttp import hdrs, web

from inferwatch.settings import ConfigError, check_keys, load_config_file

UNAUTHENTICATED_PATHS = frozenset({"/healthz"})
# Password checks run at once; more find the slots taken and are answered 503.
CHECK_SLOTS = 2
# Methods that change nothing: the others must come from the exporter's own origin, as JSON.
_SAFE_METHODS = frozenset({"GET", "HEAD"})
# Sec-Fetch-Site values of a request the exporter's own page, or the user, made.
_OWN_FETCH_SITES = frozenset({"same-origin", "none"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]

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
# The costs (log2 of the key-expansion rounds) bcrypt accepts.
_BCRYPT_COSTS = range(4, 32)
# Salt and digest of the hash checked for unknown users; it gets the highest cost among the
# configured users, so that a wrong user name takes as long as a wrong password.
_DUMMY_SALT_AND_DIGEST = b"6uRXoeeaKZ9/NhuiVziOUun374G4ayO8ZiLQKeQDLsQ4pX/6N2vNi"
_CACHE_SIZE = 100
_BCRYPT_MAX_BYTES = 72


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


def bcrypt_cost(hashed: bytes) -> int:
    """The cost of a hash that matched :data:`_BCRYPT_HASH`."""
    return int(hashed[4:6])


class ChecksBusy(Exception):
    """Every password-check slot is taken."""


@dataclass
class BasicAuthUsers:
    """User -> bcrypt hash, checked on a pool of ``slots`` threads of its own, with passes
    and failures cached apart by digest.

    An unknown user is checked against :attr:`dummy_hash`, whose cost is the highest of the
    configured hashes, so that it takes as long as a known user's wrong password.
    """

    hashes: Mapping[str, bytes]
    slots: int = CHECK_SLOTS
    _passed: OrderedDict[bytes, None] = field(default_factory=OrderedDict, repr=False)
    _failed: OrderedDict[bytes, None] = field(default_factory=OrderedDict, repr=False)
    _checking: int = field(default=0, repr=False)

    @cached_property
    def _pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(self.slots, thread_name_prefix="inferwatch-bcrypt")

    @cached_property
    def dummy_hash(self) -> bytes:
        cost = max(bcrypt_cost(h) for h in self.hashes.values())
        return b"$2b$%02d$%s" % (cost, _DUMMY_SALT_AND_DIGEST)

    async def check(self, user: str, password: str) -> bool:
        """Whether ``password`` is ``user``'s; ChecksBusy when it needs bcrypt and every slot
        is taken."""
        login = user.encode()
        hashed = next(
            (h for name, h in self.hashes.items() if hmac.compare_digest(name.encode(), login)),
            None,
        )
        secret = password.encode()
        key = hashlib.sha256(repr((login, secret, hashed)).encode()).digest()
        for cache in (self._passed, self._failed):
            if key in cache:
                cache.move_to_end(key)
                return cache is self._passed
        if self._checking >= self.slots:
            raise ChecksBusy
        # bcrypt reads 72 bytes at most (and the bcrypt package refuses more): no match.
        candidate = secret if len(secret) <= _BCRYPT_MAX_BYTES else b""
        self._checking += 1
        running = asyncio.get_running_loop().run_in_executor(
            self._pool, bcrypt.checkpw, candidate, hashed or self.dummy_hash
        )
        running.add_done_callback(self._free_slot)  # when bcrypt ends, even if we are cancelled
        ok = await asyncio.shield(running)
        ok = ok and hashed is not None and candidate is secret
        cache = self._passed if ok else self._failed
        cache[key] = None
        if len(cache) > _CACHE_SIZE:
            cache.popitem(last=False)
        return ok

    def _free_slot(self, _: asyncio.Future[bool]) -> None:
        self._checking -= 1


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

    def middlewares(self) -> list[Middleware]:
        """aiohttp middlewares enforcing basic auth (none without users)."""
        return [] if self.users is None else [self._basic_auth]

    @web.middleware
    async def _basic_auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        assert self.users is not None
        if request.path not in UNAUTHENTICATED_PATHS:
            credentials = _basic_credentials(request.headers.get(hdrs.AUTHORIZATION, ""))
            try:
                ok = credentials is not None and await self.users.check(*credentials)
            except ChecksBusy:
                return web.Response(
                    status=503,
                    text="too many password checks at once\n",
                    headers={"Retry-After": "1"},
                )
            if not ok:
                return web.Response(
                    status=401, text="Unauthorized\n", headers={"WWW-Authenticate": "Basic"}
                )
        return await handler(request)

    async def add_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        """``on_response_prepare`` hook: the configured headers on every response."""
        response.headers.update(self.headers)


def request_checks(allowed_hosts: Collection[str] = ()) -> list[Middleware]:
    """Middlewares refusing what a browser may be made to send: a request whose Host is not
    one of ``allowed_hosts`` (when given; ``/healthz`` excepted), and a state-changing
    request (not GET or HEAD) from another origin or not a JSON one (a form or a simple
    ``fetch`` cannot send ``Content-Type: application/json`` to another origin unasked: the
    browser asks first, and the app answers no CORS)."""
    allowed = frozenset(allowed_hosts)

    @web.middleware
    async def known_host(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in UNAUTHENTICATED_PATHS and _host_name(request.host) not in allowed:
            return _refuse(403, "this Host is not one of --web.allowed-host")
        return await handler(request)

    @web.middleware
    async def same_origin(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method not in _SAFE_METHODS:
            reason = _cross_origin(request)
            if reason is not None:
                return _refuse(403, f"{request.method} refused: {reason}")
            media = request.headers.get(hdrs.CONTENT_TYPE, "").partition(";")[0]
            if media.strip().lower() != "application/json":
                return _refuse(415, f"{request.method} needs Content-Type: application/json")
        return await handler(request)

    return [known_host, same_origin] if allowed else [same_origin]


def _cross_origin(request: web.Request) -> str | None:
    """Why the request comes from another origin than the one it is sent to; None if not."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in _OWN_FETCH_SITES:
        return "the browser says it comes from another origin (Sec-Fetch-Site)"
    origin = request.headers.get(hdrs.ORIGIN)
    if origin is not None:
        sender = _authority(origin)
        scheme = origin.partition("://")[0]
        if sender is None or sender != _authority(f"{scheme}://{request.host}"):
            return "its Origin is not this Host"
    return None


def _authority(url: str) -> tuple[str, int] | None:
    """(host, port) of ``url``, the scheme's port when none is given; None when it has none
    (an opaque ``null`` Origin) or it is malformed."""
    try:
        parts = urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return None
    return None if parts.hostname is None or port is None else (parts.hostname, port)


def _host_name(host: str) -> str | None:
    """The name in a Host value (lower case, no port or IPv6 brackets)."""
    try:
        return urlsplit(f"//{host}").hostname
    except ValueError:
        return None


def host_names(text: str) -> tuple[str, ...]:
    """``--web.allowed-host``: comma-separated host names or addresses (IPv6 in brackets),
    without ports; each as :func:`_host_name` gives it."""
    names = []
    for name in filter(None, (n.strip() for n in text.split(","))):
        try:
            parts = urlsplit(f"//{name}")
            plain = parts.netloc == name and "@" not in name and parts.port is None
        except ValueError:
            plain = False
        if not plain or not parts.hostname or name.endswith(":"):
            raise ValueError(f"{name!r}: not a host name or address without a port")
        names.append(parts.hostname)
    return tuple(names)


def _refuse(status: int, reason: str) -> web.Response:
    return web.Response(status=status, text=reason + "\n")


def _basic_credentials(header: str) -> tuple[str, str] | None:
    """(user, password) from an ``Authorization: Basic ...`` value; None if it is not one."""
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


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
    # bcrypt's own parser decides whether the salt is valid; at the lowest cost it takes ~1 ms.
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
