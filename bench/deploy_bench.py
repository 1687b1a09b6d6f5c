"""How long the deploy takes on the lab, against the floor of connecting to both nodes and
reading one fact, and how many remote commands a no-op run and a --dry run send per node.

    sudo .venv/bin/python -m bench.deploy_bench [--runs 5] [--keep-lab]

Prints, measured in one run on a fresh lab: the fresh converge, the floor and the no-op
converge (medians of --runs, taken in alternation), their ratio (goal: at most 2), and the
remote commands of one no-op run per node (goal: at most 20) and of one --dry run.
"""

from __future__ import annotations

import collections
import json
import os
import re
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import click

from bench import cli
from lab.config import LAB_DIR
from lab.core import Lab
from lab.lock import LabBusy, LabLock

REPO = Path(__file__).resolve().parents[1]
PYINFRA = Path(sys.executable).parent / "pyinfra"
RATIO_GOAL, COMMANDS_GOAL = 2.0, 20


def timed(*args: str) -> tuple[float, str]:
    """pyinfra with ``args``: its time and output. -y unless --dry (which, with -y, skips change
    detection and reads nothing)."""
    started = time.monotonic()
    result = subprocess.run(
        [str(PYINFRA), *(() if "--dry" in args else ("-y",)), *args], cwd=REPO, stdin=subprocess.DEVNULL,
        env={**os.environ, "DUAL_SPARK_SITE": str(LAB_DIR / "site.toml")},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        raise click.ClickException(f"pyinfra {' '.join(args)} failed:\n{result.stdout[-3000:]}")
    return elapsed, result.stdout


def remote_commands(verbose_output: str) -> collections.Counter:
    """Commands pyinfra sent, per host, from its -vv input echo ("[host] >>> command")."""
    return collections.Counter(re.findall(r"^\s*\[([^\]]+)\]\s+>>> ", verbose_output, flags=re.M))


@click.command()
@click.option("--runs", type=cli.count(100), default=5, show_default=True, help="Floor and no-op runs, each, to take the medians of.")
@click.option("--keep-lab", is_flag=True, help="Leave the lab up afterwards.")
@click.option("--out", "out_dir", default="bench/results", show_default=True, type=cli.OutputDir())
def main(runs: int, keep_lab: bool, out_dir: Path) -> None:
    """Measure the deploy's fresh and no-op converge against the connect-and-one-fact floor."""
    try:
        lock = LabLock().__enter__()
    except LabBusy as error:
        raise click.ClickException(str(error)) from None
    lab = Lab()
    try:
        lab.up()
        fresh, _ = timed("inventory.py", "deploy.py")
        floor, noop = [], []
        for _ in range(runs):
            floor.append(timed("inventory.py", "fact", "server.Hostname")[0])
            noop.append(timed("inventory.py", "deploy.py")[0])
        _, verbose = timed("-vv", "inventory.py", "deploy.py")
        _, dry = timed("-vv", "--dry", "inventory.py", "deploy.py")
    finally:
        if not keep_lab:
            lab.down()
        lock.__exit__()
    commands, dry_commands = remote_commands(verbose), remote_commands(dry)
    record = {
        "started": datetime.now(UTC).isoformat(), "runs": runs, "fresh_converge_s": fresh,
        "floor_s": statistics.median(floor), "noop_converge_s": statistics.median(noop),
        "ratio": statistics.median(noop) / statistics.median(floor), "noop_commands": dict(commands), "dry_commands": dict(dry_commands),
    }
    click.echo(f"{'fresh converge + verification':<36}{fresh:8.2f} s")
    click.echo(f"{'floor: connect + one fact':<36}{record['floor_s']:8.2f} s  (median of {runs})")
    click.echo(f"{'no-op converge + verification':<36}{record['noop_converge_s']:8.2f} s  (median of {runs})")
    click.echo(f"{'ratio no-op / floor':<36}{record['ratio']:8.2f}    (goal: at most {RATIO_GOAL:g})")
    click.echo(f"{'remote commands, no-op run':<36}{sum(commands.values()):8d}    "
               + ", ".join(f"{host} {count}" for host, count in sorted(commands.items()))
               + f"  (goal: at most {COMMANDS_GOAL} per node)")
    click.echo(f"{'remote commands, --dry':<36}{sum(dry_commands.values()):8d}    "
               + ", ".join(f"{host} {count}" for host, count in sorted(dry_commands.items())))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"deploy-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(record, indent=2))
    click.echo(f"--> raw results: {path}")


if __name__ == "__main__":
    main()
