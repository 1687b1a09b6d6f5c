"""Readings for host preparation: packages, a user's groups, managed files and directories, a sysctl."""

from __future__ import annotations

import json
import re
from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts.combine import combined, read_lines, split

SHA256 = re.compile(r"^[0-9a-f]{64}$")


class Packages(TypedDict):
    installed: list[str]
    missing: list[str]
    unreadable: list[str]


class PackageStatus(FactBase[Packages]):
    """
    Which of ``packages`` dpkg has installed, and which are missing.

    .. code:: python

        {"installed": ["rsync"], "missing": ["iperf3"], "unreadable": []}
    """

    @staticmethod
    def default() -> Packages:
        return {"installed": [], "missing": [], "unreadable": []}

    def command(self, packages: list[str]) -> StringCommand:
        """The packages asked for on one line, then one dpkg-query of them all: a line per package
        asked, "not-installed" for one dpkg does not know."""
        if not packages:
            return StringCommand("true")
        quoted = [QuoteString(p) for p in packages]
        return StringCommand(
            "{", "echo", *quoted, ";", "dpkg-query", "-W", "-f='${Package} ${db:Status-Status}\\n'", "--", *quoted, "2>/dev/null;", "}",
            "|", "awk", "'NR == 1 { n = split($0, asked); next } { status[$1] = $2 } "
            "END { for (i = 1; i <= n; i++) print asked[i], (asked[i] in status ? status[asked[i]] : \"not-installed\") }'",
        )

    def process(self, output: list[str]) -> Packages:
        reading = self.default()

        def parse(line: str) -> None:
            package, status = line.split()
            reading["installed" if status == "installed" else "missing"].append(package)

        reading["unreadable"] = read_lines(output, parse)
        return reading


class Account(TypedDict):
    exists: bool
    uid: int | None
    groups: list[str]
    unreadable: list[str]


class UserGroups(FactBase[Account]):
    """
    Whether ``user`` exists, its uid, and its groups (as a new login gets them).

    .. code:: python

        {"exists": True, "uid": 1000, "groups": ["spark", "docker"], "unreadable": []}
    """

    @staticmethod
    def default() -> Account:
        return {"exists": False, "uid": None, "groups": [], "unreadable": []}

    def command(self, user: str) -> StringCommand:
        return StringCommand("id", "-u", QuoteString(user), "2>/dev/null", "&&", "id", "-nG", QuoteString(user),
                             "||", "echo", "no-such-user")

    def process(self, output: list[str]) -> Account:
        lines = [line.strip() for line in output if line.strip()]
        if lines == ["no-such-user"]:
            return self.default()
        if len(lines) == 2 and lines[0].isdecimal():
            return {"exists": True, "uid": int(lines[0]), "groups": lines[1].split(), "unreadable": []}
        return {**self.default(), "unreadable": lines}


class FileInfo(TypedDict):
    kind: str
    mode: str | None
    owner: str | None
    sha256: str | None  # files only


class Files(TypedDict):
    files: dict[str, FileInfo]
    unreadable: list[str]


# Three processes for any number of paths: the kinds by the shell's own tests (a file is hashed only
# if it is a regular file then: never a FIFO or a device), every mode and owner by one stat (of the
# path itself, as lstat), every regular file's hash by one sha256sum; joined into a line per path,
# in the order asked.
JOIN = ("'$1 == \"kind\" { p = $0; sub(/^kind [^ ]* /, \"\", p); kind[++n] = $2; path[n] = p; next } "
        "$1 == \"mode\" { p = $0; sub(/^mode [^ ]* [^ ]* /, \"\", p); mode[p] = $2 \" \" $3; next } "
        "{ sha[substr($0, 67)] = substr($0, 1, 64) } "
        "END { for (i = 1; i <= n; i++) { p = path[i]; if (kind[i] == \"file\") print \"file \" mode[p] \" \" sha[p] \" \" p; "
        "else if (kind[i] == \"directory\") print \"directory \" mode[p] \" \" p; else print \"absent \" p } }'")


class FileDigests(FactBase[Files]):
    """
    For each path: a file (mode, owner, SHA-256), a directory (mode, owner), or absent. One
    round trip for every path an operation manages.

    .. code:: python

        {"files": {"/etc/security/limits.d/99-rdma.conf": {"kind": "file", "mode": "644", "owner": "root:root",
                                                          "sha256": "9f86d0..."},
                   "/var/lib/dual-spark/model": {"kind": "directory", "mode": "755", "owner": "spark:spark", "sha256": None}},
         "unreadable": []}
    """

    @staticmethod
    def default() -> Files:
        return {"files": {}, "unreadable": []}

    def command(self, paths: list[str]) -> StringCommand:
        quoted = [QuoteString(p) for p in paths]
        return StringCommand(
            "(", "set", "--;", "for p in", *quoted, "; do",
            'if [ -f "$p" ]; then echo "kind file $p"; set -- "$@" "$p"; elif [ -d "$p" ]; then echo "kind directory $p";',
            'else echo "kind absent $p"; fi; done;', "stat", "-c", "'mode %a %U:%G %n'", "--", *quoted, "2>/dev/null;",
            '[ $# -eq 0 ] || sha256sum -- "$@" 2>/dev/null', ")", "|", "awk", JOIN,
        )

    def process(self, output: list[str]) -> Files:
        files: dict[str, FileInfo] = {}

        def parse(line: str) -> None:
            kind, rest = line.split(" ", 1)
            if kind == "file":
                mode, owner, sha256, path = rest.split(" ", 3)
                if not mode.isdecimal() or ":" not in owner or not SHA256.match(sha256):
                    raise ValueError(line)
                files[path] = {"kind": "file", "mode": mode, "owner": owner, "sha256": sha256}
            elif kind == "directory":
                mode, owner, path = rest.split(" ", 2)
                if not mode.isdecimal() or ":" not in owner or not path.startswith("/"):
                    raise ValueError(line)
                files[path] = {"kind": "directory", "mode": mode, "owner": owner, "sha256": None}
            elif kind == "absent" and rest.startswith("/"):
                files[rest] = {"kind": kind, "mode": None, "owner": None, "sha256": None}
            else:
                raise ValueError(line)

        return {"files": files, "unreadable": read_lines(output, parse)}


class DirectoryInfo(TypedDict):
    kind: str  # stat's name for it ("directory", "symbolic link", "regular file", ...), or "absent"
    mode: str | None
    owner: str | None
    realpath: str | None  # where realpath resolves it (None: absent, or a dangling link)
    holds: list[str]  # which of the names asked about it holds as regular files (not links)


class Managed(TypedDict):
    files: Files
    directories: dict[str, DirectoryInfo]
    unreadable: list[str]


class ManagedPaths(FactBase[Managed]):
    """
    The project's files (as FileDigests) and directories, in one round trip: for each directory
    what `stat` says of it without following a link (mode, owner, kind), where `realpath`
    resolves it, and which of ``names`` it holds as regular files (not links) of root's or of the
    directory's owner: the deploy's marker, an earlier version's files. Run by root; nothing is
    changed.

    .. code:: python

        {"files": {...FileDigests...},
         "directories": {"/var/lib/dual-spark": {"kind": "directory", "mode": "755", "owner": "root:root",
                                                 "realpath": "/var/lib/dual-spark", "holds": [".dual-spark-managed"]},
                         "/var/lib/dual-spark-evil": {"kind": "symbolic link", "mode": "777", "owner": "root:root",
                                                      "realpath": "/etc/profile.d", "holds": []},
                         "/etc/dual-spark": {"kind": "absent", "mode": None, "owner": None, "realpath": None, "holds": []}},
         "unreadable": []}
    """

    @staticmethod
    def default() -> Managed:
        return {"files": FileDigests.default(), "directories": {}, "unreadable": []}

    def command(self, files: list[str], directories: list[str], names: list[str]) -> StringCommand:
        return combined({"files": FileDigests().command(files), "directories": StringCommand(
            "for d in", *(QuoteString(d) for d in directories), "; do", 'echo "path $d";',
            "stat -c '%a %U:%G %F' -- \"$d\" 2>/dev/null;", 'realpath -e -- "$d" 2>/dev/null;',
            "for n in", *(QuoteString(n) for n in names), '; do if [ -f "$d/$n" ] && [ ! -L "$d/$n" ] && '
            '{ [ -O "$d/$n" ] || [ "$(stat -c %u -- "$d/$n")" = "$(stat -c %u -- "$d")" ]; }; then echo "holds $n"; fi; done;',
            "done",
        )})

    def process(self, output: list[str]) -> Managed:
        sections = split(output)
        directories: dict[str, DirectoryInfo] = {}
        current: list[DirectoryInfo] = []

        def parse(line: str) -> None:
            if line.startswith("path /"):
                info: DirectoryInfo = {"kind": "absent", "mode": None, "owner": None, "realpath": None, "holds": []}
                directories[line[len("path "):]] = info
                current[:] = [info]
                return
            info = current[0]
            if line.startswith("holds "):
                info["holds"].append(line[len("holds "):])
            elif line.startswith("/") and info["realpath"] is None:
                info["realpath"] = line
            else:
                mode, owner, kind = line.split(" ", 2)
                if not mode.isdecimal() or ":" not in owner or info["mode"] is not None:
                    raise ValueError(line)
                info.update({"kind": kind, "mode": mode, "owner": owner})

        unreadable = read_lines(sections.get("directories", []), parse)
        return {"files": FileDigests().process(sections.get("files", [])), "directories": directories,
                "unreadable": sections[""] + unreadable}


class Archive(TypedDict):
    files: dict[str, list[str]] | None
    unreadable: list[str]


class ArchiveFiles(FactBase[Archive]):
    """
    The lines of each file in the zip archive at ``path`` (a zipapp the deploy installed), read
    by the node's Python; None when there is no such archive.

    .. code:: python

        {"files": {"__main__.py": ["from dual_spark.__main__ import main", "", "main()"], ...}, "unreadable": []}
    """

    @staticmethod
    def default() -> Archive:
        return {"files": None, "unreadable": []}

    def command(self, path: str) -> StringCommand:
        read = ("import json, sys, zipfile; archive = zipfile.ZipFile(sys.argv[1]); "
                'print(json.dumps({name: archive.read(name).decode(errors="replace") for name in archive.namelist()}))')
        return StringCommand("python3", "-c", QuoteString(read), QuoteString(path), "2>/dev/null", "||", "true")

    def process(self, output: list[str]) -> Archive:
        lines = [line for line in output if line.strip()]
        try:
            files = json.loads(lines[-1]) if lines else None
            return {"files": {name: text.splitlines() for name, text in files.items()} if files is not None else None,
                    "unreadable": lines[:-1]}
        except (ValueError, AttributeError):
            return {"files": None, "unreadable": lines}


class Settings(TypedDict):
    files: Files
    sysctl: SysctlReading
    unreadable: list[str]


class HostSettings(FactBase[Settings]):
    """
    The host settings' files (as FileDigests) and a sysctl's live value, in one round trip.

    .. code:: python

        {"files": {...FileDigests...}, "sysctl": {"value": 0, "unreadable": []}, "unreadable": []}
    """

    @staticmethod
    def default() -> Settings:
        return {"files": FileDigests.default(), "sysctl": SysctlValue.default(), "unreadable": []}

    def command(self, paths: list[str], key: str) -> StringCommand:
        return combined({"files": FileDigests().command(paths), "sysctl": SysctlValue().command(key)})

    def process(self, output: list[str]) -> Settings:
        sections = split(output)
        return {"files": FileDigests().process(sections.get("files", [])),
                "sysctl": SysctlValue().process(sections.get("sysctl", [])), "unreadable": sections[""]}


class SysctlReading(TypedDict):
    value: int | None
    unreadable: list[str]


class SysctlValue(FactBase[SysctlReading]):
    """
    A kernel parameter's integer value; None where this kernel has no such key.

    .. code:: python

        {"value": 0, "unreadable": []}
    """

    @staticmethod
    def default() -> SysctlReading:
        return {"value": None, "unreadable": []}

    def command(self, key: str) -> StringCommand:
        return StringCommand("sysctl", "-n", QuoteString(key), "2>/dev/null", "||", "true")

    def process(self, output: list[str]) -> SysctlReading:
        values = [line.strip() for line in output if line.strip()]
        if len(values) == 1 and values[0].lstrip("-").isdecimal():
            return {"value": int(values[0]), "unreadable": []}
        return {"value": None, "unreadable": values}
