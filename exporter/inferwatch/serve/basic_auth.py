"""Basic auth of ``--web.config.file``'s ``basic_auth_users``: bcrypt on a bounded pool.

Every path but ``/healthz`` is protected. Passwords are checked with bcrypt on a pool of its
own, at most :data:`CHECK_SLOTS` at once (a request that finds none free is answered 503),
and each outcome is cached under a digest of (user, password, hash), passes apart from
failures, so a scraper pays bcrypt once. Neither passwords nor hashes are ever logged.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property

import bcrypt
from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

UNAUTHENTICATED_PATHS = frozenset({"/healthz"})
# Password checks run at once; more find the slots taken and are answered 503.
CHECK_SLOTS = 2
# Salt and digest of the hash checked for unknown users; it gets the highest cost among the
# configured users, so that a wrong user name takes as long as a wrong password.
_DUMMY_SALT_AND_DIGEST = b"6uRXoeeaKZ9/NhuiVziOUun374G4ayO8ZiLQKeQDLsQ4pX/6N2vNi"
_CACHE_SIZE = 100
_BCRYPT_MAX_BYTES = 72


def bcrypt_cost(hashed: bytes) -> int:
    """The cost of a well-formed bcrypt hash: 10 for ``$2b$10$...``."""
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

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """aiohttp middleware: 401 without a user's password (``/healthz`` excepted), 503
        when the check would need a slot and none is free."""
        if request.path not in UNAUTHENTICATED_PATHS:
            credentials = _basic_credentials(request.headers.get(hdrs.AUTHORIZATION, ""))
            try:
                ok = credentials is not None and await self.check(*credentials)
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
