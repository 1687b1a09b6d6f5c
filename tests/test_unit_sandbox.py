"""What the collector writes when it runs, against what its unit lets it write. On a Spark systemd
enforces the unit's sandbox (ProtectSystem=strict: nothing but ReadWritePaths= and a private /tmp);
the lab's systemctl does not (docs/not-verified.md). So the collector runs here once, as its unit
starts it, every path of its command line moved under a scratch root, and Python's audit hooks
record every file it opens for writing, creates, renames, removes or changes: each must be one the
unit allows, and the textfile must be among them."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import programs
from layout import TEXTFILE, UNIT_FILES
from operations.observability import observability_settings
from tests.fake_host import site
from tests.test_observability import unit_settings

# Runs the archive as `python3 ARCHIVE ARGS...` would, after installing a hook that appends each
# write the program makes (the path, or "fd" for a descriptor) to the file named by argv[1].
RUN_AUDITED = """
import json, os, runpy, sys
log, archive = sys.argv[1], sys.argv[2]
WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
CHANGES = {"os.rename": 2, "os.mkdir": 1, "os.remove": 1, "os.rmdir": 1, "os.chmod": 1, "os.chown": 1, "os.symlink": 2,
           "os.link": 2, "os.truncate": 1, "os.utime": 1, "shutil.copyfile": 2, "shutil.move": 2}
seen, auditing = [], [True]
def hook(event, args):
    if not auditing:
        return
    if event == "open" and isinstance(args[0], (str, bytes)):
        mode, flags = args[1], args[2]
        if (isinstance(mode, str) and set(mode) & set("wax+")) or (flags or 0) & WRITING:
            seen.append(os.path.abspath(os.fsdecode(args[0])))
    elif event in CHANGES:
        seen.extend(os.path.abspath(os.fsdecode(a)) for a in args[:CHANGES[event]] if isinstance(a, (str, bytes)))
sys.addaudithook(hook)
sys.argv = [archive, *sys.argv[3:]]
try:
    runpy.run_path(archive, run_name="__main__")
finally:
    auditing.clear()
    with open(log, "w") as out:
        json.dump(seen, out)
"""


@pytest.mark.parametrize("hostname", ["spark-head", "spark-worker"])
def test_the_collector_writes_only_where_its_unit_lets_it(hostname, tmp_path):
    unit = unit_settings(observability_settings(site("pair"), hostname).files[UNIT_FILES["collector"]])
    assert unit["ProtectSystem"] == ["strict"] and unit["PrivateTmp"] == ["true"]
    allowed = [Path(path) for path in unit["ReadWritePaths"]] + [Path("/tmp"), Path("/var/tmp")]  # PrivateTmp: its own
    python, archive, *argv = shlex.split(unit["ExecStart"][-1])
    root = tmp_path / "root"
    moved = [str(root / arg.lstrip("/")) if arg.startswith("/") else arg for arg in argv]
    for path in (root / TEXTFILE.lstrip("/")).parent, root / "tmp":
        path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "dual-spark.pyz").write_bytes(programs.built())
    log = tmp_path / "writes.json"
    done = subprocess.run([sys.executable, "-c", RUN_AUDITED, str(log), str(tmp_path / "dual-spark.pyz"), *moved, "--once",
                           "--nvidia-smi", str(tmp_path / "no-nvidia-smi")],
                          capture_output=True, text=True, timeout=120, cwd=root / "tmp", env={"PATH": "/usr/bin:/bin", "TMPDIR": str(root / "tmp")})
    assert done.returncode == 0, done.stderr
    written = [Path(path) for path in json.loads(log.read_text())]
    assert python == "/usr/bin/python3" and written, "the collector wrote nothing"
    outside = [path for path in written if not path.is_relative_to(root)]
    assert outside == [], f"writes outside the paths its command line names: {outside}"
    as_on_the_node = {Path("/") / path.relative_to(root) for path in written}
    assert Path(TEXTFILE) in as_on_the_node
    assert [path for path in as_on_the_node if not any(path.is_relative_to(place) for place in allowed)] == []
