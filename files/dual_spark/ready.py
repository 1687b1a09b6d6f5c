"""Do clients get tokens through the front door? health's one-token probe through the door
(--url), which holds it while vLLM restarts; when no token came, the engine's counters before and
after are read from vLLM itself behind the door (--backend), to say busy or hung as health says
it. Read through the door, each would be held too: a vLLM that is down kept the probe 20 s more.
Prints health's JSON line (never the key); exits 0 when a token came back.

    ready --url http://127.0.0.1:8888 --backend http://127.0.0.1:8889 --key-file FILE [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .health import busy, engine_state, probe
from .secret import KEY_FIX, SecretError, read_secret


def reading(url: str, backend: str, key: str, timeout: float) -> dict:
    """health's reading of the door, its busy read behind it."""
    before = engine_state(backend)
    found = probe(url, key, timeout)
    if not found["ok"]:
        found["busy"] = busy(before, engine_state(backend))
    return found


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the front door")
    parser.add_argument("--backend", required=True, help="vLLM itself, behind the door")
    parser.add_argument("--key-file", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=30, help="seconds for each request")
    args = parser.parse_args(argv)
    try:
        key = read_secret(args.key_file, "the API key file", KEY_FIX)
    except SecretError as error:
        sys.exit(f"ready: {error}")
    found = reading(args.url.rstrip("/"), args.backend.rstrip("/"), key, args.timeout)
    print(json.dumps(found))
    sys.exit(0 if found["ok"] else 1)
