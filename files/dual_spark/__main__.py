"""python3 dual-spark.pyz PROGRAM [ARGS...], PROGRAM one of:

    sync      the model hashed on the head and replicated down the chain of ranks, verified
    fetch     the model fetched from the Hugging Face hub (inside the runtime image)
    progress  progress lines of a long step: a counting pipe, a command watched
    health    does the API generate a token (and vLLM's metrics)
    ready     do clients get a token through the front door (vLLM down behind it said at once)
    canary    are the API's answers still right: the canary set after a change
    answers   are they still the recorded ones while it serves: the watched canaries, again and again
    watchdog  beside vLLM in each container: ends it when this side can no longer serve
    metrics   the node exporter's textfile of Spark metrics; the head's Prometheus read back
    stack     the states that served: one recorded, one restored and started
    smoke     a runtime image's smoke test on this node: `import vllm`, its result recorded
    door      the front door's side of a planned stop: vLLM drained, stopped, made ready
    planned   a deploy's planned work marked on the head while it stops or restarts serving
    silence   that planned work as a silence in the head's Alertmanager
    peers     a command on another node over the fabric, or on several at the same time
    image     a runtime image sent to the next node down the chain of ranks
    own       the deploy's own directories: claimed, guarded, a model entry or caches made, secrets sealed

`PROGRAM --help` tells each one's arguments.
"""

from __future__ import annotations

import importlib
import os
import sys

PROGRAMS = {"sync": "sync.cli", "fetch": "fetch", "progress": "progress", "health": "health", "ready": "ready", "canary": "canary", "answers": "answers", "watchdog": "watchdog", "metrics": "metrics",
            "stack": "stack", "smoke": "smoke", "door": "door",
            "planned": "planned", "silence": "silence", "peers": "peers", "image": "image", "own": "own"}


def main() -> None:
    """Run the program named first: only its module is imported."""
    name, *argv = sys.argv[1:] or [""]
    if name not in PROGRAMS:
        print(__doc__, file=sys.stdout if name in ("-h", "--help") else sys.stderr)
        sys.exit(0 if name in ("-h", "--help") else 2)
    program = importlib.import_module(f"{__package__}.{PROGRAMS[name]}")
    program.main(argv, prog=f"{os.path.basename(sys.argv[0])} {name}")


if __name__ == "__main__":
    main()
