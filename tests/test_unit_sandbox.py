"""What the collector and the watch of the answers write when they run, against what their units
let them write. On a Spark systemd enforces a unit's sandbox (ProtectSystem=strict: nothing but
ReadWritePaths= and a private /tmp); the lab's systemctl does not (docs/not-verified.md). So each
program runs here once, as its unit starts it, every path of its command line moved under a scratch root, and Python's audit hooks
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
from layout import ANSWERS_TEXTFILE, TEXTFILE, UNIT_FILES
from operations.observability import observability_settings
from tests.fake_host import site
from tests.test_observability import unit_settings

CREDENTIALS = "/run/credentials/dual-spark-answers.service"  # what systemd's %d names for the unit

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


def audited_writes(unit: dict, tmp_path: Path, extra: list[str], prepare=lambda root: None) -> tuple[list[Path], list[Path]]:
    """The unit's program run once as its unit starts it (``extra`` arguments added), every path
    of its command line moved under a scratch root: each write as on the node, and the paths its
    unit lets it write."""
    assert unit["ProtectSystem"] == ["strict"] and unit["PrivateTmp"] == ["true"]
    allowed = [Path(path) for path in unit["ReadWritePaths"]] + [Path("/tmp"), Path("/var/tmp")]  # PrivateTmp: its own
    python, archive, *argv = shlex.split(unit["ExecStart"][-1].replace("%d", CREDENTIALS))
    assert python == "/usr/bin/python3"
    root = tmp_path / "root"
    moved = [str(root / arg.lstrip("/")) if arg.startswith("/") else arg for arg in argv]
    for path in [root / "tmp", *(root / folder.lstrip("/") for folder in unit["ReadWritePaths"])]:
        path.mkdir(parents=True, exist_ok=True)
    prepare(root)
    (tmp_path / "dual-spark.pyz").write_bytes(programs.built())
    log = tmp_path / "writes.json"
    done = subprocess.run([sys.executable, "-c", RUN_AUDITED, str(log), str(tmp_path / "dual-spark.pyz"), *moved, *extra],
                          capture_output=True, text=True, timeout=120, cwd=root / "tmp", env={"PATH": "/usr/bin:/bin", "TMPDIR": str(root / "tmp")})
    assert done.returncode == 0, done.stderr
    written = [Path(path) for path in json.loads(log.read_text())]
    assert written, "the program wrote nothing"
    outside = [path for path in written if not path.is_relative_to(root)]
    assert outside == [], f"writes outside the paths its command line names: {outside}"
    return sorted({Path("/") / path.relative_to(root) for path in written}), allowed


@pytest.mark.parametrize("hostname", ["spark-head", "spark-worker"])
def test_the_collector_writes_only_where_its_unit_lets_it(hostname, tmp_path):
    unit = unit_settings(observability_settings(site("pair"), hostname).files[UNIT_FILES["collector"]])
    written, allowed = audited_writes(unit, tmp_path, ["--once", "--nvidia-smi", str(tmp_path / "no-nvidia-smi")])
    assert Path(TEXTFILE) in written
    assert [path for path in written if not any(path.is_relative_to(place) for place in allowed)] == []


def test_the_watch_of_the_answers_writes_only_where_its_unit_lets_it(tmp_path):
    """With the state that serves recorded and its answers, the API not answering: the round writes
    its textfile, and nothing else."""
    pair = site("pair")
    unit = unit_settings(observability_settings(pair, "spark-head").files[UNIT_FILES["answers"]])
    unit["ExecStart"][-1] = unit["ExecStart"][-1].replace(f"http://127.0.0.1:{pair.settings.vllm_port}", "http://127.0.0.1:9")

    def recorded(root: Path) -> None:
        served = root / pair.settings.stack_dir.lstrip("/") / "served"
        served.mkdir(parents=True)
        (served / "state.json").write_text('{"cluster": "c1"}')
        (served / "canary.json").write_text(json.dumps({"cluster": "c1", "failed": {}, "answers": {"fabric": {
            "prompt": "p", "max_tokens": 4, "ignore_eos": False, "tokens": [1, 2, 3, 4]}}}))
        key = root / CREDENTIALS.lstrip("/") / "api-key"
        key.parent.mkdir(parents=True)
        key.write_text("sk-test\n")
        key.chmod(0o600)

    written, allowed = audited_writes(unit, tmp_path, ["--once"], recorded)
    assert Path(ANSWERS_TEXTFILE) in written
    assert [path for path in written if not any(path.is_relative_to(place) for place in allowed)] == []
