"""The deploy's own directories on this node (operations/own.py composes each call; every path
rule is the head's, none is here):

    own claim --owner USER [--parent DIR FIELD PATH]... [--level DIR FIELDS]... [--legacy DIR NAME]...
              [--own DIR OWNER MODE]...
        Check, then act. Each parent must be a directory that, with every one above it up to the
        first of root's, only root and USER can change (a sticky one of root's, like /tmp, is a
        safe parent); each level, parents first, absent or a directory only they can change that
        holds the marker of one of them (or, with --legacy files, root's and holding them all: an
        earlier version's). Then each absent level is made and marked, an earlier version's
        marked, and each --own directory given its owner and mode. A refusal comes first.
    own guard --dir DIR --field FIELD [--owner USER]
        Go on (exit 0) only if DIR is a directory the deploy claimed: the guard of a later command.
    own entry --store DIR --entry DIR --user USER
        The model store guarded, its entry found the deploy's, or made USER's now and marked.
    own cache --state-dir DIR --cache DIR [--named FILE]... [--owner USER]
        state_dir guarded, the directory of caches and this image's in it found the deploy's or
        made and marked, then each other one the deploy made removed unless a --named stack file
        mounts it as a `source:`.
    own remove --dir DIR [--owner USER]
        DIR and all in it removed, only if it is a directory the deploy made (real, marked).
    own sealed [--secret NAME FILE]...
        Go on only if each secret is a regular file of root's, mode 600 or 400, in directories
        only root can change, all the way up.

Every path is opened from / one name at a time, never through a symbolic link, and what was
checked is changed through the directory it opened: no path is resolved again in between.
"""

from __future__ import annotations

import argparse
import os
import posixpath
import pwd
import re
import stat
import sys

from .constants import MANAGED_MARKER
from .refusals import MARKER_TEXT, OPEN_TO_OTHERS, SECRET_MODES, foreign, no_longer, no_parent, not_ours, not_real, unclaimed, unsealed

DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
SOURCE = re.compile(r" *source: (.*)")  # a mount's source in a compose file, as the deploy writes it


class Refused(Exception):
    """What stops a claim, said in one line: the path, what it is, and the fix."""


def trusted(owner: str) -> set[int]:
    """Root and ``owner``: the only users who may be able to change the deploy's directories."""
    try:
        return {0, pwd.getpwnam(owner).pw_uid}
    except KeyError:
        return {0}


def name_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def walk(path: str) -> tuple[int, list[tuple[str, os.stat_result]]]:
    """``path``, a directory, opened from / one name at a time without following a link, and each
    directory on the way, / first (its path and status). OSError where one is not a directory."""
    names = path.strip("/").split("/") if path.strip("/") else []
    if not path.startswith("/") or any(name in ("", ".", "..") for name in names):
        raise NotADirectoryError(path)
    descriptor = os.open("/", DIRECTORY)
    seen = [("/", os.fstat(descriptor))]
    try:
        for depth, name in enumerate(names, 1):
            inner = os.open(name, DIRECTORY, dir_fd=descriptor)
            os.close(descriptor)
            descriptor = inner
            seen.append(("/" + "/".join(names[:depth]), os.fstat(descriptor)))
    except OSError:
        os.close(descriptor)
        raise
    return descriptor, seen


def closed(info: os.stat_result, uids: set[int]) -> bool:
    """Theirs (``uids``) and writable by no one else."""
    return info.st_uid in uids and not info.st_mode & OPEN_TO_OTHERS


def changeable(path: str, info: os.stat_result, fields: str, owner: str) -> Refused:
    return Refused(foreign(path, name_of(info.st_uid), f"{stat.S_IMODE(info.st_mode):o}", fields, owner))


def above(seen: list[tuple[str, os.stat_result]], uids: set[int]) -> tuple[str, os.stat_result] | None:
    """The first directory, from the last of ``seen`` up to the first of root's, that someone
    other than ``uids`` can change (a sticky one of root's is safe); None if there is none."""
    for path, info in reversed(seen):
        if info.st_uid == 0 and (closed(info, uids) or info.st_mode & stat.S_ISVTX):
            return None
        if not closed(info, uids) or info.st_uid == 0:
            return path, info
    return seen[0]


def regular(descriptor: int, name: str) -> os.stat_result | None:
    """The status of ``name`` in the directory ``descriptor`` if it is a regular file, no link on its way."""
    *directories, last = name.split("/")
    opened = [descriptor]
    try:
        for directory in directories:
            opened.append(os.open(directory, DIRECTORY, dir_fd=opened[-1]))
        info = os.stat(last, dir_fd=opened[-1], follow_symlinks=False)
    except OSError:
        return None
    finally:
        for inner in opened[1:]:
            os.close(inner)
    return info if stat.S_ISREG(info.st_mode) else None


def marked(descriptor: int, uids: set[int]) -> bool:
    """The directory ``descriptor`` is closed to all but ``uids`` and holds the marker of one of them."""
    marker = regular(descriptor, MANAGED_MARKER)
    return closed(os.fstat(descriptor), uids) and marker is not None and marker.st_uid in uids


def mark(descriptor: int, uid: int = -1, gid: int = -1) -> None:
    """Write the marker anew in the directory ``descriptor``, given to ``uid``:``gid`` (-1: this process's)."""
    try:
        os.unlink(MANAGED_MARKER, dir_fd=descriptor)
    except FileNotFoundError:
        pass
    marker = os.open(MANAGED_MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=descriptor)
    try:
        os.write(marker, f"{MARKER_TEXT}\n".encode())
        os.fchown(marker, uid, gid)
        os.fchmod(marker, 0o644)
    finally:
        os.close(marker)


def made(parent: int, name: str) -> int:
    """The directory ``name`` made in ``parent`` (mode 755) and opened."""
    os.mkdir(name, 0o755, dir_fd=parent)
    descriptor = os.open(name, DIRECTORY, dir_fd=parent)
    os.fchmod(descriptor, 0o755)
    return descriptor


class Opened(dict):
    """Directories opened by path, each closed at the end."""

    def __enter__(self) -> Opened:
        return self

    def __exit__(self, *_) -> None:
        for descriptor in self.values():
            os.close(descriptor)


def found(parent: int, path: str, fields: str, uids: set[int], owner: str) -> int | None:
    """The directory ``path`` (in ``parent``), opened, if it is real and closed to all but ``uids``; None if absent."""
    try:
        descriptor = os.open(posixpath.basename(path), DIRECTORY, dir_fd=parent)
    except FileNotFoundError:
        return None
    except OSError:
        raise Refused(not_real(path, fields)) from None
    info = os.fstat(descriptor)
    if not closed(info, uids):
        os.close(descriptor)
        raise changeable(path, info, fields, owner)
    return descriptor


def claim(owner: str, parents: list, levels: list, legacy: list, owned: list) -> list[str]:
    """Check every parent and level, then make, mark and own them; what was done, one line each."""
    uids, earlier = trusted(owner), {}
    for path, name in legacy:
        earlier.setdefault(path, []).append(name)
    with Opened() as opened:
        for parent, field, path in parents:
            try:
                opened[parent], seen = walk(parent)
            except OSError:
                raise Refused(no_parent(parent, field, path)) from None
            if (changed := above(seen, uids)) is not None:
                raise changeable(*changed, field, owner)
        absent = set()
        for path, fields in levels:
            up = posixpath.dirname(path)
            if up in absent:
                absent.add(path)
                continue
            if up not in opened:
                raise Refused(f"{path}: its directory is neither a --parent nor a --level before it")
            if (descriptor := found(opened[up], path, fields, uids, owner)) is None:
                absent.add(path)
                continue
            opened[path] = descriptor
            if not marked(descriptor, uids) and not (earlier.get(path) and os.fstat(descriptor).st_uid == 0 and all(
                    regular(descriptor, name) for name in earlier[path])):
                raise Refused(not_ours(path, fields, MANAGED_MARKER))
        said = []
        for path, _ in levels:
            if path in absent:
                opened[path] = made(opened[posixpath.dirname(path)], posixpath.basename(path))
                mark(opened[path])
                said.append(f"made {path}, marked {MANAGED_MARKER}")
            elif not marked(opened[path], uids):
                mark(opened[path])
                said.append(f"adopted {path} (an earlier version's {' and '.join(earlier[path])}), marked {MANAGED_MARKER}")
        for path, user, mode in owned:
            if path not in opened:
                raise Refused(f"{path}: --own names no --level")
            account = pwd.getpwnam(user)
            os.fchown(opened[path], account.pw_uid, account.pw_gid)
            os.fchmod(opened[path], int(mode, 8))
    return said


def guarded(path: str, field: str, owner: str) -> int:
    """``path`` opened, if it is a directory the deploy claimed for ``owner``."""
    try:
        descriptor, _ = walk(path)
    except OSError:
        raise Refused(unclaimed(path, field, owner, MANAGED_MARKER)) from None
    if not marked(descriptor, trusted(owner)):
        os.close(descriptor)
        raise Refused(unclaimed(path, field, owner, MANAGED_MARKER))
    return descriptor


def inside(directory: str, path: str) -> str:
    """The name of ``path`` in ``directory``; refused if it is not right in it."""
    if posixpath.dirname(path) != directory.rstrip("/"):
        raise Refused(f"{path} is not a directory right in {directory}")
    return posixpath.basename(path)


def entry(store: str, path: str, user: str) -> None:
    """Go on only if ``path``, in the model store, is the deploy's, or is made ``user``'s now and marked."""
    inside(store, path)
    uids = trusted(user)
    with Opened() as opened:
        opened[store] = guarded(store, "model_dir", user)
        descriptor = found(opened[store], path, "model_dir", uids, user)
        if descriptor is not None:
            opened[path] = descriptor
            if not marked(descriptor, uids):
                raise Refused(not_ours(path, "model_dir", MANAGED_MARKER))
            return
        account = pwd.getpwnam(user)
        opened[path] = made(opened[store], posixpath.basename(path))
        os.fchown(opened[path], account.pw_uid, account.pw_gid)
        mark(opened[path], account.pw_uid, account.pw_gid)


def remove(parent: int, name: str) -> None:
    """The directory ``name`` in ``parent`` and all in it, no link followed."""
    descriptor = os.open(name, DIRECTORY, dir_fd=parent)
    try:
        for item in os.scandir(descriptor):
            if item.is_dir(follow_symlinks=False):
                remove(descriptor, item.name)
            else:
                os.unlink(item.name, dir_fd=descriptor)
    finally:
        os.close(descriptor)
    os.rmdir(name, dir_fd=parent)


def ours(parent: int, name: str, uids: set[int]) -> bool:
    """``name`` in ``parent`` is a directory the deploy made: real, closed to all but ``uids``, marked."""
    try:
        descriptor = os.open(name, DIRECTORY, dir_fd=parent)
    except OSError:
        return False
    try:
        return marked(descriptor, uids)
    finally:
        os.close(descriptor)


def removed(path: str, owner: str) -> None:
    """``path`` and all in it removed, only if it is a directory the deploy made."""
    try:
        parent, _ = walk(posixpath.dirname(path))
    except OSError:
        raise Refused(no_longer(path, owner)) from None
    try:
        if not ours(parent, posixpath.basename(path), trusted(owner)):
            raise Refused(no_longer(path, owner))
        remove(parent, posixpath.basename(path))
    finally:
        os.close(parent)


def sources(named: list[str]) -> set[str]:
    """Every mount source the stack files ``named`` hold (one that is absent holds none)."""
    found_sources = set()
    for path in named:
        try:
            descriptor, _ = walk(posixpath.dirname(path))
        except OSError:
            continue
        try:
            file = os.open(posixpath.basename(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=descriptor)
        except OSError:
            continue
        finally:
            os.close(descriptor)
        with open(file, encoding="utf-8", errors="replace") as text:
            found_sources |= {match.group(1) for line in text if (match := SOURCE.fullmatch(line.rstrip("\n")))}
    return found_sources


def cache(state_dir: str, path: str, named: list[str], owner: str) -> list[str]:
    """Claim this image's caches ``path`` (state_dir/NAME/KEY), then prune the others the deploy made."""
    root = posixpath.dirname(path)
    inside(state_dir, root)
    uids, said = trusted(owner), []
    with Opened() as opened:
        opened[state_dir] = guarded(state_dir, "state_dir", owner)
        for up, level in ((state_dir, root), (root, path)):
            descriptor = found(opened[up], level, "state_dir", uids, owner)
            if descriptor is None:
                descriptor = made(opened[up], posixpath.basename(level))
                mark(descriptor)
                said.append(f"made {level}, marked {MANAGED_MARKER}")
            opened[level] = descriptor
            if not marked(descriptor, uids):
                raise Refused(not_ours(level, "state_dir", MANAGED_MARKER))
        kept = sources(named) | {path}
        for item in sorted(os.listdir(opened[root])):
            if not item.startswith(".") and f"{root}/{item}" not in kept and ours(opened[root], item, uids):
                remove(opened[root], item)
                said.append(f"removed {root}/{item}: the caches of an image no stack here names")
    return said


def sealed(name: str, path: str) -> None:
    """Go on only if the secret ``path`` is root's alone, in directories root's alone."""
    try:
        descriptor, seen = walk(posixpath.dirname(path))
    except OSError:
        raise Refused(unsealed(name, path)) from None
    try:
        info = regular(descriptor, posixpath.basename(path))
    finally:
        os.close(descriptor)
    if (info is None or info.st_uid != 0 or f"{stat.S_IMODE(info.st_mode):o}" not in SECRET_MODES
            or not all(closed(directory, {0}) for _, directory in seen)):
        raise Refused(unsealed(name, path))


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    claiming = commands.add_parser("claim", help="make, mark and own the deploy's directories, or refuse")
    claiming.add_argument("--owner", required=True, help="the one user besides root trusted")
    claiming.add_argument("--parent", nargs=3, action="append", default=[], metavar=("DIR", "FIELD", "PATH"))
    claiming.add_argument("--level", nargs=2, action="append", default=[], metavar=("DIR", "FIELDS"))
    claiming.add_argument("--legacy", nargs=2, action="append", default=[], metavar=("DIR", "NAME"))
    claiming.add_argument("--own", nargs=3, action="append", default=[], metavar=("DIR", "OWNER", "MODE"))
    guard = commands.add_parser("guard", help="go on only if a directory is the deploy's")
    guard.add_argument("--dir", required=True)
    guard.add_argument("--field", required=True)
    guard.add_argument("--owner", default="root")
    model = commands.add_parser("entry", help="a model store's entry, found the deploy's or made")
    for name in ("store", "entry", "user"):
        model.add_argument(f"--{name}", required=True)
    caches = commands.add_parser("cache", help="this image's caches claimed, those no stack names removed")
    caches.add_argument("--state-dir", required=True)
    caches.add_argument("--cache", required=True)
    caches.add_argument("--named", action="append", default=[])
    caches.add_argument("--owner", default="root")
    removing = commands.add_parser("remove", help="remove a directory the deploy made")
    removing.add_argument("--dir", required=True)
    removing.add_argument("--owner", default="root")
    secrets = commands.add_parser("sealed", help="go on only if each secret is root's alone")
    secrets.add_argument("--secret", nargs=2, action="append", default=[], metavar=("NAME", "FILE"))
    args = parser.parse_args(argv)
    try:
        said = []
        if args.command == "claim":
            said = claim(args.owner, args.parent, args.level, args.legacy, args.own)
        elif args.command == "guard":
            os.close(guarded(args.dir, args.field, args.owner))
        elif args.command == "entry":
            entry(args.store, args.entry, args.user)
        elif args.command == "cache":
            said = cache(args.state_dir, args.cache, args.named, args.owner)
        elif args.command == "remove":
            removed(args.dir, args.owner)
        else:
            for name, path in args.secret:
                sealed(name, path)
        for line in said:
            print(line)
    except (Refused, OSError, KeyError) as error:
        print(error if isinstance(error, Refused) else f"own {args.command}: {error}", file=sys.stderr)
        sys.exit(1)
