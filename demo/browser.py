"""Headless Chromium, for the tests that look at pages as a browser renders them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from demo.processes import StackError


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    """Headless Chromium (Debian's ``chromium``, installed by ``make debs``) with ``args``:
    ``--dump-dom URL`` prints the page as rendered, ``--screenshot=FILE URL`` saves it."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise StackError("no chromium on PATH (make debs installs it)")
    return subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,  # a guard against a hung browser
    )
