"""lab/vllm_sitecustomize.py, which the lab's CPU vLLM environment runs at every Python start:
the collector held, then released once the start-up is over."""

import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "lab/vllm_sitecustomize.py"


def test_the_collector_is_held_at_start_and_collects_again_after_the_start_up():
    source = SOURCE.read_text()
    assert "START_UP = 240" in source
    script = source.replace("START_UP = 240", "START_UP = 0.3") + (
        "\nimport time\nheld = not gc.isenabled()\ntime.sleep(1.5)\nprint(held, gc.isenabled())\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert result.stdout.split() == ["True", "True"], result.stdout + result.stderr


def test_the_timer_never_keeps_a_python_alive():
    result = subprocess.run([sys.executable, "-c", SOURCE.read_text() + "\nprint('done')\n"], capture_output=True, text=True, timeout=10)
    assert result.returncode == 0 and result.stdout == "done\n", result.stderr
