"""``inferwatch capture --exporter URL``: ask a running exporter for an evidence capture, wait
for it and download the archive.

Exit status: 0 the capture is complete; 1 it is partial or failed, or the exporter refused
(one runs already, or the last was too recent: the message says when the next may start);
5 the exporter cannot be reached or has captures off.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from inferwatch.collect.upstream import redact_url

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
    authorization: str | None = None,
) -> int:
    """``authorization``: an Authorization header value (basic auth), sent with every call."""
    base = exporter.rstrip("/")
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    headers = {"Authorization": authorization} if authorization else {}
    async with aiohttp.ClientSession(timeout=client_timeout, headers=headers) as session:
        params = {"seconds": f"{seconds:g}"} if seconds else {}
        status, doc = await _call(session, "POST", f"{base}/capture", params)
        if status == 404:
            raise CaptureError(f"{redact_url(base)}: {doc.get('error', 'no /capture here')}")
        if status != 202:
            print(f"inferwatch: capture refused: {doc.get('message', status)}", file=sys.stderr)
            return EXIT_INCOMPLETE
        name = doc["name"]
        print(f"capturing at {redact_url(base)}: {doc['message']}", file=sys.stderr)
        deadline = time.monotonic() + wait
        while True:
            _, listing = await _call(session, "GET", f"{base}/captures", {})
            last = listing.get("last") or {}
            if last.get("name") == name:
                break
            if time.monotonic() > deadline:
                print(f"inferwatch: {name} not complete after {wait:g} s", file=sys.stderr)
                return EXIT_INCOMPLETE
            await asyncio.sleep(1.0)
        if "archive" not in last:
            print(f"inferwatch: capture {name} failed: {last.get('error', '')}", file=sys.stderr)
            return EXIT_INCOMPLETE
        path = out / last["archive"]
        async with session.get(f"{base}/captures/{last['archive']}") as resp:
            if resp.status != 200:
                raise CaptureError(f"download of {last['archive']}: HTTP {resp.status}")
            path.write_bytes(await resp.read())
    print(path)
    for part in last["parts"]:
        detail = f": {part['detail']}" if part["detail"] else ""
        print(f"  {part['name']}: {part['result']}{detail}")
    return 0 if last["result"] == "ok" else EXIT_INCOMPLETE


async def _call(
    session: aiohttp.ClientSession, method: str, url: str, params: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    try:
        async with session.request(method, url, params=params) as resp:
            if resp.status == 401:
                raise CaptureError(f"{redact_url(url)}: 401 (give --user and --password-file)")
            try:
                doc = await resp.json(content_type=None)
            except ValueError:
                raise CaptureError(
                    f"{redact_url(url)}: HTTP {resp.status}, not an inferwatch answer"
                ) from None
            return resp.status, doc if isinstance(doc, dict) else {}
    except asyncio.TimeoutError:
        raise CaptureError(f"no answer from {redact_url(url)}") from None
    except aiohttp.ClientError as exc:
        raise CaptureError(f"{redact_url(url)}: {type(exc).__name__}: {exc}") from None
