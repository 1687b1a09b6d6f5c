"""Operations run for real: a case's operation reads a scratch root (an overlay on the lab's
factory image, a Spark as it leaves the factory, entered by chroot) with its own facts, its
commands run there as root, then it reads the root again and must have nothing left to do. The
fixtures (tests/operations/) hold the commands' spelling; this holds what they do: a command that
kept its text's shape but wrote another mode, owner or place than its fact reads as done, or a
fact that stopped reading what the commands write, fails here. The case gives the site, the
settings and the readings of the other nodes.

What acts on a running system (systemd, sysctl, netplan's apply, HAProxy's and Docker's daemons)
has none in a scratch root: each case names the commands of that kind it leaves out, and the
readings of live state they would change."""

from __future__ import annotations

import copy
import importlib
import io
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pyinfra.api import FileUploadCommand, StringCommand

from lab import image
from tests.fake_host import args_key, load, run_operation

pytestmark = pytest.mark.as_root
HERE = Path(__file__).parent / "operations"

# folder/case: the commands left out (a pattern of their text) and why.
CASES = {
    "managed.managed_files/new_directory": {},
    "managed.managed_files/nested_levels_made": {},
    "managed.managed_files/helpers_new": {},
    "host_prep.user_in_group/not_member": {},
    "ssh_trust.authorized_senders/not_authorized": {},
    "ssh_trust.authorized_senders/four_nodes_first_worker": {},
    "ssh_trust.known_receivers/fresh": {},
    "ssh_trust.known_receivers/four_nodes_fresh_middle_worker": {},
    "host_prep.host_settings/fresh_ubuntu": {
        r"systemctl daemon-reexec": "systemd re-reads its own configuration: no systemd runs in a scratch root",
        r"^sysctl -w ": "the kernel's setting: the scratch root shares this machine's kernel",
    },
}
# Readings of live state, which the scratch root cannot hold: fact, field, its value before the
# commands (as on a Spark from the factory), and after them (as the left-out commands leave it).
LIVE = {"host_prep.host_settings/fresh_ubuntu": [("host_prep.HostSettings", ("sysctl",), {"value": 1, "unreadable": []},
                                                  {"value": 0, "unreadable": []})]}


@contextmanager
def scratch_root(tmp_path: Path) -> Iterator[Path]:
    """An overlay on the lab's factory image, its changes in ``tmp_path``; unmounted after."""
    for sub in ("upper", "work", "root"):
        (tmp_path / sub).mkdir()
    root = tmp_path / "root"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={image.factory_image()},upperdir={tmp_path / 'upper'},workdir={tmp_path / 'work'}", str(root)], check=True)
    try:
        yield root
    finally:
        subprocess.run(["umount", str(root)], check=True)


def in_root(root: Path, text: str) -> subprocess.CompletedProcess:
    """``text`` run by sh in ``root``, in a network namespace of its own: nothing of it reaches this
    machine's network (a reading that pings a peer finds none at once)."""
    return subprocess.run(["unshare", "--net", "chroot", str(root), "sh", "-c", text], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"})


def replayed(root: Path, commands: list, left_out: dict[str, str]) -> list[str]:
    """Each command run in ``root`` as root, an upload written where it lands; those matching a
    pattern of ``left_out`` skipped. The texts of those skipped."""
    skipped = []
    for command in commands:
        if isinstance(command, FileUploadCommand):
            source = command.src
            data = source.getvalue() if isinstance(source, io.StringIO | io.BytesIO) else Path(source).read_bytes()
            target = root / command.dest.lstrip("/")
            target.write_bytes(data.encode() if isinstance(data, str) else data)
            continue
        assert isinstance(command, StringCommand | str), f"not a command a node runs: {command!r}"
        text = command if isinstance(command, str) else command.get_raw_value()
        if any(re.search(pattern, text) for pattern in left_out):
            skipped.append(text)
            continue
        done = in_root(root, text)
        assert done.returncode == 0, f"{text}\n{done.stdout}{done.stderr}"
    return skipped


def read_back(root: Path, host, case: dict) -> dict:
    """``case`` with every reading its operation made of ``host`` made again, for real, in ``root``."""
    again = copy.deepcopy(case)
    facts = again.setdefault("facts", {}).setdefault(host.name, {})
    for key, arguments in host.read:
        fact = host.classes[key]()
        output = in_root(root, fact.command(**arguments).get_raw_value())
        reading = fact.process(output.stdout.splitlines())
        if key == "node.NodeState":  # each reading of the one round trip, as the fixture keeps it
            for (name, its), found in zip(arguments["readings"], reading["readings"]):
                facts.setdefault(name, {})[args_key(its)] = found
        else:
            facts.setdefault(key, {})[args_key(arguments)] = reading
    return again


def live_state(case: dict, host: str, name: str, after: bool) -> dict:
    """``case`` with the readings of live state LIVE names set as before the commands, or ``after`` them."""
    for key, path, before, later in LIVE.get(name, []):
        for reading in case["facts"][host][key].values():
            *parents, last = path
            for part in parents:
                reading = reading[part]
            reading[last] = copy.deepcopy(later if after else before)
    return case


@pytest.mark.parametrize("name", CASES)
def test_an_operation_run_on_a_factory_root_then_has_nothing_left_to_do(name, tmp_path):
    folder, _, stem = name.partition("/")
    case = load(HERE / folder / f"{stem}.json")
    module, operation = folder.rsplit(".", 1)
    op = getattr(importlib.import_module(f"operations.{module}"), operation)
    _, planned = run_operation(op, case)  # the readings it makes, each read for real below
    with scratch_root(tmp_path) as root:
        commands, host = run_operation(op, live_state(read_back(root, planned, case), planned.name, name, after=False))
        assert commands, f"{name}: nothing to do on a factory root"
        skipped = replayed(root, host.commands, CASES[name])
        assert len(skipped) == len(CASES[name]), f"each pattern left out must match a command: {skipped}"
        again = live_state(read_back(root, host, case), host.name, name, after=True)
    left, after = run_operation(op, again)
    assert left == [], f"{name}: after its commands ran, the operation would still run:\n" + "\n".join(map(str, left))
    assert after.noop_description, name
