"""The long-context probe end to end against the real vLLM: every trial gets a verdict."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serving.conftest import API_KEY

pytestmark = pytest.mark.end_to_end
REPO = Path(__file__).resolve().parents[2]


def test_probe_reports_a_verdict_per_trial(tmp_path, vllm_server):
    result = subprocess.run(
        [sys.executable, "-m", "bench.longctx", "--url", vllm_server, "--model", "tiny", "--sizes", "300,600",
         "--trials", "2", "--max-tokens", "24", "--profile", "cpu-tiny", "--out", str(tmp_path)],
        cwd=REPO, env={"PATH": "/usr/bin:/bin", "VLLM_API_KEY": API_KEY}, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    [raw] = tmp_path.glob("longctx-cpu-tiny-*.json")
    record = json.loads(raw.read_text())
    assert [row["size"] for row in record["table"]] == [300, 600]
    for row in record["table"]:
        assert row["fail"] + row["junk"] + row["pass"] == row["trials"] == 2
        assert abs(row["prompt_tokens"] - row["size"]) <= 1  # sized by /tokenize, counted so by the chat request
    # A 2-layer model with random weights retrieves nothing: every trial is a real failure.
    assert all(trial["verdict"] == "fail" and trial["error"] is None for trial in record["trials"])
    assert "real failures" in result.stdout
