"""One lab at a time: whoever brings the lab up or runs tests on it holds this lock, and a
second comer is told who holds it instead of tearing the lab down under them. Within one
process the lock nests (a test session that holds the pair's lab may bring up a larger lab in
its place)."""

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

    _held: dict[Path, list[int]] = {}  # path -> [fd, depth] of the lock this process holds

    def __init__(self, path: Path = LOCK_FILE):
        self.path = path

    def __enter__(self) -> LabLock:
        if self.path in LabLock._held:
            LabLock._held[self.path][1] += 1
            return self
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
        LabLock._held[self.path] = [fd, 1]
        return self

    def __exit__(self, *exc) -> None:
        held = LabLock._held.get(self.path)
        if held is None:
            return
        held[1] -= 1
        if held[1] == 0:
            del LabLock._held[self.path]
            os.ftruncate(held[0], 0)
            os.close(held[0])
