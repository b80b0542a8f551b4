"""Request checks that guard the app against browsers (CSRF, DNS rebinding).

A page on another site can make a browser send requests to the exporter: state-changing
requests from another origin are refused (CSRF), and only the exporter's own Host names are
answered (DNS rebinding: another name that resolves to the exporter): those of
``--web.allowed-host``, or without it the listen address's own (:func:`own_host`). A refusal
is a short text answer::

    HTTP/1.1 403 Forbidden

    POST refused: its Origin is not this Host
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Collection
from urllib.parse import urlsplit

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

from inferwatch.serve.basic_auth import UNAUTHENTICATED_PATHS
from inferwatch.serve.otlp import PATH as OTLP_PATH

# Methods that change nothing: the others must come from the exporter's own origin, as JSON.
_SAFE_METHODS = frozenset({"GET", "HEAD"})
# Sec-Fetch-Site values of a request the exporter's own page, or the user, made.
_OWN_FETCH_SITES = frozenset({"same-origin", "none"})


def request_checks(allowed_hosts: Collection[str] = (), listen_host: str = "") -> list[Middleware]:
    """Middlewares refusing what a browser may be made to send: a request whose Host is not
    one of ``allowed_hosts`` (``/healthz`` excepted), or without them not one of the listen
    address's own (:func:`own_host`; ``listen_host`` as ``--web.listen-address`` names it),
    and a state-changing request (not GET or HEAD) from another origin or not a JSON one (a
    form or a simple ``fetch`` cannot send ``Content-Type: application/json`` to another
    origin unasked: the browser asks first, and the app answers no CORS); ``POST /v1/traces``
    may be protobuf instead, which a browser cannot send unasked either."""
    allowed = frozenset(allowed_hosts)
    own = own_names(listen_host)

    @web.middleware
    async def known_host(request: web.Request, handler: Handler) -> web.StreamResponse:
        if allowed:
            if (
                request.path not in UNAUTHENTICATED_PATHS
                and _host_name(request.host) not in allowed
            ):
                return _refuse(403, "this Host is not one of --web.allowed-host")
        elif not own_host(request, own):
            return _refuse(
                403, "this Host is not the listen address's own (see --web.allowed-host)"
            )
        return await handler(request)

    @web.middleware
    async def same_origin(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method not in _SAFE_METHODS:
            reason = _cross_origin(request)
            if reason is not None:
                return _refuse(403, f"{request.method} refused: {reason}")
            media = request.headers.get(hdrs.CONTENT_TYPE, "").partition(";")[0]
            # The OTLP receiver checks its own types, JSON or protobuf: neither is one a
            # browser sends to another origin without asking first.
            if request.path != OTLP_PATH and media.strip().lower() != "application/json":
                return _refuse(415, f"{request.method} needs Content-Type: application/json")
        return await handler(request)

    return [known_host, same_origin]


def own_names(listen_host: str) -> frozenset[str]:
    """The names the listen address answers to besides addresses: ``localhost``, and the
    name it was given or on every interface (no host, ``0.0.0.0`` or ``::``) this machine's
    host name."""
    try:
        everywhere = not listen_host or ipaddress.ip_address(listen_host).is_unspecified
    except ValueError:  # a name
        everywhere = False
    return frozenset({"localhost", (socket.gethostname() if everywhere else listen_host).lower()})


def own_host(request: web.Request, names: Collection[str]) -> bool:
    """Whether the request's Host is one of ``names`` or an address (a scrape by pod IP, a
    port published by Docker). DNS rebinding needs a name that resolves to the exporter: an
    address cannot be rebound, and the names here are not the attacker's to resolve."""
    name = _host_name(request.host)
    if name is None:
        return False
    if name in names:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


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
