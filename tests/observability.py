"""The Prometheus tools the tests run for real: Debian's promtool and prometheus, and
prometheus-alertmanager's amtool and daemon, installed by scripts/test (scripts/setup.sh: from Debian's
packages into the lab's cache, no service started), or found on PATH; and their text format read
back."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.net import free_port

CACHE = Path(os.environ.get("SPARKLAB_CACHE", "/var/cache/sparklab"))


PACKAGES = {"promtool": "prometheus", "prometheus": "prometheus", "amtool": "prometheus-alertmanager",
            "prometheus-alertmanager": "prometheus-alertmanager"}


def tool(name: str) -> str:
    """The path of ``name`` (one of PACKAGES): on PATH, else the one scripts/test
    unpacked (prometheus-*/ and prometheus-alertmanager-*/ in the cache)."""
    found = shutil.which(name) or next((str(path) for path in sorted(CACHE.glob(f"prometheus-*/bin/{name}")) if os.access(path, os.X_OK)),
                                       None)
    assert found, (f"no {name} here: run scripts/test once as root (it unpacks Debian's {PACKAGES[name]} into {CACHE}), "
                   f"or apt-get install {PACKAGES[name]}")
    return found


def promtool(*args: str, stdin: str | None = None, cwd: Path | None = None) -> str:
    """Run promtool; its output, or the test fails with it."""
    done = subprocess.run([tool("promtool"), *args], input=stdin, capture_output=True, text=True, cwd=cwd, timeout=120)
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def amtool(*args: str) -> str:
    """Run amtool; what it printed on stdout (its warnings go to stderr), or the test fails with both."""
    done = subprocess.run([tool("amtool"), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"amtool {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@contextmanager
def alertmanager(config: Path, data: Path) -> Iterator[str]:
    """A real Alertmanager on loopback with ``config``, its state in ``data`` and no cluster
    listener, as the deploy runs it; its URL once it says it is ready."""
    port = free_port()
    process = subprocess.Popen([tool("prometheus-alertmanager"), f"--config.file={config}", f"--storage.path={data}",
                                f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2):
                    break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, f"Alertmanager did not start: {process.stderr.read()}"
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def samples(text: str) -> dict[str, float]:
    """Prometheus's text format: each series, as written, to its value."""
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line and not line.startswith("#")}
