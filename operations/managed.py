"""Files and directories this project manages on the nodes: every path read in one round trip,
only what differs uploaded (with its diff) or changed."""

from __future__ import annotations

from pathlib import Path

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.api.util import get_file_sha256
from pyinfra.operations import files

from facts.host_prep import FileDigests, FileInfo


def file_differs(src: str, mode: str, info: FileInfo | None) -> bool:
    return (info is None or info["kind"] != "file" or info["sha256"] != get_file_sha256(src)
            or info["mode"] != mode or info["owner"] != "root:root")


def put_changed(entries: list[tuple[str, str, str]], current: dict[str, FileInfo]):
    """pyinfra's files.put (root-owned) for each (source, destination, mode) that differs."""
    for src, dest, mode in entries:
        if file_differs(src, mode, current.get(dest)):
            yield from files.put._inner(src=src, dest=dest, user="root", group="root", mode=mode, create_remote_dir=True)


@operation()
def managed_files(entries: list[tuple[str, str, str]], directories: list[tuple[str, str, str]] | None = None):
    """
    Put local files on the node (root-owned) and make directories with an owner and mode.

    + entries: (local source, remote destination, mode) of each file
    + directories: (path, owner user, mode) of each directory

    **Example:**

    .. code:: python

        managed_files(entries=[("files/runtime/model_sync.py", "/var/lib/dual-spark/bin/model_sync.py", "755")],
                      directories=[("/var/lib/dual-spark/model", "spark", "755")])
    """
    directories = directories or []
    current = host.get_fact(FileDigests, paths=[dest for _, dest, _ in entries] + [path for path, _, _ in directories])["files"]
    changes = list(put_changed(entries, current))
    for path, user, mode in directories:
        info = current.get(path) or {"kind": "absent", "owner": None, "mode": None}
        if info["kind"] != "directory":
            changes.append(StringCommand("mkdir", "-p", QuoteString(path)))
        if info["kind"] != "directory" or info["owner"].split(":")[0] != user or info["mode"] != mode:
            changes.append(StringCommand("chown", QuoteString(f"{user}:"), QuoteString(path), "&&", "chmod", mode, QuoteString(path)))
    if not changes:
        host.noop("up to date: " + ", ".join(Path(p).name for p in [d for _, d, _ in entries] + [p for p, _, _ in directories]))
    yield from changes
