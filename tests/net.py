"""Network helpers the tests share."""

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests


class QuietServer(ThreadingHTTPServer):
    """A test's HTTP server that prints nothing when a client hangs up (a probe's timeout, by
    design). On Python 3.11 a traceback printed in a server thread parses source for its carets,
    which races an ast.parse on the test's own thread ("AST constructor recursion depth
    mismatch"); any other error is still printed."""

    daemon_threads = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def free_port() -> int:
    """A TCP port nothing listens on now, on any address. Tests bind one port on several loopback
    addresses (a head's and its workers'), and a port free on 127.0.0.1 may be held on 127.0.0.2
    by a test in another process; the wildcard bind is refused while any address holds it."""
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        return probe.getsockname()[1]


def wait_ready(process: subprocess.Popen, url: str, log: Path, timeout: float) -> None:
    """Until ``url`` answers 200; fails the test with the end of ``log`` when ``process`` exits
    first or the time is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{process.args[0]} exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    pytest.fail(f"nothing answered {url} in {timeout} s:\n{log.read_text()[-4000:]}")


@contextmanager
def json_server(answer: Callable[[str], dict]) -> Iterator[str]:
    """A loopback HTTP server that answers each GET with ``answer(path)`` as JSON; its base URL."""
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body = json.dumps(answer(self.path)).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = QuietServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
