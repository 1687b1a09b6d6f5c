"""The model directory as replication sees it: chunk and block sizes, partial files, the JSON
records kept beside it, and the error a user reads."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..atomic import write_atomically

CHUNK = 64 << 20
BLOCK = 4 << 20
PART = ".dsp-part"
HASH_WORKERS = min(16, os.cpu_count() or 2)
LABELS = {"manifest": ("hashing the model", "model hashed"), "send": ("replicating the model", "model replicated")}


class SyncError(Exception):
    """A problem with a message for the user; the program exits 1 with it."""


def gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def model_files(root: Path) -> list[str]:
    """Every regular file under root, relative, sorted; our partial files and hidden caches left out."""
    found = []
    for path in root.rglob("*"):
        relative = path.relative_to(root).as_posix()
        if path.is_file() and not path.name.endswith(PART) and not relative.startswith("."):
            found.append(relative)
    return sorted(found)


def write_json(path: Path, value: dict) -> None:
    write_atomically(path, json.dumps(value, indent=1, sort_keys=True))


def read_json(path: Path) -> dict | None:
    try:
        return parse_json(path.read_text())
    except OSError:
        return None


def parse_json(text: str) -> dict | None:
    try:
        return json.loads(text)
    except ValueError:
        return None


def warn(message: str) -> None:
    print(f"model_sync: {message}", file=sys.stderr, flush=True)

