"""bench.report --reference on a results directory written here in the published runs' format
(tests/bench/fixtures/published: results/raw/<profile>/<stamp>/..., not copies of their files)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from bench.reference import ReferenceError, read_reference

REPO = Path(__file__).resolve().parents[2]
PUBLISHED_DIR = Path(__file__).parent / "fixtures" / "published"
# ../shared/reference/FACTS.md, "Measured": C1 decode and C4 aggregate tok/s at 10K / 200K / 300K.
FACTS = {
    ("adaptive", 1): (34.54, 47.87, 55.32), ("adaptive", 4): (75.44, 83.24, 87.10),
    ("fast", 1): (35.64, 52.47, 56.21),
    ("long-c4", 1): (35.30, 36.94, 53.77), ("long-c4", 4): (60.10, 64.70, 82.37),
}


def report(folder: Path, reference: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.report", str(folder), "--reference", str(reference), "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def serving_record(path: Path, profile: str, cells: list[tuple[str, float, int, float, float]]) -> None:
    """A raw bench.serving record: cells of (prompt, mean prompt tokens, C, decode mean, aggregate mean)."""
    def stat(value):
        return {"n": 3, "mean": value, "p50": value, "p95": value}

    path.write_text(json.dumps({
        "schema_version": 1, "profile": profile, "model": "m", "git_revision": "abc1234", "settings": {"max_tokens": 256},
        "spec_decode": {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "acceptance_rate": None, "accepted_per_draft": None},
        "cells": [{"prompt": prompt, "concurrency": c, "prompt_tokens": stat(tokens), "decode_tok_s": stat(decode),
                   "aggregate_tok_s": stat(aggregate), "ttft_s": stat(1.0), "requests": [{}] * 3}
                  for prompt, tokens, c, decode, aggregate in cells]}))


def table(markdown: str, heading: str) -> list[list[str]]:
    """The rows of the first table after a heading, as cells."""
    block = []
    for line in markdown.split(heading, 1)[1].splitlines()[1:]:
        if line.startswith("|"):
            block.append([cell.strip() for cell in line.strip("|").split("|")])
        elif block:
            break
    return block[2:]


def test_the_report_reproduces_the_published_figures(tmp_path):
    result = report(REPO / "bench/examples/cpu-tiny/raw", PUBLISHED_DIR, tmp_path)
    assert result.returncode == 0, result.stderr
    rows = table((tmp_path / "report.md").read_text(), "## Published runs")
    seen = {}
    for profile, _stamp, prompt, _tokens, c, _requests, decode, aggregate, _ttft in rows:
        seen.setdefault((profile, int(c)), {})[prompt] = decode if c == "1" else aggregate
    assert {key: tuple(float(seen[key][p]) for p in ("10K", "200K", "300K")) for key in seen} == FACTS
    text = (tmp_path / "report.md").read_text()
    assert "| adaptive | 20260719T193858Z | 10K | 9028 | 1 | 3 |" in text
    assert "- long-c4 settings (`profile.env`): DSPARK_VLLM_IMAGE=dual-spark-vllm:long-c4-stage-c, KV_CACHE_DTYPE=nvfp4_ds_mla" in text
    assert "| adaptive | head | 4 | 71.8 | 48.0 | 61 | - |" in text  # memory.used was [N/A] on every sample


def test_the_newest_stamp_of_a_profile_is_the_published_one():
    runs = {run["profile"]: run for run in read_reference(PUBLISHED_DIR)}
    assert runs["fast"]["stamp"] == "20260719T193858Z"
    assert runs["fast"]["cells"][0]["decode_tok_s"] == 35.64  # the older stamp says 30.00
    assert runs["long-c4"]["env"]["KV_CACHE_DTYPE"] == "nvfp4_ds_mla"


def test_telemetry_with_units_and_na_memory_is_summarised():
    head = read_reference(PUBLISHED_DIR)[0]["telemetry"]["head"]
    assert head == {"samples": 4, "mean_utilization_pct": pytest.approx(71.75), "mean_power_w": pytest.approx(48.0),
                    "peak_temperature_c": 61.0, "peak_memory_used_mib": None}


def test_published_per_position_acceptance_sums_to_the_accepted_counter():
    for run in read_reference(PUBLISHED_DIR):
        for cell in run["cells"]:
            delta = json.loads(Path(cell["file"].replace(".json", ".speculative-delta.json")).read_text())
            assert sum(cell["spec"]["accepted_per_position"]) == cell["spec"]["accepted_tokens"] == delta["accepted_tokens"]
            assert cell["spec"]["drafts"] == delta["drafts"]


def test_ours_beside_the_published_with_ratios_matched_by_tokens(tmp_path):
    ours = tmp_path / "ours"
    ours.mkdir()
    serving_record(ours / "serving-adaptive-1.json", "adaptive", [
        ("10K", 9030.0, 1, 17.27, 16.0),      # 0.02% from 9,028: matches
        ("10K", 9030.0, 4, 10.0, 150.88),     # matches the C4 cell
        ("200K", 180000.0, 1, 40.0, 30.0),    # 1.9% from 176,617: no published cell
    ])
    result = report(ours, PUBLISHED_DIR, tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "2 of 3 cells matched a published one" in result.stdout
    rows = {tuple(row[:3]): row for row in table((tmp_path / "out/report.md").read_text(), "## Ours against the published runs")}
    assert rows[("adaptive", "10K", "1")][3:7] == ["9030 / 9028", "17.27", "34.54", "0.50x"]
    assert rows[("adaptive", "10K", "4")][7:10] == ["150.88", "75.44", "2.00x"]
    assert rows[("adaptive", "200K", "1")][3] == "180000 / none published"
    saved = json.loads((tmp_path / "out/report.json").read_text())["against_published"]
    assert saved[0]["ratio"]["decode_tok_s"] == pytest.approx(17.27 / 34.54)
    chart = ElementTree.parse(tmp_path / "out/c1_decode_vs_published.svg").getroot()
    labels = [text.text for text in chart.iter("{http://www.w3.org/2000/svg}text")]
    assert "17.3 (0.50x)" in labels and "34.5" in labels and "adaptive (published)" in labels


def test_a_file_out_of_format_is_named_with_its_field(tmp_path):
    broken = tmp_path / "published"
    shutil.copytree(PUBLISHED_DIR, broken)
    cell = broken / "results/raw/adaptive/20260719T193858Z/book-context-10k-c1.json"
    data = json.loads(cell.read_text())
    del data["summary"]["mean_decode_tokens_per_second"]
    cell.write_text(json.dumps(data))
    result = report(REPO / "bench/examples/cpu-tiny/raw", broken, tmp_path / "out")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "--reference: " in result.stderr and "book-context-10k-c1.json: summary.mean_decode_tokens_per_second is missing" in result.stderr


def test_a_directory_without_runs_says_what_it_looked_for(tmp_path):
    with pytest.raises(ReferenceError, match=r"no <profile>/<stamp>/book-context-<size>-c<N>\.json under it"):
        read_reference(tmp_path)
