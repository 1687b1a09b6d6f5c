"""The deploy's own directories on a node (state_dir, model_dir, stack_dir): nothing that exists
without the deploy's marker has its owner, mode or contents changed, and a marker proves nothing
without its owner. The head reads them (ManagedPaths) and plans; the shipped program
(files/dual_spark/own.py) checks again on the node and acts, one call quoted once: each directory
from ``site_schema.own_top`` down to the path either exists as a real directory (no symbolic link on
the way) that only root and the deploy user can change, holding the marker of one of them, or is
made (one level at a time, in a parent that exists and that, with every directory above it up to
one of root's, no one else can change) and marked; only then is the final directory given its
owner and mode. Anything else is refused, naming the path, its owner and mode, and the fix. The
site's parse is the first line (the path rule); this is the second, on the node."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import OperationError, QuoteString, StringCommand

from files.dual_spark.refusals import OPEN_TO_OTHERS, SECRET_MODES, foreign, no_parent, not_ours, not_real, secret_fix
from layout import MANAGED_MARKER
from site_schema import SECRETS_HOME, own_top

# What an earlier version of the deploy (which marked no state_dir or stack_dir) left in one: such
# a directory, root-owned and not a link, is adopted (marked) instead of refused.
LEGACY = {"state_dir": ("bin/model_sync.py",), "stack_dir": ("compose.yaml", "launch.sh")}
NAMES = [MANAGED_MARKER, *dict.fromkeys(name for names in LEGACY.values() for name in names)]


def own(programs: str, *args: str) -> StringCommand:
    """A call of the program ``own`` of the archive at ``programs``, each argument quoted once."""
    return StringCommand("python3", QuoteString(programs), "own", *(QuoteString(arg) for arg in args))


@dataclass(frozen=True)
class Claim:
    """A directory the site names (``field``), to be the deploy's, with its owner and mode."""

    field: str
    path: str
    owner: str
    mode: str


def deploy_directories(settings, user: str) -> list[tuple[str, str, str, str]]:
    """The directories the deploy claims (setting, path, owner, mode): every one in the first step
    that touches any (tasks/runtime.py), so a refusal comes before anything changes."""
    return [("state_dir", settings.state_dir, "root", "755"), ("model_dir", settings.model_dir, user, "755"),
            ("stack_dir", settings.stack_dir, "root", "755")]


def levels(path: str) -> list[str]:
    """The directories the deploy makes or finds its marker in: own_top(path) down to path."""
    top = own_top(path)
    if top is None:
        return []
    below = path[len(top):].strip("/").split("/") if path != top else []
    return [top] + [posixpath.join(top, *below[:depth]) for depth in range(1, len(below) + 1)]


def trusted(info: dict, owner: str, shared: bool = False) -> bool:
    """Whether only root and ``owner`` can change a directory (ManagedPaths' reading): theirs and
    writable by no one else, or, ``shared``, a sticky one of root's (like /tmp)."""
    user, mode = info["owner"].split(":")[0], int(info["mode"], 8)
    if user not in ("root", owner):
        return False
    return not mode & OPEN_TO_OTHERS or (shared and user == "root" and bool(mode & 0o1000))


def legacy(claim: Claim | None) -> tuple[str, ...]:
    return LEGACY.get(claim.field, ()) if claim is not None else ()


@dataclass
class Level:
    path: str
    fields: list[str]
    final: Claim | None = None  # the claim whose own directory this is


def structure(claims: list[Claim]) -> tuple[list[tuple[str, Claim]], list[Level]]:
    """The parents that must exist (each with the first claim that needs it), and every level,
    each once, parents first, with the site fields that name it or a directory below it."""
    parents: dict[str, Claim] = {}
    found: dict[str, Level] = {}
    for claim in claims:
        chain = levels(claim.path)
        if not chain:
            raise OperationError(f"{host.name}: {claim.field} = {claim.path} is not where the deploy keeps its directories "
                                 "(the path rule of site_schema.py): name another directory in site.toml")
        parents.setdefault(posixpath.dirname(chain[0]), claim)
        for path in chain:  # top down: a level's parent is always found before it
            level = found.setdefault(path, Level(path, []))
            if claim.field not in level.fields:
                level.fields.append(claim.field)
        found[claim.path].final = found[claim.path].final or claim
    return list(parents.items()), list(found.values())


def reading_paths(claims: list[Claim]) -> list[str]:
    """Every directory the claims' check reads: the parents, then the levels."""
    parents, ordered = structure(claims)
    return list(dict.fromkeys([parent for parent, _ in parents] + [level.path for level in ordered]))


@dataclass
class Plan:
    owned: list[Claim]  # final directories given their owner and mode
    lines: list[str]  # what the diff says, one line for each directory made, adopted or changed

    @property
    def changes(self) -> bool:
        return bool(self.lines)


def owner_of(claims: list[Claim]) -> str:
    """The one user besides root the claims trust (the deploy user), root where none is theirs."""
    return next((claim.owner for claim in claims if claim.owner != "root"), "root")


def plan(claims: list[Claim], directories: dict) -> Plan:
    """What the claims' command will do, read from ManagedPaths' directories; an OperationError
    naming the path and the fix where it would refuse."""
    parents, ordered = structure(claims)
    owner = owner_of(claims)
    for parent, claim in parents:
        info = directories.get(parent)
        if info is None or info["kind"] != "directory" or info["realpath"] != parent:
            raise OperationError(f"{host.name}: {no_parent(parent, claim.field, claim.path)}")
        if not trusted(info, owner, shared=True):
            raise OperationError(f"{host.name}: {foreign(parent, info['owner'].split(':')[0], info['mode'], claim.field, owner)}")
    result = Plan([], [])
    for level in ordered:
        info = directories.get(level.path) or {"kind": "absent"}
        fields, claim = ", ".join(level.fields), level.final
        owner, mode = (claim.owner, claim.mode) if claim is not None else ("root", "755")
        if info["kind"] == "absent":
            result.lines.append(f"Will create {level.path} ({owner}, mode {mode}) and mark it {MANAGED_MARKER}")
            result.owned += [claim] if claim is not None else []
            continue
        if info["kind"] != "directory" or info["realpath"] != level.path:
            what = (f"is a {info['kind']}" + (f" to {info['realpath']}" if info["realpath"] else "") if info["kind"] != "directory"
                    else f"lies under a symbolic link (it is {info['realpath']})")
            raise OperationError(f"{host.name}: {not_real(level.path, fields, what)}")
        if not trusted(info, owner):
            raise OperationError(f"{host.name}: {foreign(level.path, info['owner'].split(':')[0], info['mode'], fields, owner)}")
        if MANAGED_MARKER not in info["holds"]:
            earlier = legacy(claim)
            if not (earlier and info["owner"].split(":")[0] == "root" and all(name in info["holds"] for name in earlier)):
                raise OperationError(f"{host.name}: {not_ours(level.path, fields, MANAGED_MARKER)}")
            result.lines.append(f"Will adopt {level.path} (an earlier version's {' and '.join(earlier)}, root-owned): "
                                f"mark it {MANAGED_MARKER}")
        if claim is not None and (info["owner"].split(":")[0] != owner or info["mode"] != mode):
            result.owned.append(claim)
            result.lines.append(f"Will set {level.path} to {owner}, mode {mode} (now {info['owner']}, mode {info['mode']})")
    return result


def claim_command(claims: list[Claim], owned: list[Claim], programs: str) -> StringCommand:
    """The program's claim (of the archive at ``programs``): check every level of every claim,
    then make what is absent (one level at a time) and mark it, mark an earlier version's
    directory, give the ``owned`` final directories their owner and mode. A refusal comes before
    anything is changed."""
    parents, ordered = structure(claims)
    args = ["claim", "--owner", owner_of(claims)]
    for parent, claim in parents:
        args += ["--parent", parent, claim.field, claim.path]
    for level in ordered:
        args += ["--level", level.path, ", ".join(level.fields)]
        args += [piece for name in legacy(level.final) for piece in ("--legacy", level.path, name)]
    for claim in owned:
        args += ["--own", claim.path, claim.owner, claim.mode]
    return own(programs, *args)


def claimed(programs: str, path: str, field: str, owner: str = "root") -> StringCommand:
    """A call that goes on only if ``path`` is a directory the deploy claimed for ``owner`` (real,
    only root and ``owner`` can change it, marked by one of them): the guard of a later command
    that writes there as root."""
    return own(programs, "guard", "--dir", path, "--field", field, "--owner", owner)


def entry_claimed(programs: str, store: str, entry: str, user: str) -> StringCommand:
    """A call that goes on only if ``entry``, a directory of the model store ``store`` (claimed
    for ``user``), is the deploy's: found real, root's or ``user``'s and marked, or made there now,
    ``user``'s, and marked. Never a directory someone else made."""
    return own(programs, "entry", "--store", store, "--entry", entry, "--user", user)


# The site's secrets (container_secrets): files of root's that only root can read, in directories
# only root can change, all the way up. The deploy reads who owns them, never what they hold.

def secret_refusal(name: str, path: str, info: dict | None) -> str | None:
    """Why the secret file ``path`` (SecretFiles' reading of it) may not be mounted, naming its
    owner and mode and the fix; None when it is a regular file of root's, mode 600 or 400, no
    link on its way, in directories only root can change."""
    field = f"container_secrets.{name} = {path}"
    if info is None or info["kind"] == "absent":
        return (f"{field} does not exist here: put the secret there on every node, root's, mode 600 "
                f"(sudo install -d -m 700 {posixpath.dirname(path)} && sudo sh -c 'umask 077 && cat > {path}'), or drop {name}")
    if info["kind"] != "regular file":
        return f"{field} is a {info['kind']}: the deploy mounts a regular file only, never through a link. Put the secret itself at {path}"
    if info["directory"] != posixpath.dirname(path):
        return (f"{field} lies under a symbolic link (its directory is {info['directory']}): name the file by its real path "
                "in site.toml (container_secrets)")
    if info["owner"] != "root" or info["mode"] not in SECRET_MODES:
        return (f"{field} is {info['owner']}'s, mode {info['mode']}: a secret must be root's and read by root alone. "
                f"Fix: {secret_fix(path)}")
    for above in info["above"]:
        if not trusted(above, "root"):
            return (f"{field} is in {above['path']}, {above['owner']}'s, mode {above['mode']}: a user other than root could "
                    f"replace the secret. Fix: sudo chown root: {above['path']} && sudo chmod go-w {above['path']}, "
                    f"or keep the secret under {SECRETS_HOME}")
    return None


def sealed(programs: str, secrets: dict[str, str]) -> StringCommand:
    """A call that goes on only if every secret file is still as ``secret_refusal`` wants it (the
    guard of the command that mounts them, so no path is trusted from an earlier reading)."""
    return own(programs, "sealed", *(arg for name, path in sorted(secrets.items()) for arg in ("--secret", name, path)))


def cache_kept(programs: str, state_dir: str, cache: str, named: list[str], owner: str = "root") -> StringCommand:
    """A call, before a start, that claims ``cache`` (an image's directory of caches, in the
    directory of caches under ``state_dir``) and prunes its siblings. It goes on only if state_dir
    is the deploy's (``claimed``); the directory of caches and ``cache`` each either exist as the
    deploy's (real, only root and ``owner`` can change them, marked) or are made now and marked;
    anything else there is refused, nothing changed. Then every other directory there that the
    deploy made (real and marked) is removed unless the ``named`` stack files (compose.yaml: the
    stack in place, its previous one, the recorded states') mount it as a ``source:``. A directory
    without the marker is never removed, whatever its name. ``owner``: the user besides root
    trusted (root on a node, where root makes them)."""
    return own(programs, "cache", "--state-dir", state_dir, "--cache", cache, *(arg for path in named for arg in ("--named", path)),
               "--owner", owner)
