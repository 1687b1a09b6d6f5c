"""The lab's CPU vLLM environment, as scripts/test left it: its Pythons start with the collector
held (lab/vllm_sitecustomize.py, installed as that environment's sitecustomize)."""

import subprocess

import pytest

from tests.serving.conftest import VLLM_PYTHON
from tests.test_lab_vllm_site import SOURCE

pytestmark = pytest.mark.end_to_end


def test_a_python_of_the_lab_vllm_starts_with_the_collector_held_until_its_timer():
    script = "import gc, sitecustomize, threading; print(sitecustomize.__file__); print(gc.isenabled(), sorted(t.name for t in threading.enumerate()))"
    installed, state = subprocess.run([VLLM_PYTHON, "-c", script], capture_output=True, text=True, check=True, timeout=60).stdout.splitlines()
    assert open(installed).read() == SOURCE.read_text()
    assert state == "False ['MainThread', 'sparklab-gc-held']"
