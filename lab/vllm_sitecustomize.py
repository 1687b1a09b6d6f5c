"""The lab's CPU vLLM only: scripts/setup-vllm.sh installs this file as the `sitecustomize` of
that environment, so every Python it runs (vLLM's API server, engine and workers, in the nodes'
containers and on loopback) holds the cyclic garbage collector through its start-up, then
collects as usual. A lab vLLM start is mostly its processes importing torch, transformers and
vLLM, which allocate millions of objects the collector walks again and again: holding it took a
start's CPU from 41 to 36 s here (docs/lab.md). Nothing of a Spark's image is changed by it."""

import gc
import threading

START_UP = 240  # seconds: a four-node lab's start on two busy cores, and some room

gc.disable()
_collect_again = threading.Timer(START_UP, gc.enable)
_collect_again.name = "sparklab-gc-held"
_collect_again.daemon = True
_collect_again.start()
