"""What the claim of the deploy's directories says when it refuses, written once: the program on
the node (own.py) and the head's plan (operations/own.py) both say it. Each names the path, the
site fields that name it, and the fix. Pure text: no import of the package's constants, so that
the head imports it as it is."""

from __future__ import annotations

MARKER_TEXT = "Made or adopted by the dual-spark deploy, which may change what is in this directory."
OPEN_TO_OTHERS = 0o022  # a mode that lets someone other than its owner write (group or others)
SECRET_MODES = ("600", "400")  # a secret file's: read by root alone


def not_ours(path: str, fields: str, marker: str) -> str:
    return (f"{path} exists and is not the deploy's (no {marker}): name another directory in site.toml ({fields}), "
            f"or, if it is this deploy's, sudo touch {path}/{marker}")


def not_real(path: str, fields: str, what: str = "is a symbolic link, lies under one, or is not a directory") -> str:
    return (f"{path} {what}: the deploy follows no link and makes its directories itself. Name a directory of its own, "
            f"by its real path, in site.toml ({fields})")


def no_parent(parent: str, field: str, path: str) -> str:
    return (f"{parent} is not a directory here (or is a symbolic link): {field} = {path} would be made in it. "
            f"If it is a data disk, mount it (the deploy never makes the mount point of a disk on the root file system); "
            f"else create it (sudo mkdir {parent}) or name another directory in site.toml ({field})")


def foreign(path: str, user: str, mode: str, fields: str, owner: str) -> str:
    """A directory of ``user``'s with ``mode`` that someone other than root and ``owner`` can change."""
    return (f"{path} is {user}'s, mode {mode}: a user other than root and {owner} can change it, so the deploy writes "
            f"nothing there and runs nothing from it. Name a directory of the deploy's own in site.toml ({fields}), or, "
            f"if it is yours to give: sudo chown root: {path} && sudo chmod go-w {path}")


def unclaimed(path: str, field: str, owner: str, marker: str) -> str:
    return (f"{field} {path} is not a directory the deploy claimed (a real directory only root and {owner} can change, "
            f"holding their {marker}): run `pyinfra inventory.py tasks/runtime.py`, which makes and marks it")


def no_longer(path: str, owner: str) -> str:
    return f"{path} is no longer the deploy's (no marker, or a user other than root and {owner} can change it): not removed"


def secret_fix(path: str) -> str:
    return f"sudo chown root: {path} && sudo chmod 600 {path}"


def unsealed(name: str, path: str) -> str:
    return (f"container_secrets.{name} = {path} is not a regular file of root's, mode 600 or 400, in directories only root "
            f"can change: nothing was started. Fix: {secret_fix(path)} (and sudo chmod go-w on each directory above it)")
