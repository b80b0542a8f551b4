"""Request checks that guard the app against browsers (CSRF, DNS rebinding).

A page on another site can make a browser send requests to the exporter: state-changing
requests from another origin are refused (CSRF), and with ``--web.allowed-host`` only those
Host names are answered (DNS rebinding: another name that resolves to the exporter). A
refusal is a short text answer::

    HTTP/1.1 403 Forbidden

    POST refused: its Origin is not this Host
"""

from __future__ import annotations

from collections.abc import Collection
from urllib.parse import urlsplit

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

from inferwatch.serve.basic_auth import UNAUTHENTICATED_PATHS

# Methods that change nothing: the others must come from the exporter's own origin, as JSON.
_SAFE_METHODS = frozenset({"GET", "HEAD"})
# Sec-Fetch-Site values of a request the exporter's own page, or the user, made.
_OWN_FETCH_SITES = frozenset({"same-origin", "none"})


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
