"""The front door as the deploy renders it (templates/door/, files/door/), run by the real HAProxy
with the door program's keys (files/dual_spark/door.py), as an ordinary user: the rendered
configuration loses only what needs root (its user, group and chroot), and its socket and maps
move from /run and /etc to beside it. tests/programs/test_door.py runs it in front of a backend
that answers as vLLM does; tests/serving in front of a real vLLM."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from layout import DOOR
from operations.door import door_settings
from tests.fake_host import site
from tests.observability import samples
from tests.programs import ARCHIVE


def door_program(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ARCHIVE), "door", *args], capture_output=True, text=True, timeout=60)


def write_keys(directory: Path, socket: str | None = None) -> subprocess.CompletedProcess:
    """The door's maps from the key files in ``directory`` (api-key, clients/NAME.key), as the
    deploy writes them; with ``socket``, into the door running there too."""
    return door_program("keys", "--deploy-key", str(directory / "api-key"), "--clients", str(directory / "clients"),
                        "--map", str(directory / "clients.map"), "--backend-map", str(directory / "backend.map"),
                        *(["--socket", socket] if socket else []))


@contextmanager
def running_door(directory: Path, settings: dict, deploy_key: str, clients: dict[str, str], lapse: int | None = None) -> Iterator[str]:
    """The door of a pair with ``settings`` (ports, bounds) and ``clients`` (name -> key) in its
    site, the deploy's own key ``deploy_key``, run from ``directory``; yields its socket's path.
    With ``lapse``, a drain no one ends lapses after that many seconds, not the change's time."""
    socket = directory / "door.sock"
    (directory / "api-key").write_text(deploy_key + "\n")
    (directory / "clients").mkdir()
    for name, key in clients.items():
        (directory / f"clients/{name}.key").write_text(key + "\n")
    assert write_keys(directory).returncode == 0
    files = door_settings(site("pair", settings, {"client": {name: {} for name in clients}})).files
    config = files[f"{DOOR['dir']}/haproxy.cfg"].replace(DOOR["socket"], str(socket))
    for name in ("clients_map", "backend_map"):
        config = config.replace(DOOR[name], str(directory / Path(DOOR[name]).name))
    if lapse is not None:
        [line] = [line for line in config.splitlines() if line.strip().startswith("setenv DUAL_SPARK_GATE_LAPSE ")]
        config = config.replace(line, f"    setenv DUAL_SPARK_GATE_LAPSE {lapse}")
    kept = [line for line in config.splitlines() if line.strip().split(" ")[0] not in ("user", "group", "chroot")]
    assert len(config.splitlines()) - len(kept) == 3
    (directory / "haproxy.cfg").write_text("\n".join(kept) + "\n")
    for name in DOOR["files"]:
        if name.endswith(".lua"):
            (directory / name).write_text(files[f"{DOOR['dir']}/{name}"])
    subprocess.run(["haproxy", "-c", "-q", "-C", str(directory), "-f", "haproxy.cfg"], check=True)
    haproxy = subprocess.Popen(["haproxy", "-db", "-C", str(directory), "-f", "haproxy.cfg"], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not socket.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        yield str(socket)
    finally:
        haproxy.kill()
        haproxy.wait()


def counts_text(metrics: str) -> str:
    """The door's own counts (counts.lua) from its metrics frontend at ``metrics`` (http://host:port)."""
    return urllib.request.urlopen(metrics + DOOR["counts_path"], timeout=10).read().decode()


def counts(metrics: str) -> dict[str, float]:
    """The door's own counts: each series, as written, to its value."""
    return samples(counts_text(metrics))


def of_client(name: str, answers: dict | None = None, prompt: int = 0, completion: int = 0, without_usage: int = 0) -> dict[str, float]:
    """A client's series as the door counts them: its answers by class, its tokens."""
    series = {f'dual_spark_door_client_requests_total{{client="{name}",code="{code}"}}': (answers or {}).get(code, 0)
              for code in ("1xx", "2xx", "3xx", "4xx", "5xx", "other")}
    return {**series, f'dual_spark_door_client_prompt_tokens_total{{client="{name}"}}': prompt,
            f'dual_spark_door_client_completion_tokens_total{{client="{name}"}}': completion,
            f'dual_spark_door_client_answers_without_usage_total{{client="{name}"}}': without_usage}


def per_client(metrics: str) -> dict[str, float]:
    return {series: value for series, value in counts(metrics).items() if "client=" in series}
