"""The lab's CPU vLLM environment, as scripts/test left it: vLLM's processes there fork
(lab/vllm_sitecustomize.py, installed as that environment's sitecustomize; lab/config.py asks
for fork), and any other Python of it, as the product's programs are, starts untouched."""

import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.serving.conftest import VLLM_PYTHON
from tests.test_lab_vllm_site import SOURCE

pytestmark = pytest.mark.end_to_end


def test_the_lab_vllms_site_is_installed_and_leaves_other_pythons_alone():
    script = "import gc, sitecustomize, threading; print(sitecustomize.__file__); print(gc.isenabled(), sorted(t.name for t in threading.enumerate()))"
    installed, state = subprocess.run([VLLM_PYTHON, "-c", script], capture_output=True, text=True, check=True, timeout=60).stdout.splitlines()
    assert open(installed).read() == SOURCE.read_text()
    assert state == "True ['MainThread']"


def processes() -> dict[int, tuple[int, bytes]]:
    """Every process: its parent and its command line."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            found[int(proc.name)] = (parent, (proc / "cmdline").read_bytes())
        except (ValueError, OSError):
            continue
    return found


def torch_at(pid: int) -> str:
    """Where torch's library starts in that process's address space."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return next(line.split("-")[0] for line in maps if line.endswith("/libtorch_cpu.so"))


def test_the_servers_engine_is_forked_not_spawned(vllm_server):
    """A forked process has its parent's address space, torch where the parent has it; a spawned
    one is laid out anew, at random (the kernel's randomize_va_space)."""
    assert Path("/proc/sys/kernel/randomize_va_space").read_text().strip() != "0"
    port = str(urlsplit(vllm_server).port).encode()
    table = processes()
    server = next(pid for pid, (_, cmdline) in table.items()
                  if b"vllm.entrypoints.openai.api_server" in cmdline and b"\0--port\0" + port + b"\0" in cmdline)
    engines = [pid for pid, (parent, cmdline) in table.items() if parent == server and cmdline.startswith(b"VLLM::")]
    assert engines, f"no vLLM process under the server {server}"
    assert {pid: torch_at(pid) for pid in engines} == {pid: torch_at(server) for pid in engines}


def test_the_ngram_drafters_kernels_are_cached_where_the_lab_names_a_cache_and_numba_is_left_as_it_was(tmp_path):
    """The finder the lab's vLLM inserts where NUMBA_CACHE_DIR is set: the drafter's two kernels
    compile with numba's cache; a kernel of any other module, and numba's decorators, as before."""
    script = ("import sys, numba, sitecustomize; before = numba.jit, numba.njit; sys.meta_path.insert(0, sitecustomize.OnImport(sitecustomize.DRAFTER, sitecustomize.cached_drafter))\n"
              "from vllm.v1.spec_decode import ngram_proposer as drafter\n"
              "@numba.njit\ndef other(x): return x\n"
              "print([type(kernel._cache).__name__ for kernel in (drafter.batch_propose_numba, drafter._find_longest_matched_ngram_and_propose_tokens, other)],"
              " (numba.jit, numba.njit) == before)")
    ran = subprocess.run([VLLM_PYTHON, "-c", script], capture_output=True, text=True, timeout=300, env={"NUMBA_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert ran.stdout.splitlines()[-1] == "['FunctionCache', 'FunctionCache', 'NullCache'] True", ran.stdout + ran.stderr
