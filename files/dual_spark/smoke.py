"""The smoke test of a runtime image on this node: `import vllm` in a throwaway container.

    smoke --tag TAG --python PYTHON --markers DIR [--mount PATH ...] [--env NAME=VALUE ...]

The container (no network, the site's mounts read-only and its environment) imports vLLM and
prints the fields of its SpeculativeConfig (the --speculative-config keys the image takes) as JSON
on its last line. When it passes, DIR/IMAGE_ID records the image's ID and, on its second line,
those fields: the same image under another tag is not tested again. When the image is not on this
node, or vLLM does not import, it says so and records nothing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from .atomic import write_atomically

# What the container runs: vLLM imports, and its SpeculativeConfig's field names, printed last.
SMOKE = ('import inspect, json, vllm; from vllm.config import SpeculativeConfig as c; '
         'print(json.dumps(sorted(getattr(c, "__dataclass_fields__", None) or inspect.signature(c).parameters)))')


def image_id(tag: str) -> str | None:
    found = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", tag], capture_output=True, text=True)
    return found.stdout.strip() or None if found.returncode == 0 else None


def smoke(tag: str, python: str, markers: Path, mounts: list[str], env: list[str]) -> str | None:
    """Test the image; None when it passed (its marker written), else why not."""
    found = image_id(tag)
    if found is None:
        return f"{tag} is not on this node: the head sends it (see its errors above)"
    run = ["docker", "run", "--rm", "--network", "none", *[arg for path in mounts for arg in ("-v", f"{path}:{path}:ro")],
           *[arg for pair in env for arg in ("-e", pair)], "--entrypoint", python, tag, "-c", SMOKE]
    done = subprocess.run(run, stdout=subprocess.PIPE, text=True)
    keys = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode != 0 or not keys.startswith("["):
        return f"vLLM does not import in {tag} (see its output above)"
    markers.mkdir(parents=True, exist_ok=True)
    write_atomically(markers / found, f"{found}\n{keys}\n")
    return None


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", required=True)
    parser.add_argument("--python", required=True, help="the image's Python")
    parser.add_argument("--markers", type=Path, required=True, help="where a passed test is recorded, one file per image ID")
    parser.add_argument("--mount", action="append", default=[], help="a host path the site mounts read-only into every container")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE the site sets in every container")
    args = parser.parse_args(argv)
    failed = smoke(args.tag, args.python, args.markers, args.mount, args.env)
    if failed:
        print(failed, file=sys.stderr)
        sys.exit(1)
