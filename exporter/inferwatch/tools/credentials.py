"""How the tools reach a protected exporter or Prometheus: its web config's basic auth, a CA
for its TLS.

``inferwatch capture`` and ``inferwatch diagnose`` (``--exporter`` or ``--prometheus``) take
the same flags (:func:`add_flags`): ``--user`` with ``--password-file`` (basic auth, as the
``--web.config.file`` of the exporter or Prometheus asks), and ``--ca-file`` for a server
whose certificate the system's trust store does not know.
"""

from __future__ import annotations

import argparse
import ssl
from dataclasses import dataclass, field

import aiohttp

from inferwatch.settings import ConfigError, existing_file, flag_type, read_secret


@dataclass(frozen=True)
class Credentials:
    """An Authorization header value (never shown) and the TLS context to verify with."""

    authorization: str | None = field(default=None, repr=False)
    ssl: ssl.SSLContext | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": self.authorization} if self.authorization else {}

    def connector(self) -> aiohttp.TCPConnector:
        """A connector that verifies the exporter's certificate with ``ssl`` when given."""
        return aiohttp.TCPConnector(ssl=self.ssl if self.ssl is not None else True)


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--user", help="basic auth user (the web config of the exporter or Prometheus)"
    )
    parser.add_argument(
        "--password-file", type=flag_type(existing_file), help="file with the basic auth password"
    )
    parser.add_argument(
        "--ca-file",
        type=flag_type(existing_file),
        help="CA certificate(s) (PEM) to verify an https exporter or Prometheus with",
    )


def from_args(args: argparse.Namespace) -> Credentials:
    """The credentials the flags give; ConfigError for half of them or an unreadable CA."""
    if (args.user is None) != (args.password_file is None):
        raise ConfigError("give --user and --password-file together")
    authorization = None
    if args.user is not None:
        authorization = aiohttp.encode_basic_auth(args.user, read_secret(args.password_file))
    context = None
    if args.ca_file is not None:
        try:
            context = ssl.create_default_context(cafile=str(args.ca_file))
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"--ca-file {args.ca_file}: cannot load: {exc}") from None
    return Credentials(authorization, context)
