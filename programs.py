"""The programs the deploy runs on the nodes (files/dual_spark/: model replication, hub fetch,
progress lines, serving health and watchdog), shipped as one zipapp. Its constants module is
written from layout when the archive is built, and the archive's bytes depend on its sources
only (entries sorted, stored, with a fixed time and mode): the same sources, the same hash."""

from __future__ import annotations

import ast
import hashlib
import io
import zipfile
from functools import cache
from pathlib import Path

import layout

PACKAGE = Path(__file__).resolve().parent / "files/dual_spark"
SHARED = ("MANAGED_MARKER", "OWN_FILES", "SSH_OPTIONS", "FABRIC_CIPHER", "RECORD_STATE", "CANARY_ANSWERS", "STOP_TIMEOUT")  # what the programs take from layout
ENTRY = "from dual_spark.__main__ import main\n\nmain()\n"
SHEBANG = b"#!/usr/bin/env python3\n"
STAMP = (1980, 1, 1, 0, 0, 0)


def constants() -> str:
    """The package's constants module, from layout."""
    lines = [f"{name} = {getattr(layout, name)!r}\n" for name in SHARED]
    return '"""Written from layout.py when the archive is built (programs.py): the deploy\'s names."""\n\n' + "".join(lines)


@cache
def sources() -> dict[str, str]:
    """Every file of the archive by its name there: the package, its constants, the entry point
    (read once per run, as the archive is built once)."""
    found = {f"dual_spark/{path.relative_to(PACKAGE).as_posix()}": path.read_text() for path in PACKAGE.rglob("*.py")}
    found |= {"dual_spark/constants.py": constants(), "__main__.py": ENTRY}
    return dict(sorted(found.items()))


def archive(files: dict[str, str]) -> bytes:
    """A zipapp of ``files``: a shebang line, then a zip whose entries are stored in order, each
    with the same time and mode."""
    data = io.BytesIO()
    data.write(SHEBANG)
    with zipfile.ZipFile(data, "w", zipfile.ZIP_STORED) as archived:
        for name, text in files.items():
            entry = zipfile.ZipInfo(name, STAMP)
            entry.create_system, entry.external_attr = 3, 0o100644 << 16
            archived.writestr(entry, text.encode())
    return data.getvalue()


@cache
def built() -> bytes:
    """The archive the deploy installs, built once per run."""
    return archive(sources())


@cache
def runs(module: str) -> tuple[str, ...]:
    """``module`` of the package and every module of it that it imports, directly or through
    another, each once: breadth first, each module's in the order of their names (the package
    imports only itself, by relative imports)."""
    found, pending = [], [module]
    while pending:
        name = pending.pop(0)
        if name in found:
            continue
        found.append(name)
        imported = set()
        for node in ast.walk(ast.parse(sources()[f"dual_spark/{name}"])):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                imported |= {f"{node.module}.py"} if node.module else {f"{alias.name}.py" for alias in node.names}
        pending += sorted(imported)
    return tuple(found)


def digest(module: str) -> str:
    """SHA-256 of what ``module`` runs (``runs``), as shipped: a change to any of it changes it."""
    return hashlib.sha256("".join(sources()[f"dual_spark/{name}"] for name in runs(module)).encode()).hexdigest()
