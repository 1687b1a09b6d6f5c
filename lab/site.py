"""The site file of the lab: what a user of its nodes would write. It names the f0 netdevs
whichever port the cable is in (--cable f1 is the user's cable in the other port). The pair's
nodes carry their role; a larger lab's are listed in rank order (the head first) with
topology = "switch", rail i of the node of rank r at 10.0.i.(r+1)/24.

Everything that differs from a Spark is a setting here, never a branch in the product: no GPU
and no InfiniBand devices for the containers, the memlock and open-files ceilings this machine
allows, the CPU vLLM environment mounted into the containers, the tiny model already on the
head's disk, a runtime image built from the lab's Debian root file system, and CPU values for
each published profile (same names, same number of sequences, the tiny model's 65,536-token
window: room for Claude Code's 32,000 output tokens on top of its prompt), and canaries of its
length and checks. The tiny model is
served with vLLM's `hermes` tool-call parser, so the agents' requests with tools are taken.
A second image, lab-cpu-older, reads as a vLLM without dynamic speculation (lab/older_vllm.py);
no profile uses it, so no deploy builds it until a profile names it."""

from __future__ import annotations

import resource
from pathlib import Path

from lab.config import (
    CABLE_LAYOUTS,
    DEPLOY_USER,
    LAB_DIR,
    LAB_MODEL,
    METRICS_INTERVAL,
    VLLM_ARGS,
    VLLM_ENV,
    Node,
    lab_nodes,
    rdma_of,
)
from layout import IN_CONTAINER
from site_schema import toml_value

PROFILES = ("adaptive", "fast", "long-c4")
# group_data/serving.toml's canaries, at the lab's lengths (a CPU pair, probed as it serves, decodes about 8 tokens a second)
# The random model calls no tool of its own accord: the lab's tool canary forces its answer to a
# call in the form of the lab's parser (hermes) by vLLM's structured outputs, so that what the
# canary checks is the parser's reading of what vLLM generated, as on a Spark.
TOOL_CALL = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Oslo)"\}\}\n</tool_call>'
CANARIES = {"code": {"max_tokens": 12}, "fabric": {"max_tokens": 8}, "long": {"ignore_eos": True}, "perplexity": {},
            "tool": {"max_tokens": 96, "extra_body": {"structured_outputs": {"regex": TOOL_CALL}}}}
LAB_CANARY_TOKENS = 48
ANSWER_FAULT_FILE = "/tmp/sparklab-answer-fault"  # in a vLLM container's own layer
LAB_WINDOW = 65536  # the tiny model's position limit; its KV cache is 2 KiB a token


def table(name: str, values: dict) -> list[str]:
    return [f"[{name}]", *(f"{key} = {toml_value(value)}" for key, value in values.items()), ""]


def render(runtime_context: Path, shared: list[str], nodes: list[Node] | None = None, topology: str = "direct",
           older_context: Path | None = None) -> str:
    """The site file of the lab of ``nodes`` (default: the pair) in ``topology``; with the older
    image's build context, its [image.lab-cpu-older] too."""
    nodes = nodes or lab_nodes(2)
    memlock, nofile = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1], resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    lines = [
        "# The lab's site file, written by `python -m lab up`.",
        *table("ssh", {"user": DEPLOY_USER, "key": str(LAB_DIR / "id_ed25519"), "known_hosts": str(LAB_DIR / "known_hosts")}),
    ]
    for rank, node in enumerate(nodes):
        lines += ["[[node]]", *([f'role = "{node.role}"'] if topology == "direct" else []),
                  f'hostname = "{node.hostname}"', f'ssh_host = "{node.address}"', ""]
        for index, netdev in enumerate(CABLE_LAYOUTS["f0"][0]):
            lines += ["[[node.rail]]", f'netdev = "{netdev}"', f'rdma = "{rdma_of(netdev)}"',
                      f'address = "10.0.{index}.{rank + 1}/24"', ""]
    lines += table("settings", {
        **({} if topology == "direct" else {"topology": topology}),
        "container_gpus": "",
        "container_devices": [],
        # This machine withholds CAP_SYS_RESOURCE: no container may raise a limit above its ceiling.
        "container_ulimits": {"memlock": memlock, "stack": 67108864, "nofile": nofile},
        "container_mounts": shared,
        # vLLM's cache is the deploy's (state_dir/cache, per image), as on a Spark: a node's first
        # start of an image inspects the model's class in a fresh Python importing vLLM, later ones
        # read what it wrote (lab.config.VLLM_CACHE is the smoke test's and tests/serving's only).
        # The lab's fault of the answers, switched on under a running vLLM by writing this file in a
        # container (lab/vllm_sitecustomize.py); no file, no fault.
        # NUMBA_CACHE_DIR, in the deploy's cache of the image (kept across restarts): the lab's ngram
        # drafter compiles its kernels once, not at every start (lab/vllm_sitecustomize.py).
        "container_env": {**VLLM_ENV, "SPARKLAB_ANSWER_FAULT_FILE": ANSWER_FAULT_FILE, "NUMBA_CACHE_DIR": f"{IN_CONTAINER['cache']}/numba"},
        "vllm_extra_args": VLLM_ARGS,
        "speculative_method": "ngram",
        "speculative_options": {"prompt_lookup_max": 3, "prompt_lookup_min": 1},
        # The tiny model ends its chat answers; a bare completion runs on: a request that names no length gets 256 tokens.
        "generation_config": {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 256},
        "serving_ready_timeout": 300,
        "metrics_interval_seconds": METRICS_INTERVAL,
        # Two busy CPU cores, not a GB10: first tokens and tokens come seconds apart under the
        # tests' load, so the latency objectives are the lab's, as a site sets them from its own.
        "slo_ttft_seconds": 80.0,
        "slo_itl_seconds": 10.0,
        # The canaries at the lab's speed, every token of each compared (float32 on the CPU: no
        # drift between profiles to tolerate).
        "canary_long_tokens": LAB_CANARY_TOKENS,
        "canary_agree_tokens": LAB_CANARY_TOKENS,
        # The watch of the answers while it serves: a round a minute on the pair (a test asks for one
        # now by restarting it), a quarter of an hour on four nodes (TP=4 on two cores takes about
        # 13 s a request): the benchmarks' and the heals' CPU is not the watch's.
        "canary_watch_seconds": 60 if topology == "direct" else 900,
    })
    lines += table("model", {"path": LAB_MODEL, "served_name": "tiny", "tokenizer_mode": "auto",
                             "tool_call_parser": "hermes", "reasoning_parser": ""})
    for name, context in (("lab-cpu", runtime_context), ("lab-cpu-older", older_context)):
        if context is not None:
            lines += table(f"image.{name}", {"build": str(context), "kv_cache_dtypes": ["auto"], "python": "python3", "vllm": "vllm"})
    # A random model's byte tokens decode to broken UTF-8: its canaries skip the text check (a
    # Spark's model is checked for it; tests/programs/test_canary.py shows the check); the long one
    # runs its whole length, past the end token a random model may give.
    for name, values in CANARIES.items():
        greedy = name in ("code", "fabric", "long", "tool")
        lines += table(f"canary.{name}", {**values, **({"checks": ["answer", "loop", "greedy"]} if greedy else {})})
    for name in PROFILES:
        lines += table(f"profile.{name}", {"image": "lab-cpu", "kv_cache_dtype": "auto", "max_model_len": LAB_WINDOW,
                                           "gpu_memory_utilization": 0.2, "speculative_tokens": 3, "flashinfer_autotune": False,
                                           "agent_compact_tokens": LAB_WINDOW * 9 // 10})  # the clients' own 90%
    return "\n".join(lines)


def write(runtime_context: Path, shared: list[str], nodes: list[Node] | None = None, topology: str = "direct",
          older_context: Path | None = None) -> Path:
    site = LAB_DIR / "site.toml"
    site.write_text(render(runtime_context, shared, nodes, topology, older_context))
    return site
