"""Host-side process helpers: pid files, commands, and running a command inside a node."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def run(*args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, text=True, **kwargs)


def quiet(*args: str) -> None:
    subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pid_alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
        return True
    except (OSError, ValueError):
        return False


def kill_pid_file(pid_file: Path) -> None:
    """SIGKILL the process group a pid file names (a node: its whole PID namespace ends)."""
    if pid_alive(pid_file):
        os.killpg(int(pid_file.read_text()), signal.SIGKILL)
    pid_file.unlink(missing_ok=True)


def in_node(node_dir: Path, *command: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Run a command inside a running node: its namespaces, root and working directory."""
    pid = (node_dir / "init.pid").read_text().strip()
    return run("nsenter", "-t", pid, "-m", "-u", "-i", "-n", "-p", "-r", "-w", "--", *command, check=check, **kwargs)
