"""Where captures are kept: one ``.tar.gz`` per capture, oldest deleted first past a bound.

A capture is assembled in a hidden working folder of the store and packed when complete,
so that the listing (the landing page, ``GET /captures``) only ever shows whole archives.
"""

from __future__ import annotations

import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

SUFFIX = ".tar.gz"
# capture-20261201T084812Z-manual.tar.gz; the trigger part is an alert name or "manual".
_NAME = re.compile(r"capture-\d{8}T\d{6}Z-[A-Za-z0-9]+(-\d+)?\.tar\.gz")
_WORKING = ".incomplete-"


@dataclass(frozen=True)
class Archive:
    name: str
    bytes: int
    mtime: float


class CaptureStore:
    """The capture folder, at most ``max_bytes`` of archives (the newest always kept)."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes

    def open(self) -> None:
        """Create the folder and drop what an interrupted capture left; OSError if unusable."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for leftover in self.directory.glob(f"{_WORKING}*"):
            shutil.rmtree(leftover, ignore_errors=True)

    def workdir(self) -> Path:
        return Path(tempfile.mkdtemp(prefix=_WORKING, dir=self.directory))

    def archives(self) -> list[Archive]:
        """Complete captures, newest first."""
        out = []
        for path in self.directory.glob(f"capture-*{SUFFIX}"):
            if _NAME.fullmatch(path.name):
                try:
                    stat = path.stat()
                except OSError:  # deleted meanwhile
                    continue
                out.append(Archive(path.name, stat.st_size, stat.st_mtime))
        return sorted(out, key=lambda a: (a.mtime, a.name), reverse=True)

    def used_bytes(self) -> int:
        return sum(a.bytes for a in self.archives())

    def path(self, name: str) -> Path | None:
        """The archive called ``name``; None for any other name (no path tricks)."""
        if not _NAME.fullmatch(name):
            return None
        path = self.directory / name
        return path if path.is_file() else None

    def pack(self, workdir: Path, stem: str) -> Archive:
        """Pack ``workdir`` as ``<stem>.tar.gz`` (its files under ``<stem>/``), remove it and
        delete the oldest archives until the store fits its bound again."""
        name = self._free_name(stem)
        partial = workdir.with_name(f"{workdir.name}{SUFFIX}")
        try:
            with tarfile.open(partial, "w:gz", compresslevel=6) as tar:
                tar.add(workdir, arcname=name.removesuffix(SUFFIX))
            partial.rename(self.directory / name)
        finally:
            partial.unlink(missing_ok=True)
            shutil.rmtree(workdir, ignore_errors=True)
        self.prune(keep=name)
        stat = (self.directory / name).stat()
        return Archive(name, stat.st_size, stat.st_mtime)

    def prune(self, keep: str | None = None) -> list[str]:
        """Delete the oldest archives (never ``keep``) while the store is over its bound."""
        archives = self.archives()
        used = sum(a.bytes for a in archives)
        deleted = []
        for archive in reversed(archives):  # oldest first
            if used <= self.max_bytes:
                break
            if archive.name == keep:
                continue
            (self.directory / archive.name).unlink(missing_ok=True)
            used -= archive.bytes
            deleted.append(archive.name)
        return deleted

    def _free_name(self, stem: str) -> str:
        name, n = f"{stem}{SUFFIX}", 1
        while (self.directory / name).exists():
            n += 1
            name = f"{stem}-{n}{SUFFIX}"
        return name
