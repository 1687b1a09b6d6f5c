"""Files and directories this project manages on the nodes: every path read in one round trip,
only what differs uploaded or changed. A configuration file shows its full diff; a program the
project ships (a script, or a zipapp of many) shows one line (its full diff on request, a
zipapp's file by file). The directories the site names are
claimed first (operations/own.py): nothing is written in one that is not the deploy's. The claim
is the shipped program's, which is not yet in state_dir then: when the claim changes anything, the
archive is put first in root's run directory (``CLAIMER``) and run from there."""

from __future__ import annotations

import hashlib
import posixpath
import zipfile
from io import BytesIO
from pathlib import Path
from typing import IO

from pyinfra import host
from pyinfra.api import OperationError, QuoteString, StringCommand, operation
from pyinfra.api.util import get_file_sha256
from pyinfra.facts.files import FileContents

from cluster import Cluster
from facts.host_prep import ArchiveFiles, FileInfo, ManagedPaths
from layout import MANAGED_HEADER, RUN_DIR, paths
from operations.own import NAMES, Claim, claim_command, deploy_directories, plan, reading_paths
from operations.readings import Reading, plans, read
from operations.render import show_diff, show_line
from operations.upload import upload
from programs import built

CLAIMER = f"{RUN_DIR}/dual-spark.pyz"  # the archive the claim runs from, before it is in state_dir


@plans
def readings(cluster: Cluster, name: str) -> list[Reading]:
    settings = cluster.settings
    claims = [Claim(*entry) for entry in deploy_directories(settings, cluster.deploy_user)]
    return [(ManagedPaths, {"files": [paths(settings.state_dir, "")["programs"]], "directories": reading_paths(claims), "names": NAMES})]


def refuse_theirs(path: str, lines: list[str] | None, owner: str | None, field: str | None = None) -> None:
    """Raise, naming the fix, where a configuration file the deploy would replace exists and is
    not the deploy's: another owner than root, or no ``MANAGED_HEADER`` line at its top. A file
    the deploy did not write is never overwritten, backup or not."""
    user = (owner or "root").split(":")[0]
    if lines is None or (user == "root" and any(line.startswith(MANAGED_HEADER) for line in lines[:2])):
        return
    why = f"is {user}'s" if user != "root" else f"has no '{MANAGED_HEADER}' line at its top"
    where = f", or name another path in site.toml ({field})" if field else "; the deploy needs this path for its own file"
    raise OperationError(f"{host.name}: {path} exists and {why}: the deploy did not write it and never overwrites it. "
                         f"Fix: move it aside if it is no longer needed (sudo mv {path} {path}.orig){where}")


def file_differs(src: str | IO[bytes], mode: str, info: FileInfo | None, owner: str = "root:root") -> bool:
    """Whether the node's file (``info``) is not ``src`` (a local path or bytes), ``owner``'s, with ``mode``."""
    return (info is None or info["kind"] != "file" or info["sha256"] != get_file_sha256(src)
            or info["mode"] != mode or info["owner"] != owner)


def text_of(src: str | IO[bytes]) -> str:
    if isinstance(src, str):
        return Path(src).read_text()
    src.seek(0)
    return src.read().decode()


def put_config(dest: str, src: str | IO[bytes], mode: str, info: FileInfo | None, field: str | None = None) -> list:
    """The commands that make ``dest`` the configuration file ``src`` (a local path or bytes),
    root's with ``mode``, through the private upload directory; its full diff shown. A file there
    the deploy did not write is refused (``refuse_theirs``) before any command is given."""
    text, exists = text_of(src), info is not None and info["kind"] == "file"
    if info is not None and info["kind"] not in ("file", "absent"):
        refuse_theirs(dest, [], info["owner"], field)  # a directory or a link where the file goes
    if exists and info["sha256"] == get_file_sha256(src):  # the deploy's text: only its owner or mode differ
        refuse_theirs(dest, text.splitlines(), info["owner"], field)
        show_line(f"Will set {dest} to root:root, mode {mode} (now {info['owner']}, mode {info['mode']})")
        commands = []
    else:
        current = host.get_fact(FileContents, path=dest) if exists else None
        refuse_theirs(dest, current, info["owner"] if exists else None, field)
        show_diff(dest, current, text)
        commands = [] if exists else [StringCommand("mkdir", "-p", QuoteString(posixpath.dirname(dest)))]
        commands += upload(src, dest)
    return commands + [StringCommand("chown", "root:root", QuoteString(dest)), StringCommand("chmod", mode, QuoteString(dest))]


def put_changed(entries: list[tuple[str, str, str, str]], current: dict[str, FileInfo]):
    """``put_config`` for each configuration file (source, destination, mode, the site field
    naming it) that differs; one the deploy did not write refused before any is put."""
    changed = [(src, dest, mode, field) for src, dest, mode, field in entries if file_differs(src, mode, current.get(dest))]
    commands = [put_config(dest, src, mode, current.get(dest), field) for src, dest, mode, field in changed]
    for each in commands:
        yield from each


def program_files(src: str | IO[bytes]) -> dict[str, str]:
    """A program's text: a zipapp's files by name, or a script as one file (named "")."""
    if zipfile.is_zipfile(src):
        with zipfile.ZipFile(src) as archive:
            return {name: archive.read(name).decode() for name in archive.namelist()}
    return {"": Path(src).read_text()}


def show_program_diff(dest: str, files: dict[str, str], exists: bool) -> None:
    """The full diff of a script, or of each file of a zipapp that changes in it."""
    if list(files) == [""]:
        show_diff(dest, host.get_fact(FileContents, path=dest) if exists else None, files[""])
        return
    theirs = (host.get_fact(ArchiveFiles, path=dest)["files"] if exists else None) or {}
    for name in sorted(files.keys() | theirs.keys()):
        if name not in files or theirs.get(name) != files[name].splitlines():
            show_diff(f"{dest}/{name}", theirs.get(name), files.get(name, ""))


def put_programs(programs: list[tuple[str | IO[bytes], str, str]], current: dict[str, FileInfo], show_program_diffs: bool):
    """Each program (source: a path or the bytes of a zipapp; destination; mode) that differs,
    uploaded root-owned. Its diff is one line (path, lines, SHA-256, new or changed), or the full
    diff with ``show_program_diffs``."""
    made: set[str] = set()
    for src, dest, mode in programs:
        info = current.get(dest)
        if not file_differs(src, mode, info):
            continue
        exists = info is not None and info["kind"] == "file"
        digest = get_file_sha256(src)
        if exists and info["sha256"] == digest:
            show_line(f"Will set {dest} to root:root, mode {mode} (now {info['owner']}, mode {info['mode']})")
        else:
            files = program_files(src)
            if show_program_diffs:
                show_program_diff(dest, files, exists)
            else:
                lines = sum(len(text.splitlines()) for text in files.values())
                show_line(f"Will {'modify' if exists else 'create'} {dest} (program, {lines} lines, "
                          f"sha256 {digest[:12]}{', was ' + info['sha256'][:12] if exists else ''}): "
                          "full diff with --data show_program_diffs=true")
            if not exists and posixpath.dirname(dest) not in made:
                made.add(posixpath.dirname(dest))
                yield StringCommand("mkdir", "-p", QuoteString(posixpath.dirname(dest)))
            yield from upload(src, dest)
        yield StringCommand("chown", "root:root", QuoteString(dest))
        yield StringCommand("chmod", mode, QuoteString(dest))


@operation()
def managed_files(programs: list[tuple[str | IO[bytes], str, str]], directories: list[tuple[str, str, str, str]] | None = None,
                  show_program_diffs: bool = False):
    """
    Claim the directories the site names (operations/own.py: made and marked, or found marked,
    then given an owner and mode; anything else refused, before any other change), then put the
    project's programs on the node (root-owned). The diff shows one line per directory made,
    adopted or changed, and per program that changes (its full diff with ``show_program_diffs``).

    + programs: (local source: a path, or a zipapp's bytes as a file object; remote destination; mode) of each program
    + directories: (site field, path, owner user, mode) of each directory the deploy owns
    + show_program_diffs: show each changed program's full diff instead of its one line

    **Example:**

    .. code:: python

        managed_files(programs=[(BytesIO(built()), "/var/lib/dual-spark/bin/dual-spark.pyz", "755")],
                      directories=[("state_dir", "/var/lib/dual-spark", "root", "755"),
                                   ("model_dir", "/var/lib/dual-spark/model", "spark", "755")])
    """
    claims = [Claim(*entry) for entry in directories or []]
    current = read(host, ManagedPaths, files=[dest for _, dest, _ in programs], directories=reading_paths(claims), names=NAMES)
    changes = []
    if claims:
        claiming = plan(claims, current["directories"])  # raises, naming the path and the fix, before anything changes
        for line in claiming.lines:
            show_line(line)
        if claiming.changes:
            changes += [*upload(BytesIO(built()), CLAIMER), StringCommand("chown", "root:root", CLAIMER),
                        StringCommand("chmod", "644", CLAIMER), claim_command(claims, claiming.owned, CLAIMER)]
    changes += put_programs(programs, current["files"]["files"], show_program_diffs)
    if not changes:
        host.noop("up to date: " + ", ".join([Path(dest).name for _, dest, _ in programs] + [claim.path for claim in claims]))
    yield from changes


def show_changed(path: str, text: str, info: dict | None, content: str | None, full: bool) -> None:
    """The diff of a file that changes: configuration whole; the deploy's own content (``content``
    names it: its rules, a dashboard) in one line, unless ``full``, as the programs are shown."""
    exists = info is not None and info["kind"] == "file"
    if content is None or full:
        show_diff(path, host.get_fact(FileContents, path=path) if exists and host.state.config.DIFF else None, text)
        return
    digest = hashlib.sha256(text.encode()).hexdigest()
    show_line(f"Will {'modify' if exists else 'create'} {path} ({content}, {len(text.splitlines())} lines, sha256 {digest[:12]}"
              f"{', was ' + info['sha256'][:12] if exists and info['sha256'] else ''}): full diff with --data show_program_diffs=true")
