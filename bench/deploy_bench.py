"""How long the deploy takes on the lab, and how many remote commands a no-op run sends.

    sudo .venv/bin/python -m bench.deploy_bench [--runs 3] [--keep-lab]

Prints: lab start seconds, fresh-converge seconds, no-op-converge seconds (median of --runs)
and the remote commands of one no-op run, per host and in total.
"""

from __future__ import annotations

import collections
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click

from tests.lab.lab import LAB_DIR, Lab

REPO = Path(__file__).resolve().parents[1]
PYINFRA = Path(sys.executable).parent / "pyinfra"


def timed_deploy(*args: str) -> tuple[float, str]:
    started = time.monotonic()
    result = subprocess.run(
        [str(PYINFRA), "-y", *args, "inventory.py", "deploy.py"], cwd=REPO, stdin=subprocess.DEVNULL,
        env={**os.environ, "DUAL_SPARK_SITE": str(LAB_DIR / "site.toml")},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        raise click.ClickException(f"deploy failed:\n{result.stdout[-3000:]}")
    return elapsed, result.stdout


def remote_commands(verbose_output: str) -> collections.Counter:
    """Commands pyinfra sent, per host, from its -vv input echo ("[host] >>> command")."""
    return collections.Counter(re.findall(r"^\[([^\]]+)\]\s+>>> ", verbose_output, flags=re.M))


@click.command()
@click.option("--runs", default=3, show_default=True, help="No-op runs to take the median of.")
@click.option("--keep-lab", is_flag=True, help="Leave the lab up afterwards.")
def main(runs: int, keep_lab: bool) -> None:
    lab = Lab()
    lab.down()
    started = time.monotonic()
    lab.up()
    lab_seconds = time.monotonic() - started
    try:
        fresh, _ = timed_deploy()
        noop = [timed_deploy()[0] for _ in range(runs)]
        _, verbose = timed_deploy("-vv")
    finally:
        if not keep_lab:
            lab.down()
    commands = remote_commands(verbose)
    click.echo(f"{'lab start (cached image)':<34}{lab_seconds:8.2f} s")
    click.echo(f"{'fresh converge + verification':<34}{fresh:8.2f} s")
    click.echo(f"{'no-op converge + verification':<34}{statistics.median(noop):8.2f} s  (median of {runs})")
    click.echo(f"{'remote commands, no-op run':<34}{sum(commands.values()):8d}    "
               + ", ".join(f"{host} {count}" for host, count in sorted(commands.items())))


if __name__ == "__main__":
    main()
