"""python -m lab up|down|status (as root): the two-node lab from the command line."""

from contextlib import contextmanager

import click

from lab.config import CABLE_LAYOUTS, LOCK_FILE
from lab.core import Lab
from lab.lock import LabBusy, LabLock


@click.group()
def cli() -> None:
    """Two emulated DGX Sparks in network namespaces (needs root)."""


@cli.command()
@click.option("--cable", type=click.Choice(sorted(CABLE_LAYOUTS)), default="f0", show_default=True,
              help="Which QSFP port the cable is in: f0 or f1 netdevs come up.")
def up(cable: str) -> None:
    """Both nodes fresh from the factory state; prints the site file to use."""
    with _held():
        click.echo(Lab(cable).up())


@cli.command()
def down() -> None:
    """Remove both nodes and everything they used (idempotent)."""
    with _held():
        Lab().down()


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
