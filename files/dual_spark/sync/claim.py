"""A model directory the deploy may clean: one it made, marked as such."""

from __future__ import annotations

import socket
from pathlib import Path

from ..constants import MANAGED_MARKER, OWN_FILES
from .model import PART, SyncError


def claim(root: Path, records: list[dict]) -> None:
    """Let the deploy clean root (delete what the model does not have, own it all) only if it
    made root: root carries its marker, or is new or empty, or holds only files its records
    (``{"files": {name: ...}}``: the head's manifest, the worker's verified record, the
    manifest being received) list, their partial copies and its own hidden files (an older
    version of the deploy wrote no marker). Then the marker is written; anything else is refused."""
    marker = root / MANAGED_MARKER
    if marker.is_file():
        return
    if root.exists() and not root.is_dir():
        raise SyncError(f"model_dir {root} is not a directory. Fix: move it away, or set model_dir in site.toml to another path.")
    root.mkdir(parents=True, exist_ok=True)
    listed = {name for record in records for name in record.get("files", {})}
    foreign = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        ours = (relative.removesuffix(PART) in listed or relative.startswith((OWN_FILES, ".cache/huggingface/")))
        if not (path.is_dir() and not path.is_symlink()) and not ours:
            foreign.append(relative)
    if foreign:
        raise SyncError(
            f"{socket.gethostname()}: model_dir {root} holds files the deploy did not put there ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}; {len(foreign)} in all) and no {MANAGED_MARKER} marker: the deploy deletes files "
            f"the model does not have from its model directory, so it leaves this one alone. Fix: move those files away "
            f"(or, to have the deploy copy a model from there, set model.path to it), or set model_dir in site.toml to "
            f"an empty or new directory.")
    marker.write_text("This directory is the dual-spark deploy's model directory: it deletes files here that the "
                      "model does not have.\n")

