"""Data-driven fact tests: tests/facts/<module>.<Fact>/<case>.json holds the fact's arguments,
the exact command it sends, the raw output lines a host printed, and the value the fact must
make of them."""

import importlib
import json
from pathlib import Path

import pytest
from pyinfra.api import FactBase

FIXTURES = sorted((Path(__file__).parent / "facts").glob("*/*.json"))


def fact_class(name: str):
    module, cls = name.rsplit(".", 1)
    return getattr(importlib.import_module(f"facts.{module}"), cls)


def facts_of_this_project():
    for path in sorted((Path(__file__).parents[1] / "facts").glob("*.py")):
        module = importlib.import_module(f"facts.{path.stem}")
        for name, value in vars(module).items():
            if isinstance(value, type) and issubclass(value, FactBase) and value.__module__ == module.__name__:
                yield f"{path.stem}.{name}", value


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_fact_reads_real_output(fixture):
    case = json.loads(fixture.read_text())
    fact = fact_class(fixture.parent.name)()
    command = fact.command(**case["args"])
    assert (command if isinstance(command, str) else command.get_raw_value()) == case["command"]
    assert fact.process(case["output"]) == case["fact"]


def test_every_fact_has_a_fixture():
    covered = {path.parent.name for path in FIXTURES}
    for name, _ in facts_of_this_project():
        assert name in covered, f"no fixture for facts.{name}"


@pytest.mark.parametrize("name, cls", list(facts_of_this_project()), ids=lambda v: v if isinstance(v, str) else "")
def test_default_has_the_shape_of_a_reading(name, cls):
    """What pyinfra returns for a command that printed nothing has every key a reading has,
    with values of the same types (None standing for an optional value)."""
    fixture = next(path for path in FIXTURES if path.parent.name == name)
    reading = json.loads(fixture.read_text())["fact"]
    default = cls.default()
    assert same_shape(default, reading), f"{default} vs {reading}"
    assert default["unreadable"] == []


def same_shape(a, b) -> bool:
    """Fixed-key dicts (those with "unreadable") must have the same keys, recursively."""
    if a is None or b is None:
        return True
    if isinstance(a, dict) and "unreadable" in a:
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_shape(a[k], b[k]) for k in a)
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return isinstance(b, (int, float)) and not isinstance(b, bool)
    return type(a) is type(b)


def test_readiness_reads_every_field_of_its_reading_from_one_table():
    """facts/verify.py spells each section of its own once, in SECTIONS, and names the readings it
    shares with the steps once, in SHARED; the reading's types name the same."""
    from facts.verify import SECTIONS, SHARED, Own, Readiness, Readings
    assert set(Own.__annotations__) == set(SECTIONS) | {"unreadable"} == set(Readiness.default())
    assert set(Readings.__annotations__) == set(Own.__annotations__) | set(SHARED) and not set(SECTIONS) & set(SHARED)


def test_file_digests_reads_a_tree_as_the_os_sees_it(tmp_path):
    """FileDigests run for real on a scratch tree: each path's kind following links (a FIFO is no
    file and is never opened), the mode and owner of the path itself (lstat), the hash of a
    regular file's bytes, in the order asked; names with spaces too."""
    import grp
    import hashlib
    import os
    import pwd
    import stat
    import subprocess

    from facts.host_prep import FileDigests

    (tmp_path / "d").mkdir(mode=0o750)
    (tmp_path / "a b").write_text("x\n")
    (tmp_path / "empty").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "a b")
    (tmp_path / "dangling").symlink_to(tmp_path / "none")
    os.mkfifo(tmp_path / "fifo")
    os.chmod(tmp_path / "a b", 0o600)
    paths = [str(tmp_path / name) for name in ("fifo", "a b", "d", "none", "link", "dangling", "empty")]

    def seen(path: str) -> dict:
        if not os.path.isfile(path) and not os.path.isdir(path):
            return {"kind": "absent", "mode": None, "owner": None, "sha256": None}
        info = os.lstat(path)
        owner = f"{pwd.getpwuid(info.st_uid).pw_name}:{grp.getgrgid(info.st_gid).gr_name}"
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest() if os.path.isfile(path) else None
        return {"kind": "file" if digest else "directory", "mode": format(stat.S_IMODE(info.st_mode), "o"), "owner": owner, "sha256": digest}

    done = subprocess.run(["sh", "-c", FileDigests().command(paths).get_raw_value()], capture_output=True, text=True, timeout=30)
    reading = FileDigests().process(done.stdout.splitlines())
    assert reading == {"files": {path: seen(path) for path in paths}, "unreadable": []}
    assert list(reading["files"]) == paths and reading["files"][paths[0]]["kind"] == "absent"


def test_package_status_reads_as_dpkg_says_of_each_package():
    """PackageStatus asks dpkg once for every package, here for real: each reads as dpkg-query
    says of it alone, a package dpkg does not know as missing, in the order asked."""
    import subprocess

    from facts.host_prep import PackageStatus

    packages = ["coreutils", "no-such-package-here", "dpkg", "libc6"]
    done = subprocess.run(["sh", "-c", PackageStatus().command(packages).get_raw_value()], capture_output=True, text=True, timeout=30)
    alone = {package: subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Status}", package], capture_output=True, text=True).stdout
             for package in packages}
    assert PackageStatus().process(done.stdout.splitlines()) == {
        "installed": [p for p in packages if alone[p] == "installed"], "missing": [p for p in packages if alone[p] != "installed"],
        "unreadable": []}
    assert alone["coreutils"] == "installed" and alone["no-such-package-here"] == ""
    assert PackageStatus().command([]).get_raw_value() == "true"
