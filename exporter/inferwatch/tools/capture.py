"""``inferwatch capture --exporter URL``: ask a running exporter for an evidence capture, wait
for it and download the archive, as ``<out>/<id>.tar.gz``: a new file, written only once
downloaded whole. No call follows a redirect.

Exit status: 0 the capture is complete; 1 it is partial or failed, or the exporter refused
(one runs already, or the last was too recent); 5 the exporter cannot be reached, has
captures off or answers what no exporter would, or the file exists already.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import aiohttp

from inferwatch.capture.store import CAPTURE_ID, SUFFIX, capture_of
from inferwatch.logs import printable
from inferwatch.tools.credentials import Credentials
from inferwatch.urls import redact_url

EXIT_INCOMPLETE = 1
EXIT_UNREACHABLE = 5


class CaptureError(Exception):
    """The exporter cannot be asked; ``str()`` is one line."""


async def capture(
    exporter: str,
    *,
    seconds: float | None,
    out: Path,
    wait: float,
    timeout: float,
    max_bytes: int,
    credentials: Credentials | None = None,
) -> int:
    """``credentials``: basic auth (sent with every call) and TLS verification;
    ``max_bytes``: the largest archive downloaded."""
    base = exporter.rstrip("/")
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    access = credentials or Credentials()
    async with aiohttp.ClientSession(
        timeout=client_timeout, headers=access.headers, connector=access.connector()
    ) as session:
        params = {"seconds": f"{seconds:g}"} if seconds else {}
        status, doc = await _call(session, "POST", f"{base}/capture", params)
        if status == 404:
            raise CaptureError(f"{redact_url(base)}: {doc.get('error', 'no /capture here')}")
        if status != 202:
            _say(f"inferwatch: capture refused: {doc.get('message', status)}")
            return EXIT_INCOMPLETE
        name = _capture_id(doc.get("name"))
        _say(f"capturing at {redact_url(base)}: {doc['message']}")
        deadline = time.monotonic() + wait
        while True:
            _, listing = await _call(session, "GET", f"{base}/captures", {})
            last = listing.get("last") or {}
            if last.get("name") == name:
                break
            if time.monotonic() > deadline:
                _say(f"inferwatch: {name} not complete after {wait:g} s")
                return EXIT_INCOMPLETE
            await asyncio.sleep(1.0)
        if "archive" not in last:
            _say(f"inferwatch: capture {name} failed: {last.get('error', '')}")
            return EXIT_INCOMPLETE
        archive = _archive_of(name, last["archive"])
        path = out / f"{name}{SUFFIX}"  # named here, never by the exporter
        await _download(session, f"{base}/captures/{archive}", path, max_bytes)
    _say(str(path), sys.stdout)
    for part in last["parts"]:
        detail = f": {part['detail']}" if part["detail"] else ""
        _say(f"  {part['name']}: {part['result']}{detail}", sys.stdout)
    return 0 if last["result"] == "ok" else EXIT_INCOMPLETE


def _say(text: str, stream: TextIO | None = None) -> None:
    """A line holding the exporter's words (stderr unless ``stream``), its control
    characters escaped for the terminal."""
    print(printable(text), file=stream or sys.stderr)


def _capture_id(name: object) -> str:
    """``name`` if it is a capture's id as the exporter makes them, else CaptureError: the
    archive is saved under it."""
    if isinstance(name, str) and CAPTURE_ID.fullmatch(name):
        return name
    shown = repr(name[:80] if isinstance(name, str) else name)
    raise CaptureError(f"the exporter named its capture {shown}: not capture-<time>-<trigger>")


def _archive_of(name: str, archive: object) -> str:
    """``archive`` if it is the name of capture ``name``'s archive, else CaptureError."""
    if isinstance(archive, str) and capture_of(archive) == name:
        return archive
    shown = repr(archive[:80] if isinstance(archive, str) else archive)
    raise CaptureError(f"the exporter named the archive of {name} {shown}: not {name}{SUFFIX}")


async def _download(session: aiohttp.ClientSession, url: str, path: Path, max_bytes: int) -> None:
    """Save the body at ``url`` as ``path`` (a new file, 0600), once whole and within
    ``max_bytes``; a failed download leaves nothing behind."""
    fd, partial_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    partial = Path(partial_name)
    try:
        with os.fdopen(fd, "wb") as file, _failures(url):
            async with session.get(url, allow_redirects=False) as resp:
                if resp.status != 200:
                    raise CaptureError(f"download of {path.name}: HTTP {resp.status}")
                if resp.content_length is not None and resp.content_length > max_bytes:
                    raise _too_large(path.name, max_bytes)
                size = 0
                async for chunk in resp.content.iter_chunked(1024 * 1024):
                    size += len(chunk)
                    if size > max_bytes:
                        raise _too_large(path.name, max_bytes)
                    file.write(chunk)
        try:
            os.link(partial, path)  # unlike a rename, never replaces a file
        except FileExistsError:
            raise CaptureError(f"{path} exists already; it is not replaced") from None
    finally:
        partial.unlink(missing_ok=True)


def _too_large(name: str, max_bytes: int) -> CaptureError:
    return CaptureError(f"download of {name}: larger than {max_bytes} bytes (--max-bytes)")


async def _call(
    session: aiohttp.ClientSession, method: str, url: str, params: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    body = {} if method == "POST" else None  # JSON: the exporter refuses a form's POST
    with _failures(url):
        request = session.request(method, url, params=params, json=body, allow_redirects=False)
        async with request as resp:
            if resp.status == 401:
                raise CaptureError(f"{redact_url(url)}: 401 (give --user and --password-file)")
            try:
                doc = await resp.json(content_type=None)
            except ValueError:
                raise CaptureError(
                    f"{redact_url(url)}: HTTP {resp.status}, not an inferwatch answer"
                ) from None
            return resp.status, doc if isinstance(doc, dict) else {}


@contextlib.contextmanager
def _failures(url: str) -> Iterator[None]:
    """A failed request to ``url`` as a CaptureError with a one-line cause."""
    try:
        yield
    except asyncio.TimeoutError:
        raise CaptureError(f"no answer from {redact_url(url)}") from None
    except aiohttp.ClientError as exc:
        raise CaptureError(f"{redact_url(url)}: {type(exc).__name__}: {exc}") from None
