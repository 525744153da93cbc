"""Start the lab on a free loopback port and find Debian's Chromium, for tests and scripts."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
from collections.abc import Iterator

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_lab(timeout_s: float = 60.0) -> Iterator[str]:
    """`servelab lab` in a subprocess, as a user starts it; yields its URL."""
    from tests.services import server_process

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with server_process([sys.executable, "-m", "servelab", "lab", "--port", str(port)],
                        url + "/api/meta", timeout_s):
        yield url
