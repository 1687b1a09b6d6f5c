"""The client-overhead script runs and prints its figures (a figure, not a timed test)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_client_overhead_prints_figures():
    result = subprocess.run([sys.executable, "-m", "bench.client_overhead", "--streams", "8", "--groups", "2", "--tokens", "32"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "8 streams x 2 groups x 32 tokens" in result.stdout
    assert "client ceiling" in result.stdout and "us per token" in result.stdout
