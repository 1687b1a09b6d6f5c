"""The programs as the deploy ships them (programs.py): one zipapp whose bytes depend on its
sources only, with layout's names written into it, that runs each program; and what a run shows
when it changes on a node (operations/managed.py)."""

import ast
import hashlib
import io
import subprocess
import sys
import zipfile
from io import BytesIO

import pytest
from dual_spark import constants
from dual_spark.__main__ import PROGRAMS
from dual_spark.sync import send

import layout
import programs
from operations.managed import managed_files
from operations.own import NAMES
from tests.fake_host import args_key, run_operation
from tests.programs import ARCHIVE

DEST = "/var/lib/dual-spark/bin/dual-spark.pyz"
PRIVATE = "install -d -m 755 -o root -g root /run/dual-spark && install -d -m 700 -o spark /run/dual-spark/upload"


def test_the_same_sources_make_the_same_bytes():
    """Entries in name order, stored, each with the same time and mode: nothing of the machine
    that builds it (file times, umask, zlib) reaches the bytes."""
    data = programs.archive(programs.sources())
    assert data == programs.built() == ARCHIVE.read_bytes() and data.startswith(b"#!/usr/bin/env python3\n")
    entries = zipfile.ZipFile(io.BytesIO(data)).infolist()
    assert [entry.filename for entry in entries] == sorted(entry.filename for entry in entries)
    assert {(entry.date_time, entry.external_attr >> 16, entry.compress_type) for entry in entries} == {
        (programs.STAMP, 0o100644, zipfile.ZIP_STORED)}
    changed = programs.archive({**programs.sources(), "dual_spark/watchdog.py": "# another watchdog\n"})
    assert hashlib.sha256(changed).digest() != hashlib.sha256(data).digest()


def test_the_archive_holds_the_package_its_constants_and_its_entry_point():
    package = {f"dual_spark/{path.relative_to(programs.PACKAGE).as_posix()}" for path in programs.PACKAGE.rglob("*.py")}
    assert set(programs.sources()) == package | {"dual_spark/constants.py", "__main__.py"}
    assert not (programs.PACKAGE / "constants.py").exists()  # written at build time only


def test_the_programs_use_the_names_of_layout():
    for name in programs.SHARED:
        assert getattr(constants, name) == getattr(layout, name)
    assert send.SSH == ["ssh", *layout.SSH_OPTIONS, "-c", layout.FABRIC_CIPHER]


@pytest.mark.parametrize("name", sorted(programs.sources()))
def test_every_file_reads_as_python_3_10(name):
    """The Sparks' own Python runs sync, progress and health; the image's runs fetch and the watchdog."""
    ast.parse(programs.sources()[name], name, feature_version=(3, 10))


def test_one_file_runs_each_program_by_its_name():
    def run(*args):
        return subprocess.run([sys.executable, str(ARCHIVE), *args], capture_output=True, text=True, timeout=30)

    listed = run("--help")
    assert listed.returncode == 0 and all(f"    {name} " in listed.stdout for name in PROGRAMS)
    assert run().returncode == 2 and run("model_sync").returncode == 2
    for name in ("sync", "progress", "health", "watchdog"):  # fetch needs the runtime image's huggingface_hub
        shown = run(name, "--help")
        assert shown.returncode == 0 and shown.stdout.startswith(f"usage: dual-spark.pyz {name} "), shown.stderr


def test_the_watchdogs_digest_is_what_it_runs_as_shipped():
    """launch.sh names it: a changed watchdog, or a module it imports, restarts the cluster; a
    change elsewhere in the archive does not."""
    assert programs.runs("watchdog.py") == ("watchdog.py", "health.py", "planned.py", "secret.py", "atomic.py")
    assert programs.runs("metrics.py") == ("metrics.py", "atomic.py", "planned.py")
    read = [(programs.PACKAGE / name).read_bytes() for name in programs.runs("watchdog.py")]
    assert programs.digest("watchdog.py") == hashlib.sha256(b"".join(read)).hexdigest()
    assert "sync" not in " ".join(programs.runs("watchdog.py"))


def install(installed: dict | None, show_program_diffs: bool = False, facts: dict | None = None):
    """managed_files on the pair's head putting the archive where it has ``installed`` (a
    FileDigests entry; None: nothing), with no directory to claim."""
    info = installed or {"kind": "absent", "mode": None, "owner": None, "sha256": None}
    reading = {"files": {"files": {DEST: info}, "unreadable": []}, "directories": {}, "unreadable": []}
    return run_operation(managed_files, {
        "site": "pair", "host": "spark-head", "diff": True,
        "facts": {"spark-head": {"host_prep.ManagedPaths": {args_key({"files": [DEST], "directories": [], "names": NAMES}): reading},
                                 **(facts or {})}},
        "args": {"programs": [(BytesIO(programs.built()), DEST, "755")], "directories": [], "show_program_diffs": show_program_diffs}})


def test_a_dry_run_shows_the_archive_as_one_program():
    lines = sum(len(text.splitlines()) for text in programs.sources().values())
    digest = hashlib.sha256(programs.built()).hexdigest()
    commands, host = install(None)
    assert commands == ["mkdir -p /var/lib/dual-spark/bin", PRIVATE, ["upload", "<the programs' archive (programs.py)>", DEST],
                        f"chown root:root {DEST}", f"chmod 755 {DEST}"]
    assert host.printed == [f"[spark-head] Will create {DEST} (program, {lines} lines, sha256 {digest[:12]}): "
                            "full diff with --data show_program_diffs=true"]
    commands, host = install({"kind": "file", "mode": "755", "owner": "root:root", "sha256": digest})
    assert commands == [] and host.noop_description == "up to date: dual-spark.pyz"


def test_the_full_diff_of_the_archive_is_file_by_file():
    """Only the files that changed in it: one changed, one gone, one new."""
    theirs = {name: text.splitlines() for name, text in programs.sources().items()}
    theirs["dual_spark/watchdog.py"] = [*theirs["dual_spark/watchdog.py"][:-1], "    an older last line"]
    theirs["dual_spark/retired.py"] = ["print('gone')"]
    del theirs["dual_spark/health.py"]
    commands, host = install({"kind": "file", "mode": "755", "owner": "root:root", "sha256": "0" * 64}, show_program_diffs=True,
                             facts={"host_prep.ArchiveFiles": {f"path={DEST}": {"files": theirs, "unreadable": []}}})
    assert len(commands) == 4 and commands[0] == PRIVATE
    said = [line for line in host.printed if line.startswith("[spark-head] Will")]
    assert said == [f"[spark-head] Will create {DEST}/dual_spark/health.py", f"[spark-head] Will modify {DEST}/dual_spark/retired.py",
                    f"[spark-head] Will modify {DEST}/dual_spark/watchdog.py"]
    assert "  -     an older last line" in host.printed and "  - print('gone')" in host.printed
