"""Do clients get tokens through the front door? vLLM itself behind it (--backend) is asked
first: where it does not answer, the line says so at once, instead of asking the door, which holds
a request while vLLM restarts (minutes on a Spark) and would keep the probe that long. Where it
answers, health's one-token probe through the door (--url), busy or hung said as health says it.
Prints health's JSON line (never the key); exits 0 when a token came back.

    ready --url http://127.0.0.1:8888 --backend http://127.0.0.1:8889 --key-file FILE [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .health import busy, call, engine_state, probe
from .secret import KEY_FIX, SecretError, read_secret


def backend_down(backend: str, key: str, timeout: float) -> str | None:
    """Why vLLM behind the door does not answer at ``backend`` (nothing listens, or it hangs up);
    None when it answers at all: whether it serves is then the probe's to say, through the door."""
    try:
        call(backend, key, "/v1/models", None, timeout)
    except (OSError, ValueError) as error:
        return f"vLLM does not answer behind the front door at {backend} ({error}): it restarts or is down; the door holds clients' requests meanwhile"
    return None


def reading(url: str, backend: str, key: str, timeout: float) -> dict:
    """health's reading of the door, or of vLLM down behind it."""
    down = backend_down(backend, key, timeout)
    if down:
        return {"ok": False, "model": None, "max_model_len": None, "status": None, "error": down, "busy": None}
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
