"""python -m lab up|down|status (as root): the lab from the command line (two nodes by default)."""

from contextlib import contextmanager

import click

from lab.config import CABLE_LAYOUTS, LOCK_FILE, TOPOLOGIES
from lab.core import Lab
from lab.lock import LabBusy, LabLock


@click.group()
def cli() -> None:
    """Emulated DGX Sparks in network namespaces (needs root)."""


@cli.command()
@click.option("--cable", type=click.Choice(sorted(CABLE_LAYOUTS)), default="f0", show_default=True,
              help="Which QSFP port the cable is in: f0 or f1 netdevs come up.")
@click.option("--nodes", type=click.IntRange(min=2), default=2, show_default=True,
              help="How many Sparks: the head, then spark-worker (two) or spark-worker1.. (more).")
@click.option("--topology", type=click.Choice(TOPOLOGIES), default="direct", show_default=True,
              help="direct: two nodes, one cable; switch: every node's cable into a switch (a bridge per rail).")
def up(cable: str, nodes: int, topology: str) -> None:
    """Every node fresh from the factory state; prints the site file to use."""
    try:
        lab = Lab(cable, nodes, topology)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None
    with _held():
        click.echo(lab.up())


@cli.command()
def down() -> None:
    """Remove the lab that is up, every node and everything they used (idempotent)."""
    with _held():
        Lab.current().down()


@cli.command()
def status() -> None:
    """Whether each node is up, and who holds the lab."""
    for name, state in Lab.status().items():
        click.echo(f"{name}: {state}")
    holder = LOCK_FILE.read_text().strip() if LOCK_FILE.exists() else ""
    click.echo(f"held by {holder}" if holder else "not held")


@contextmanager
def _held():
    """Hold the lab for one command; a busy lab is a clear error naming its holder."""
    lock = LabLock()
    try:
        lock.__enter__()
    except LabBusy as error:
        raise click.ClickException(str(error)) from None
    try:
        yield
    finally:
        lock.__exit__()


if __name__ == "__main__":
    cli()
