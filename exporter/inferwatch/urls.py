"""URLs as the sidecar shows and compares them: credentials never shown, origins compared.

Plain string work (no HTTP client), for every layer to import: the settings' error
messages, the logs, the verdict page and the capture manifest all redact with
:func:`redact_url`.
"""

from __future__ import annotations

from urllib.parse import urljoin


def _split(url: str) -> tuple[str, str, str]:
    """``(scheme://, authority, the rest)``; the authority ends at the first ``/``, ``?`` or
    ``#``, as ``urllib.parse.urlsplit`` and aiohttp read it."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "", "", url
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    return scheme + sep, rest[:end], rest[end:]


def has_path(url: str) -> bool:
    """Whether ``url`` names more than its origin (a path, a query or a fragment)."""
    return bool(_split(url)[2])


def at_past_authority(url: str) -> bool:
    """Whether ``url`` holds an ``@`` past its authority: a ``user:password@`` with an
    unencoded ``/``, ``?`` or ``#`` in it, which a URL parser reads as the path; to be
    refused before any part of it is shown (:func:`redact_url` cannot tell the password)."""
    return "@" in _split(url)[2]


def redact_url(url: str) -> str:
    """The URL without its ``user:password@`` (all of the authority up to its last ``@``, as
    a URL parser reads it: a password may hold an ``@``), for logs and pages."""
    scheme, authority, rest = _split(url)
    return scheme + authority.rpartition("@")[2] + rest


def without_any_userinfo(url: str) -> str:
    """``url`` cut of everything up to its last ``@``, past its authority too: a URL that
    another program names (a router's worker) may hold a password with an unencoded ``/``,
    which :func:`redact_url` would show."""
    scheme, sep, rest = url.partition("://")
    return scheme + sep + rest.rpartition("@")[2] if sep else url.rpartition("@")[2]


def origin_of(url: str) -> str:
    """``scheme://[user:password@]host:port`` of ``url``, without its path."""
    scheme, authority, _ = _split(url)
    return scheme + authority


def redirect_cause(url: str, status: int, location: str | None) -> str:
    """One line for a redirect answer (never followed): where it points, redacted."""
    try:
        target = redact_url(origin_of(urljoin(url, location))) if location else "nowhere"
    except ValueError:  # e.g. an unclosed IPv6 bracket
        target = "an unparsable Location"
    return (
        f"HTTP {status} from {redact_url(url)} redirects to {target[:200]} "
        "(redirects are not followed)"
    )


def runbook_url(base: str, alert: str, sidecar: str | None) -> str | None:
    """``<base><Alert>.md`` where the config sets ``runbook_url_base``; else the page the
    sidecar at ``sidecar`` (a URL ending in ``/``, or ``""`` for a link from its own pages)
    serves, ``<sidecar>runbooks/<Alert>``; None where neither is known."""
    if base:
        return f"{base}{alert}.md"
    return None if sidecar is None else f"{sidecar}runbooks/{alert}"
