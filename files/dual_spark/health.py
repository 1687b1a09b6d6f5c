"""Is the multi-node vLLM serving? Generates one token through the API with its key: `/health`
answers 200 for minutes after a worker died, so only a generated token proves every rank
works. Prints one JSON line (never the key); exits 0 when a token came back. When none did while
the engine finished steps on requests running or waiting, the line says it is busy (a long
request holds a profile that serves one at a time), not hung. With --metrics it
also reads vLLM's /metrics: the speculative-decoding counters since the start (None where the
profile does not speculate) and the requests running and waiting.

    health --url http://127.0.0.1:8888 --key-file FILE [--wait SECONDS] [--timeout SECONDS] [--metrics]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from .secret import KEY_FIX, SecretError, read_secret

COUNTERS = {"vllm:spec_decode_num_drafts_total": "drafts", "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
            "vllm:spec_decode_num_accepted_tokens_total": "accepted"}
GAUGES = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting"}


PROGRESS = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total")
WAITING = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def engine_state(url: str) -> dict[str, float] | None:
    """PROGRESS from /metrics, each summed over its engines; None when it does not answer. vLLM
    sets them from each step the engine finishes, so any change is a finished step: a chunk of a
    prefill moves the KV cache's use, a token the counters. A frozen step changes none."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return None
    state = dict.fromkeys(PROGRESS, 0.0)
    for line in text.splitlines():
        name = line.partition("{")[0].partition(" ")[0]
        if name in state:
            try:
                state[name] += float(line.rsplit(" ", 1)[-1])
            except ValueError:
                continue
    return state


def call(url: str, key: str, path: str, body: dict | None, timeout: float) -> tuple[int, dict]:
    request = urllib.request.Request(url + path, data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        try:
            detail = json.loads(error.read() or b"{}")
        except ValueError:
            detail = {}
        return error.code, detail


def probe(url: str, key: str, timeout: float) -> dict:
    reading = {"ok": False, "model": None, "max_model_len": None, "status": None, "error": None, "busy": None}
    try:
        status, models = call(url, key, "/v1/models", None, timeout)
        reading["status"] = status
        if status != 200:
            reading["error"] = f"/v1/models answered {status}" + (": the API key is not the one on the head" if status == 401 else "")
            return reading
        served = models["data"][0]
        reading.update(model=served["id"], max_model_len=served.get("max_model_len"))
        status, completion = call(url, key, "/v1/completions", {"model": served["id"], "prompt": "ok", "max_tokens": 1,
                                                                  "temperature": 0}, timeout)
        reading["status"] = status
        if status == 200 and completion.get("usage", {}).get("completion_tokens", 0) >= 1:
            reading["ok"] = True
        else:
            message = completion.get("error", {}).get("message") if isinstance(completion.get("error"), dict) else completion.get("message")
            reading["error"] = f"generating one token failed with {status}: {str(message or completion)[:200]}"
    except (OSError, ValueError, KeyError, IndexError) as error:
        reading["error"] = f"no answer at {url}: {error}"
    return reading


def metrics(url: str, timeout: float) -> dict | None:
    """The counters and gauges above, summed over their label sets, from Prometheus text."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=timeout) as response:
            text = response.read().decode()
    except OSError:
        return None
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, value = line.partition("{")[0].partition(" ")[0], line.rsplit(" ", 1)[-1]
        wanted = COUNTERS.get(name) or GAUGES.get(name)
        if wanted:
            try:
                found[wanted] = found.get(wanted, 0) + float(value)
            except ValueError:
                continue
    spec = {key: int(found[key]) for key in COUNTERS.values() if key in found}
    return {"spec": spec if len(spec) == len(COUNTERS) else None,
            **{key: int(found[key]) if key in found else None for key in GAUGES.values()}}


def busy(before: dict | None, after: dict | None) -> dict | None:
    """What the engine was working on while the probe got no token: requests running or waiting,
    and a step finished meanwhile (busy, not hung); None when it did not move."""
    if before is None or after is None or before == after or not sum(after[name] for name in WAITING):
        return None
    return {"running": int(after["vllm:num_requests_running"]), "waiting": int(after["vllm:num_requests_waiting"])}


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8888")
    parser.add_argument("--key-file", type=Path, required=True)
    parser.add_argument("--wait", type=float, default=0, help="keep trying this many seconds")
    parser.add_argument("--timeout", type=float, default=30, help="seconds for each request")
    parser.add_argument("--metrics", action="store_true", help="also read /metrics")
    args = parser.parse_args(argv)
    try:
        key = read_secret(args.key_file, "the API key file", KEY_FIX)
    except SecretError as error:
        sys.exit(f"health: {error}")
    url, started = args.url.rstrip("/"), time.monotonic()
    while True:
        before = engine_state(url)
        reading = probe(url, key, args.timeout)
        if not reading["ok"]:
            reading["busy"] = busy(before, engine_state(url))
        if reading["ok"] or time.monotonic() - started >= args.wait:
            break
        time.sleep(2)
    reading["seconds"] = round(time.monotonic() - started, 1)
    if args.metrics:
        reading["metrics"] = metrics(args.url.rstrip("/"), args.timeout)
    print(json.dumps(reading))
    sys.exit(0 if reading["ok"] else 1)

