"""The serving benchmark client's own overhead: the harness against a local server that
streams OpenAI-style chunks with no model behind them, so every second measured is the
client's (and loopback's). Prints figures; judge the serving numbers against them.

    python -m bench.client_overhead [--streams 32] [--groups 5] [--tokens 256]
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import click

from bench import cli
from bench.endpoint import Endpoint
from bench.load import run_groups
from bench.prompts import rough_prompt


class InstantStream(BaseHTTPRequestHandler):
    """Answers /v1/chat/completions with max_tokens one-token chunks, then usage, at once."""

    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        tokens = body["max_tokens"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for index in range(tokens):
            self.chunk({"choices": [{"index": 0, "delta": {"content": f" t{index}"}}]})
        self.chunk({"choices": [], "usage": {"prompt_tokens": 1000, "completion_tokens": tokens, "total_tokens": 1000 + tokens}})
        self.write(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def chunk(self, payload: dict) -> None:
        self.write(b"data: " + json.dumps(payload).encode() + b"\n\n")

    def write(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default 5 resets connections when 32 arrive at once


@click.command()
@click.option("--streams", type=cli.count(cli.MAX_CONCURRENCY), default=32, show_default=True, help="Concurrent requests per group.")
@click.option("--groups", type=cli.count(1000), default=5, show_default=True)
@click.option("--tokens", type=cli.count(65536), default=256, show_default=True, help="Streamed tokens per request.")
def main(streams: int, groups: int, tokens: int) -> None:
    """Measure what the client itself costs at STREAMS concurrent streams."""
    server = Server(("127.0.0.1", 0), InstantStream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = Endpoint(f"http://127.0.0.1:{server.server_address[1]}", "instant")
    prompt = rough_prompt(1000)
    cpu, wall = time.process_time(), time.perf_counter()
    results, group_results = run_groups(endpoint, prompt, streams, groups, tokens, True)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    server.shutdown()
    errors = [r.error for r in results if r.error]
    if errors:
        raise click.ClickException(f"{len(errors)} requests failed: {errors[0]}")
    total = sum(r.completion_tokens for r in results)
    ttft = sorted(r.ttft_s for r in results)
    click.echo(f"{streams} streams x {groups} groups x {tokens} tokens against an instant local server:")
    click.echo(f"  client ceiling        {total / wall:10.0f} tok/s aggregate (no model: this is the client's limit)")
    click.echo(f"  process CPU           {cpu / total * 1e6:10.1f} us per token ({cpu:.2f} s for {total} tokens, the stub server included)")
    click.echo(f"  TTFT added, p50/p95   {ttft[len(ttft) // 2] * 1e3:6.1f} / {ttft[int(len(ttft) * 0.95)] * 1e3:.1f} ms")
    click.echo(f"  group span, mean      {sum(g['seconds'] for g in group_results) / len(group_results) * 1e3:10.1f} ms")


if __name__ == "__main__":
    main()
