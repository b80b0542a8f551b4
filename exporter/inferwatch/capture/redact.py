"""Secrets out of a capture: every file of an archive is masked before it is written.

py-spy prints the server's command line (``--api-key sk-...``) in its dump and its samples;
a page, a trace or an error may hold a token too. Masked: the values of flags, variables,
keys and headers named like a secret, bearer tokens and URL passwords. A mask keeps the
value's length (``--api-key ********``), so a file keeps its layout (offsets in a binary one
stay true); a gzip file is masked inside and compressed again. What was masked is counted by
what named it (``--api-key``, ``HF_TOKEN``, ``Authorization``), for the manifest.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections import Counter
from typing import BinaryIO

RULES = (
    "values of flags, variables, keys and headers whose name ends like a secret (token, "
    "secret, password, passwd, credentials, authorization, cookie, api/access/secret/private/"
    "session key), bearer tokens and URL passwords, masked with '*' at their length"
)
URL_PASSWORD = "URL password"
BEARER = "Bearer"

# A name in a normal form (lower case, words joined by "-") that names a secret; a name
# that ends otherwise (token_type, password_file, --tokenizer) does not.
_SECRET_NAME = re.compile(
    r"(?:^|-)(?:token|secret|password|passwd|credentials?|authorization|cookie"
    r"|(?:api|access|secret|private|session)-?key)$"
)
# How a secret's name ends, loosely: the rules match only such names, and secret_name
# decides. A line where no such ending is followed by what a rule needs next (``=``, ``:``,
# a space) is not searched at all.
_ENDINGS = (
    b"token", b"secret", b"passwd", b"password", b"credential", b"credentials",
    b"authorization", b"cookie", b"key",
)  # fmt: skip
_ENDING = rb"(?i:" + b"|".join(_ENDINGS) + rb")"
_NEXT = (b"=", b":", b" ", b"\t")  # after a name (and its closing quote), before a value
_STOP = rb"\s\x00\"'\\"  # where a bare value ends: a space, a NUL, a quote, a backslash
_QUOTED = rb"(?P<q>[\"'])[^\n\x00\"'\\]*(?P=q)"  # its quotes are not masked


def _value(stop: bytes) -> bytes:
    """A value: quoted, or bare up to one of ``stop``."""
    return rb"(?P<value>" + _QUOTED + rb"|[^" + stop + rb"]+)"


# Each rule finds a ``value`` to mask; one with a ``name`` masks it only for a secret's name.
_RULES = (
    # --api-key sk-..., --hf-token=hf_...
    re.compile(
        rb"(?<![\w-])(?P<name>--?[\w.-]*?" + _ENDING + rb")(?:=|[ \t]+)(?!-)" + _value(_STOP)
    ),
    # HF_TOKEN=hf_... (an environment, a shell line, a query string)
    re.compile(rb"(?<![\w.-])(?P<name>[\w.]*?" + _ENDING + rb")=" + _value(b"&" + _STOP)),
    # "api_key": "sk-...", 'token': '...' (JSON, a Python dict): strings only, so that JSON
    # stays JSON
    re.compile(
        rb"(?P<kq>[\"'])(?P<name>[\w.-]*?"
        + _ENDING
        + rb")(?P=kq)[ \t]*:[ \t]*(?P<value>"
        + _QUOTED
        + rb")"
    ),
    # Authorization: Bearer ..., X-Api-Key: ... (a header, a YAML line): to the line's end
    re.compile(
        rb"(?<![\w-])(?P<name>[\w-]*?" + _ENDING + rb")[ \t]*:[ \t]*"
        rb"(?P<value>[^" + _STOP + rb"][^\r\n\x00\"'\\]*)"
    ),
    re.compile(rb"\bBearer[ \t]+(?P<value>[A-Za-z0-9._~+/=-]+)"),
    re.compile(rb"://[^/\s:@\"'\\]*:(?P<value>[^/@" + _STOP + rb"]+)@"),
)
_LABELS = (None, None, None, None, BEARER, URL_PASSWORD)
_GZIP = b"\x1f\x8b"
_LINE = 16 << 20  # a longer line is masked in pieces
_BLOCK = 1 << 20  # lines are masked this many bytes at a time


def secret_name(name: str) -> bool:
    """Whether ``name`` (a flag, a variable, a key or a header) names a secret."""
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", name).lower()
    return _SECRET_NAME.search(re.sub(r"[-_.]+", "-", words).strip("-")) is not None


def mask(data: bytes, hits: Counter[str]) -> bytes:
    """``data`` with every secret value masked; what named each counted in ``hits``."""
    kept, done = [], 0
    for start, end in _candidate_lines(data.lower()):
        line = data[start:end]
        for rule, label in zip(_RULES, _LABELS, strict=True):
            line = _mask_rule(rule, label, line, hits)
        kept += [data[done:start], line]
        done = end
    return b"".join([*kept, data[done:]]) if kept else data


def _candidate_lines(lowered: bytes) -> list[tuple[int, int]]:
    """(start, end) of the lines where a rule may match: a name's ending (or ``bearer``)
    followed by what a rule needs next, or a URL; found with plain searches, fast."""
    starts = set()
    for word in (*_ENDINGS, b"bearer", b"://"):
        at = lowered.find(word)
        while at >= 0:
            after = at + len(word)
            after += lowered[after : after + 1] in (b'"', b"'")
            if word == b"://" or lowered[after : after + 1] in _NEXT:
                starts.add(lowered.rfind(b"\n", 0, at) + 1)
            at = lowered.find(word, at + 1)
    spans = []
    for start in sorted(starts):
        end = lowered.find(b"\n", start)
        spans.append((start, len(lowered) if end < 0 else end + 1))
    return spans


def _mask_rule(
    rule: re.Pattern[bytes], label: str | None, data: bytes, hits: Counter[str]
) -> bytes:
    kept, done, at = [], 0, 0  # pieces of the result; data[:done] is in them; search from
    while match := rule.search(data, at):
        start, end = match.span("value")
        if data[start : start + 1] in (b'"', b"'"):  # a quoted value: mask within the quotes
            start, end = start + 1, end - 1
        name = label or match.group("name").decode("ascii")
        if (label is None and not secret_name(name)) or not data[start:end].strip(b"* \t"):
            at = start  # not a secret (or masked already); its value may name one itself
            continue
        hits[name] += 1
        kept += [data[done:start], b"*" * (end - start)]
        done = at = end
    return b"".join([*kept, data[done:]])


class TooBig(Exception):
    """A masked copy would pass its bound."""


def is_gzip(source: BinaryIO) -> bool:
    """Whether ``source`` (seekable, at its start) is a gzip stream."""
    head = source.read(len(_GZIP))
    source.seek(0)
    return head == _GZIP


def copy(source: BinaryIO, target: BinaryIO, limit: int, hits: Counter[str]) -> None:
    """``source`` masked into ``target`` (a gzip stream masked inside and compressed again),
    a block of lines at a time; TooBig once ``target`` passes ``limit`` bytes, ValueError for a gzip
    stream that cannot be read."""
    try:
        if is_gzip(source):
            with (
                gzip.GzipFile(fileobj=source) as reader,
                gzip.GzipFile(fileobj=target, mode="wb", compresslevel=6, mtime=0) as writer,
            ):
                _copy_lines(reader, writer, target, limit, hits)
        else:
            _copy_lines(source, target, target, limit, hits)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ValueError(f"not a readable gzip stream: {exc}") from None
    if target.tell() > limit:  # with the gzip trailer
        raise TooBig


def _copy_lines(
    reader: BinaryIO, writer: BinaryIO, target: BinaryIO, limit: int, hits: Counter[str]
) -> None:
    while block := _lines(reader):
        writer.write(mask(block, hits))
        if target.tell() > limit:
            raise TooBig


def _lines(reader: BinaryIO) -> bytes:
    """The next whole lines, about a block of them (no rule spans a line's end); a line
    longer than ``_LINE`` comes in pieces."""
    lines, size = [], 0
    while size < _BLOCK and (line := reader.readline(_LINE)):
        lines.append(line)
        size += len(line)
    return b"".join(lines)
