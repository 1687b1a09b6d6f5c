"""bench.report (and its --reference) over bad files made here: each is refused naming the file and
the field, never with a traceback. The bad files are corrupted copies of the fixtures: the published
format (tests/bench/fixtures/published) and our raw records (bench/examples/cpu-tiny/raw)."""

import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import report, serving

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = Path(__file__).parent / "fixtures" / "published"
OURS = REPO / "bench/examples/cpu-tiny/raw"
STAMP = "results/raw/adaptive/20260719T193858Z"
RECORD = "serving-cpu-ngram3-20261130T020955Z.json"


def run_report(ours: Path, reference: Path | None, out: Path):
    arguments = [str(ours), "--out", str(out)] + (["--reference", str(reference)] if reference else [])
    return CliRunner().invoke(report.main, arguments)


def refused(result, usage: bool = False) -> str:
    """The error of a run that stopped with a message (click's exit; 2 for a bad argument), not an exception."""
    assert result.exit_code == (2 if usage else 1) and isinstance(result.exception, SystemExit), result.exc_info
    assert "Traceback" not in result.output
    return " ".join(result.output.split())


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def symlink_loop(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to(path.name)


CELL = f"{STAMP}/book-context-10k-c1.json"
PUBLISHED_CASES = {
    "truncated JSON": (CELL, lambda path: path.write_text(path.read_text()[:200]), "not JSON (Unterminated string"),
    "JSON that is not an object": (CELL, lambda path: path.write_text("[1, 2]"), "the file is [1, 2]; expected a JSON object"),
    "a folder named like a result file": (f"{STAMP}/book-context-50k-c1.json", Path.mkdir, "a directory where a file belongs"),
    "a symlink loop": (CELL, symlink_loop, "cannot be read (Too many levels of symbolic links)"),
    "non-UTF-8 bytes": (CELL, lambda path: path.write_bytes(path.read_bytes().replace(b"adaptive", b"adapt\xefve")),
                        "not UTF-8 text (byte 0xef at offset"),
    "a string where a number belongs": (CELL, lambda path: edit_json(path, lambda d: d["summary"].update(mean_ttft_seconds="0.3 s")),
                                        'summary.mean_ttft_seconds is "0.3 s"; expected a number of 0 or more'),
    "a boolean where a number belongs": (CELL, lambda path: edit_json(path, lambda d: d["summary"].update(mean_prompt_tokens=True)),
                                         "summary.mean_prompt_tokens is true; expected a number"),
    "not a number": (CELL, lambda path: edit_json(path, lambda d: d["summary"].update(mean_decode_tokens_per_second=math.nan)),
                     "summary.mean_decode_tokens_per_second is NaN; expected a number"),
    "a string where the summary belongs": (CELL, lambda path: edit_json(path, lambda d: d.update(summary="fast")),
                                           'summary is "fast"; expected an object'),
    "a string in a speculative delta": (
        f"{STAMP}/book-context-10k-c1.speculative-delta.json",
        lambda path: edit_json(path, lambda d: d["series_deltas"].update({"vllm:spec_decode_num_drafts_total": "300"})),
        'series_deltas["vllm:spec_decode_num_drafts_total"] is "300"; expected a number'),
    "profile.env that is not UTF-8": (f"{STAMP}/profile.env", lambda path: path.write_bytes(b"KV_CACHE_DTYPE=\xff\n"), "not UTF-8 text"),
    "telemetry with other columns": (f"{STAMP}/head-telemetry.csv", lambda path: path.write_text("time, gpu_util, power\n1, 2, 3\n"),
                                     "no utilization.gpu column (the header has time, gpu_util, power)"),
    "telemetry without a header": (f"{STAMP}/head-telemetry.csv", lambda path: path.write_text("Time,GPU Util %\n1,96\n"),
                                   "no nvidia-smi CSV header (line 1 is 'Time,GPU Util %')"),
    "telemetry rows narrower than the header": (f"{STAMP}/head-telemetry.csv",
                                                lambda path: path.write_text(path.read_text().replace(", [N/A], 96 %, [N/A]", "", 1)),
                                                "line 3 has 4 values, the header 7"),
    "telemetry with text where a number belongs": (f"{STAMP}/head-telemetry.csv",
                                                   lambda path: path.write_text(path.read_text().replace("66.53 W", "lots")),
                                                   "line 3: power.draw is 'lots'; expected a number or [N/A]"),
}


@pytest.mark.parametrize("name", PUBLISHED_CASES)
def test_a_bad_published_file_is_named_with_its_field(tmp_path, name):
    relative, spoil, message = PUBLISHED_CASES[name]
    shutil.copytree(PUBLISHED, tmp_path / "published")
    spoil(tmp_path / "published" / relative)
    error = refused(run_report(OURS, tmp_path / "published", tmp_path / "out"))
    assert f"Error: --reference: {tmp_path / 'published' / relative}: " in error
    assert message in error and "Fix: " in error


OUR_CASES = {
    "truncated JSON": (lambda path: path.write_text(path.read_text()[:1000]), "not JSON ("),
    "JSON that is not an object": (lambda path: path.write_text('"cells"'), 'the file is "cells"; expected a JSON object'),
    "a folder named like a result file": (lambda path: (path.unlink(), path.mkdir()), "a directory where a file belongs"),
    "a symlink loop": (symlink_loop, "cannot be read (Too many levels of symbolic links)"),
    "non-UTF-8 bytes": (lambda path: path.write_bytes(b"\xff" + path.read_bytes()), "not UTF-8 text (byte 0xff at offset 0)"),
    "a string where a number belongs": (lambda path: edit_json(path, lambda d: d["cells"][1]["decode_tok_s"].update(mean="fast")),
                                        'cells[1].decode_tok_s.mean is "fast"; expected a number of 0 or more, or null'),
    "a boolean output length": (lambda path: edit_json(path, lambda d: d["settings"].update(max_tokens=True)),
                                "settings.max_tokens is true; expected a whole number from 1 to 10^9"),
    "no cells": (lambda path: edit_json(path, lambda d: d.update(cells=[])), "cells is []; expected a list of at least one cell"),
    "a cell that is not an object": (lambda path: edit_json(path, lambda d: d["cells"].__setitem__(2, 7)),
                                     "cells[2] is 7; expected an object"),
    "a prompt without a size": (lambda path: edit_json(path, lambda d: d["cells"][0].update(prompt="ten")),
                                'cells[0].prompt is "ten"; expected a prompt name like 300 or 10K'),
    "a counter list with text": (lambda path: edit_json(path, lambda d: d["spec_decode"].update(accepted_per_position=["a"])),
                                 'spec_decode.accepted_per_position is ["a"]; expected a list of numbers'),
    "a boolean schema version": (lambda path: edit_json(path, lambda d: d.update(schema_version=True)),
                                 "schema_version True, this report reads 1"),
}


@pytest.mark.parametrize("name", OUR_CASES)
def test_a_bad_raw_record_is_named_with_its_field(tmp_path, name):
    spoil, message = OUR_CASES[name]
    shutil.copytree(OURS, tmp_path / "raw")
    spoil(tmp_path / "raw" / RECORD)
    error = refused(run_report(tmp_path / "raw", None, tmp_path / "out"))
    assert f"Error: {tmp_path / 'raw' / RECORD}: " in error and message in error
    assert "Fix: " in error


def test_the_command_line_says_it_without_a_traceback(tmp_path):
    shutil.copytree(PUBLISHED, tmp_path / "published")
    telemetry = tmp_path / "published" / STAMP / "worker-telemetry.csv"
    telemetry.write_text("gpu, watts\n0, 12\n")
    result = subprocess.run([sys.executable, "-m", "bench.report", str(OURS), "--reference", str(tmp_path / "published"),
                             "--out", str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"{telemetry}: no utilization.gpu column (the header has gpu, watts)" in result.stderr


def test_a_default_out_folder_that_is_a_file_is_refused(tmp_path):
    shutil.copytree(OURS, tmp_path / "raw")
    (tmp_path / "raw" / "report").write_text("not a folder")
    error = refused(CliRunner().invoke(report.main, [str(tmp_path / "raw")]), usage=True)
    assert f"Invalid value for '--out': {tmp_path / 'raw' / 'report'} exists and is not a directory" in error


def test_an_api_key_file_that_is_not_text_is_refused_without_showing_it(tmp_path):
    (tmp_path / "key").write_bytes(b"sk-\xff\xfe-secret")
    error = refused(CliRunner().invoke(serving.main, ["--api-key-file", str(tmp_path / "key"), "--url", "http://127.0.0.1:9"]), usage=True)
    assert f"Invalid value for '--api-key-file': {tmp_path / 'key'}: not UTF-8 text (byte 0xff at offset 3)" in error and "secret" not in error


# Property tests: any file of either tree, spoiled at random, is read or refused naming that file.
PROFILE = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PUBLISHED_FILES = sorted(str(path.relative_to(PUBLISHED)) for path in PUBLISHED.rglob("*") if path.is_file())
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**20) | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)


@st.composite
def spoiled_bytes(draw, data: bytes) -> bytes:
    """Cut short, a stretch overwritten with random bytes, or lines dropped."""
    how = draw(st.sampled_from(["cut", "overwrite", "drop lines"]))
    if how == "cut":
        return data[:draw(st.integers(0, len(data)))]
    if how == "overwrite":
        start = draw(st.integers(0, len(data)))
        return data[:start] + draw(st.binary(min_size=1, max_size=8)) + data[start + 8:]
    lines = data.split(b"\n")
    dropped = draw(st.sets(st.integers(0, len(lines) - 1), max_size=3))
    return b"\n".join(line for index, line in enumerate(lines) if index not in dropped)


@PROFILE
@given(data=st.data(), relative=st.sampled_from(PUBLISHED_FILES))
def test_any_spoiled_published_file_is_read_or_named(data, relative):
    with tempfile.TemporaryDirectory() as folder:
        tree = Path(folder) / "published"
        shutil.copytree(PUBLISHED, tree)
        path = tree / relative
        path.write_bytes(data.draw(spoiled_bytes(path.read_bytes())))
        result = run_report(OURS, tree, Path(folder) / "out")
        if result.exit_code != 0:
            assert f"--reference: {path}: " in refused(result)


def json_paths(value, prefix: str = "") -> list[str]:
    """Every value's place in a record, spelt as the errors spell it: settings.max_tokens, cells[0].prompt."""
    places = [prefix] if prefix else []
    if isinstance(value, dict):
        places += [place for key, inner in value.items() for place in json_paths(inner, f"{prefix}.{key}" if prefix else key)]
    elif isinstance(value, list):
        places += [place for index, inner in enumerate(value[:3]) for place in json_paths(inner, f"{prefix}[{index}]")]
    return places


def replace_at(record, place: str, value) -> None:
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", place)
    inner = record
    for part in parts[:-1]:
        inner = inner[int(part[1:-1])] if part.startswith("[") else inner[part]
    last = parts[-1]
    inner[int(last[1:-1]) if last.startswith("[") else last] = value


RECORD_DATA = json.loads((OURS / RECORD).read_text())
RECORD_PLACES = [place for place in json_paths(RECORD_DATA) if "." in place or "[" in place or place in RECORD_DATA]


@PROFILE
@given(place=st.sampled_from(RECORD_PLACES), value=JSON_VALUES)
def test_any_field_of_a_raw_record_with_any_value_is_read_or_named(place, value):
    record = json.loads(json.dumps(RECORD_DATA))
    replace_at(record, place, value)
    with tempfile.TemporaryDirectory() as folder:
        raw = Path(folder) / "raw"
        shutil.copytree(OURS, raw)
        (raw / RECORD).write_text(json.dumps(record))
        result = run_report(raw, None, Path(folder) / "out")
        if result.exit_code != 0:
            named = re.search(rf"{re.escape(str(raw / RECORD))}: (\S+?)[ ;,]", refused(result)).group(1)
            assert place.startswith(named) or named.startswith(place), (place, named)
