"""The front door's counts per client (files/door/counts.lua) in front of a real vLLM: the rendered
door, run by the real HAProxy (tests/programs/door.py), counts for each client the tokens vLLM's
own answers report, in each API the agents use (chat completions, completions, the Responses API
of Codex, the Messages API of Claude Code), streamed or not; a stream that asked for no usage is
counted as such."""

from __future__ import annotations

import json

import pytest
import requests

from tests.net import free_port
from tests.programs.door import of_client, per_client, running_door
from tests.serving.conftest import API_KEY

pytestmark = pytest.mark.end_to_end  # a real vLLM and HAProxy, each set up by scripts/test as root

KEYS = {"laptop": "l" * 43, "phone": "p" * 43}
ASK = "Say something about the sea."


def used(response: requests.Response) -> tuple[int, int]:
    """(prompt, completion) tokens as vLLM reported them in the answer: its JSON's usage, or in a
    stream the last value of each field (Anthropic's input tokens come first, output tokens last)."""
    if not response.headers["content-type"].startswith("text/event-stream"):
        usage = response.json()["usage"]
        return usage.get("prompt_tokens", usage.get("input_tokens")), usage.get("completion_tokens", usage.get("output_tokens"))
    prompt = completion = None
    for line in response.text.splitlines():
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[6:])
        for usage in (event.get("usage"), event.get("message", {}).get("usage"), (event.get("response") or {}).get("usage")):
            if usage:
                prompt = usage.get("prompt_tokens", usage.get("input_tokens", prompt))
                completion = usage.get("completion_tokens", usage.get("output_tokens", completion))
    return prompt, completion


def test_the_door_counts_the_tokens_vllm_reports_for_each_client(vllm_server, tmp_path):
    ports = {"api_port": free_port(), "vllm_port": int(vllm_server.rsplit(":", 1)[1]), "door_metrics_port": free_port()}
    url, metrics = f"http://127.0.0.1:{ports['api_port']}", f"http://127.0.0.1:{ports['door_metrics_port']}"
    chat = {"model": "tiny", "messages": [{"role": "user", "content": ASK}], "max_tokens": 8}
    asked = [
        ("laptop", "/v1/chat/completions", chat),
        ("laptop", "/v1/chat/completions", {**chat, "stream": True, "stream_options": {"include_usage": True}}),
        ("laptop", "/v1/completions", {"model": "tiny", "prompt": ASK, "max_tokens": 8}),
        ("laptop", "/v1/responses", {"model": "tiny", "input": ASK, "max_output_tokens": 16, "stream": True}),
        ("laptop", "/v1/messages", {**chat, "stream": True}),
        ("phone", "/v1/messages", chat),
        ("phone", "/v1/chat/completions", {**chat, "stream": True}),  # no usage asked for: not counted
    ]
    with running_door(tmp_path, ports, API_KEY, KEYS):
        assert per_client(metrics) == {**of_client("deploy"), **of_client("laptop"), **of_client("phone")}
        totals = {name: [0, 0] for name in KEYS}
        for name, path, body in asked:
            header = {"x-api-key": KEYS[name]} if path == "/v1/messages" else {"Authorization": f"Bearer {KEYS[name]}"}
            response = requests.post(url + path, json=body, headers=header, timeout=120)
            assert response.status_code == 200, (path, response.text)
            prompt, completion = used(response)
            if body.get("stream") and path == "/v1/chat/completions" and "stream_options" not in body:
                assert (prompt, completion) == (None, None)
                continue
            assert prompt and completion, (path, response.text[-2000:])
            totals[name][0] += prompt
            totals[name][1] += completion
        counted = per_client(metrics)
    print(json.dumps(totals))
    assert counted == {**of_client("deploy"), **of_client("laptop", {"2xx": 5}, *totals["laptop"]),
                       **of_client("phone", {"2xx": 2}, *totals["phone"], without_usage=1)}
