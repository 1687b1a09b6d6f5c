"""progress, the progress lines of the deploy's long steps: their wording, how often they
come, and its two programs (a counting pipe, a command watched) run for real."""

import io
import re
import subprocess
import sys
import time

import pytest
from dual_spark import progress

from tests.programs import ARCHIVE

PROGRAM = [sys.executable, str(ARCHIVE), "progress"]


@pytest.mark.parametrize(("n", "text"), [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (12.34 * (1 << 20), "12.3 MiB"),
                                         (155.3 * (1 << 30), "155.30 GiB")])
def test_sizes(n, text):
    assert progress.size(n) == text


@pytest.mark.parametrize(("seconds", "text"), [(0, "0 s"), (42.4, "42 s"), (185, "3 min 05 s"), (7620, "2 h 07 min")])
def test_durations(seconds, text):
    assert progress.duration(seconds) == text


def test_a_line_says_done_of_total_rate_and_time_left():
    gib = 1 << 30
    assert progress.line("fetching x", 40 * gib, 155 * gib, 100) == \
        "fetching x: 40.00 GiB of 155.00 GiB (26%), 409.6 MiB/s, 4 min 48 s left"
    assert progress.line("streaming", 3 << 20, None, 2) == "streaming: 3.0 MiB, 1.5 MiB/s"  # no total: no share, no time left
    assert progress.line("hashing", 0, gib, 0) == "hashing: 0 B of 1.00 GiB (0%), 0 B/s"  # nothing yet: no time left
    assert progress.final("hashing", 2 * gib, 4) == "hashing: 2.00 GiB in 4 s (512.0 MiB/s)"


def test_lines_come_while_the_block_runs_and_not_after():
    out = io.StringIO()
    with progress.Progress("copying", 100, every=0.02, out=out) as watch:
        watch.add(50)
        time.sleep(0.3)
    time.sleep(0.1)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3 and lines[-1].startswith("copying: 50 B of 100 B (50%)"), lines
    assert len(out.getvalue().splitlines()) == len(lines)


def test_no_lines_when_silent_or_before_the_first_interval():
    out = io.StringIO()
    for every in (None, 60):
        with progress.Progress("copying", 100, every=every, out=out) as watch:
            watch.add(100)
    assert out.getvalue() == ""


def test_the_pipe_passes_every_byte_and_reports_on_its_own_descriptor():
    data = bytes(range(256)) * 40000
    result = subprocess.run([*PROGRAM, "pipe", "--what", "streaming image x", "--total", str(len(data))],
                            input=data, capture_output=True, timeout=60)
    assert result.returncode == 0 and result.stdout == data
    assert result.stderr.decode().splitlines()[-1].startswith("streaming image x: 9.8 MiB in 0 s")


def test_run_ends_with_one_line_or_with_the_commands_last_lines_and_status():
    done = subprocess.run([*PROGRAM, "run", "--what", "building image x", "--", "sh", "-c", "echo step 1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "building image x: done in 0 s\n"
    failed = subprocess.run([*PROGRAM, "run", "--what", "pulling x", "--", "sh", "-c",
                             "printf 'layer 1\\rlayer 2\\n'; echo 'denied: no access' >&2; exit 3"],
                            capture_output=True, text=True, timeout=60)
    assert failed.returncode == 3 and failed.stdout == ""
    assert failed.stderr.splitlines() == ["layer 1", "layer 2", "denied: no access", "pulling x: failed after 0 s (exit 3)"]


def test_run_says_so_when_the_command_is_missing():
    missing = subprocess.run([*PROGRAM, "run", "--what", "copying x", "--", "no-such-program-here"],
                             capture_output=True, text=True, timeout=60)
    # The OS's reason depends on PATH (a directory this user may not search reads "Permission denied").
    assert missing.returncode == 127 and re.fullmatch(r"copying x: cannot run no-such-program-here: \S.*\n", missing.stderr), missing.stderr
