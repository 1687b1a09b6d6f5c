"""One lab at a time: whoever brings the lab up or runs tests on it holds this lock, and a
second comer is told who holds it instead of tearing the lab down under them."""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

from lab.config import LOCK_FILE


class LabBusy(RuntimeError):
    """Another process holds the lab."""


class LabLock:
    """``with LabLock(): ...`` holds the lab for the block; the lock file names the holder."""

    def __init__(self, path: Path = LOCK_FILE):
        self.path = path
        self._fd: int | None = None

    def __enter__(self) -> LabLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace").strip() or "an unknown process"
            os.close(fd)
            raise LabBusy(f"the lab is in use by {holder}: wait for it to finish, or stop it and try again") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"PID {os.getpid()} ({' '.join(sys.argv)[:200]})\n".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None
