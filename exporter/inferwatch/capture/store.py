"""Where captures are kept: one ``.tar.gz`` per capture, within a disk bound.

A capture is assembled in a hidden working folder of the store and packed when complete,
so that the listing (the landing page, ``GET /captures``) only ever shows whole archives.
The bound counts what is in flight: a file joins a capture only while the archives kept,
the capture's files and the archive they will be packed into (both on disk while it is
packed) fit it, the oldest archives deleted first to make room. Only regular files this
sidecar wrote are listed, served and deleted: a link or a file planted in the folder is
none of them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tarfile
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

SUFFIX = ".tar.gz"
# A capture's id, capture-20261201T084812Z-manual: the trigger part is an alert name or
# "manual". Its archive is <id>.tar.gz, or <id>-2.tar.gz... where that name is taken.
CAPTURE_ID = re.compile(r"capture-\d{8}T\d{6}Z-[A-Za-z0-9]+")
_NAME = re.compile(rf"(?P<id>{CAPTURE_ID.pattern})(-\d+)?{re.escape(SUFFIX)}")
_WORKING = ".incomplete-"
# A new volume's own folder: a capture folder may be a volume's root.
_VOLUME_ROOT = "lost+found"
# Folders of the system and its kernel: never a capture folder, nor one inside them.
_SYSTEM = tuple(
    Path(p)
    for p in ("/proc", "/sys", "/dev", "/etc", "/boot", "/bin", "/sbin", "/lib", "/lib64", "/usr")
)


class OverBound(Exception):
    """A capture that cannot fit the store's bound, even with every older archive deleted."""


@dataclass(frozen=True)
class Archive:
    name: str
    bytes: int
    mtime: float


def capture_of(archive: str) -> str | None:
    """The id of the capture a store packs as ``archive``; None for a name it never gives."""
    match = _NAME.fullmatch(archive)
    return match["id"] if match else None


def packed_bound(raw: int, members: int) -> int:
    """The most a ``.tar.gz`` of ``members`` files and folders holding ``raw`` bytes takes:
    tar's headers (long names included) and padding, deflate's worst case (data that does
    not compress) and gzip's frame."""
    tar = raw + members * 2048 + 11 * 1024
    return tar + tar // 2048 + 1024


def _written_here(st: os.stat_result) -> bool:
    """A regular file of this sidecar's user with no other name (not a link, not planted)."""
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1


class CaptureStore:
    """The capture folder, at most ``max_bytes`` of archives and captures in flight."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes

    def open(self) -> None:
        """Create the folder, or take one that holds only what a store makes, and drop what
        an interrupted capture left; ValueError for a folder it must not use, OSError for
        one it cannot."""
        real = self.directory.resolve()
        if real == Path(real.anchor) or any(real.is_relative_to(p) for p in _SYSTEM):
            raise ValueError(f"{real} is a system folder; give a folder of its own")
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        foreign = sorted(
            p.name
            for p in self.directory.iterdir()
            if not (_NAME.fullmatch(p.name) or p.name.startswith(_WORKING))
            and p.name != _VOLUME_ROOT
        )
        if foreign:
            shown = ", ".join(foreign[:3]) + (
                f" and {len(foreign) - 3} more" if foreign[3:] else ""
            )
            raise ValueError(
                f"not empty and not a capture folder (it holds {shown}); give an empty or a "
                "new folder"
            )
        for leftover in self.directory.glob(f"{_WORKING}*"):
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)

    def workdir(self) -> Workdir:
        return Workdir(self, Path(tempfile.mkdtemp(prefix=_WORKING, dir=self.directory)))

    def archives(self) -> list[Archive]:
        """Complete captures, newest first."""
        out = []
        for path in self.directory.glob(f"capture-*{SUFFIX}"):
            if _NAME.fullmatch(path.name):
                try:
                    st = path.lstat()
                except OSError:  # deleted meanwhile
                    continue
                if _written_here(st):
                    out.append(Archive(path.name, st.st_size, st.st_mtime))
        return sorted(out, key=lambda a: (a.mtime, a.name), reverse=True)

    def open_archive(self, name: str) -> BinaryIO | None:
        """The archive called ``name``, open for reading; None for any other name (no path
        tricks) or a file this sidecar did not write (a link is not followed)."""
        if not _NAME.fullmatch(name):
            return None
        try:
            fd = os.open(self.directory / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        if not _written_here(os.fstat(fd)):
            os.close(fd)
            return None
        return os.fdopen(fd, "rb")

    def make_room(self, raw: int, members: int) -> bool:
        """Whether a capture of ``raw`` bytes in ``members`` files and folders, and its
        archive, fit the bound beside the archives kept; the oldest are deleted as needed.
        False, and nothing deleted, when it cannot fit even alone."""
        need = raw + packed_bound(raw, members)
        if need > self.max_bytes:
            return False
        archives = self.archives()
        used = sum(a.bytes for a in archives)
        for archive in reversed(archives):  # oldest first
            if used + need <= self.max_bytes:
                break
            (self.directory / archive.name).unlink(missing_ok=True)
            used -= archive.bytes
        return True

    def pack(self, work: Workdir, stem: str) -> Archive:
        """Pack ``work`` as ``<stem>.tar.gz`` (its files under ``<stem>/``) and remove it;
        OverBound (and nothing packed) when it does not fit."""
        try:
            raw, members = work.size()
            if not self.make_room(raw, members):
                raise OverBound(
                    f"this capture ({raw} bytes) and its archive do not fit "
                    f"--capture-max-bytes {self.max_bytes}"
                )
            name = self._free_name(stem)
            partial = work.path.with_name(f"{work.path.name}{SUFFIX}")
            try:
                # For this user only: a capture holds the server's command lines and stacks.
                fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with (
                    os.fdopen(fd, "wb") as file,
                    tarfile.open(fileobj=file, mode="w:gz", compresslevel=6) as tar,
                ):
                    tar.add(work.path, arcname=name.removesuffix(SUFFIX))
                partial.rename(self.directory / name)
            finally:
                partial.unlink(missing_ok=True)
        finally:
            work.remove()
        st = (self.directory / name).stat()
        return Archive(name, st.st_size, st.st_mtime)

    def _free_name(self, stem: str) -> str:
        name, n = f"{stem}{SUFFIX}", 1
        while os.path.lexists(self.directory / name):
            n += 1
            name = f"{stem}-{n}{SUFFIX}"
        return name


@dataclass
class Workdir:
    """A capture being assembled in the store: a file joins it only in :meth:`room`."""

    store: CaptureStore
    path: Path
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def size(self) -> tuple[int, int]:
        """(bytes of its files, files and folders it holds, itself included)."""
        raw, members = 0, 1
        for folder, dirs, files in os.walk(self.path):
            members += len(dirs) + len(files)
            for name in files:
                with contextlib.suppress(OSError):
                    raw += os.lstat(os.path.join(folder, name)).st_size
        return raw, members

    @contextlib.contextmanager
    def room(self, more: int) -> Iterator[bool]:
        """Whether one more file of ``more`` bytes fits (oldest archives deleted to make
        room); the file is to be written within the block, which no other file enters."""
        with self._lock:
            raw, members = self.size()
            yield self.store.make_room(raw + more, members + 1)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
