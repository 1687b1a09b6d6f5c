"""The deploy's own directories on a node (state_dir, model_dir, stack_dir): nothing that exists
without the deploy's marker has its owner, mode or contents changed, and a marker proves nothing
without its owner. One shell command checks and acts: each directory from
``site_schema.own_top`` down to the path either exists as a real directory (no symbolic link on
the way) that only root and the deploy user can change, holding the marker of one of them, or is
made (one level at a time, in a parent that exists and that, with every directory above it up to
one of root's, no one else can change) and marked; only then is the final directory given its
owner and mode. Anything else is refused, naming the path, its owner and mode, and the fix. The
site's parse is the first line (the path rule); this is the second, on the node."""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import OperationError, QuoteString, StringCommand

from layout import MANAGED_MARKER
from site_schema import SECRETS_HOME, own_top

# What an earlier version of the deploy (which marked no state_dir or stack_dir) left in one: such
# a directory, root-owned and not a link, is adopted (marked) instead of refused.
LEGACY = {"state_dir": ("bin/model_sync.py",), "stack_dir": ("compose.yaml", "launch.sh")}
NAMES = [MANAGED_MARKER, *dict.fromkeys(name for names in LEGACY.values() for name in names)]
MARKER_TEXT = "Made or adopted by the dual-spark deploy, which may change what is in this directory."
# Where a directory's mode lets someone other than its owner write (group or others): octal 022.
OPEN_TO_OTHERS = 0o022


def checks(owner: str = "root") -> str:
    """The shell functions of the checks, trusting root and ``owner`` (the user a claim gives its
    directory) and no one else: refuse with a message; refuse a path (with the site fields that
    name it) naming its owner and mode, as a link, or as not the deploy's; a directory with no
    link on its way; one only root and ``owner`` can change (theirs, writable
    by no one else); the directories above one, up to the first of root's (a sticky one of root's,
    like /tmp, is shared safely); a regular file that is no link; a directory holding the marker,
    root's or ``owner``'s. And of the act: write the marker."""
    return ('no() { echo "$1" >&2; exit 1; }; '
            f'foreign() {{ no "$1 is $(stat -c %U -- "$1")\'s, mode $(stat -c %a -- "$1"): {foreign("$1", "$2", owner)}"; }}; '
            f'not_real() {{ no "{not_real("$1", "$2")}"; }}; not_ours() {{ no "{not_ours("$1", "$2")}"; }}; '
            'real() { [ -d "$1" ] && [ ! -L "$1" ] && [ "$(realpath -e -- "$1")" = "$1" ]; }; '
            f'mine() {{ case "$(stat -c %U -- "$1")" in root|{owner}) ;; *) return 1;; esac; }}; '
            f'closed() {{ mine "$1" && [ $((0$(stat -c %a -- "$1") & 0{OPEN_TO_OTHERS:o})) -eq 0 ]; }}; '
            'above() { up="$1"; while mine "$up"; do if [ "$(stat -c %u -- "$up")" = 0 ]; then closed "$up" || [ -k "$up" ]; return; fi; '
            'closed "$up" || return 1; up=$(dirname -- "$up"); done; return 1; }; '
            'regular() { [ -f "$1" ] && [ ! -L "$1" ]; }; '
            f'marked() {{ closed "$1" && regular "$1/{MANAGED_MARKER}" && mine "$1/{MANAGED_MARKER}"; }}; '
            "mark() { echo " + shlex.quote(MARKER_TEXT) + ' > "$1"; };')


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


def not_ours(path: str, fields: str) -> str:
    return (f"{path} exists and is not the deploy's (no {MANAGED_MARKER}): name another directory in site.toml ({fields}), "
            f"or, if it is this deploy's, sudo touch {path}/{MANAGED_MARKER}")


def not_real(path: str, fields: str, what: str = "is a symbolic link, lies under one, or is not a directory") -> str:
    return (f"{path} {what}: the deploy follows no link and makes its directories itself. Name a directory of its own, "
            f"by its real path, in site.toml ({fields})")


def no_parent(parent: str, claim: Claim) -> str:
    return (f"{parent} is not a directory here (or is a symbolic link): {claim.field} = {claim.path} would be made in it. "
            f"If it is a data disk, mount it (the deploy never makes the mount point of a disk on the root file system); "
            f"else create it (sudo mkdir {parent}) or name another directory in site.toml ({claim.field})")


def foreign(path: str, fields: str, owner: str) -> str:
    """The fix for a directory someone other than root and ``owner`` can change, after its owner
    and mode (which the shell's ``foreign`` and ``plan`` name)."""
    return (f"a user other than root and {owner} can change it, so the deploy writes nothing there and runs nothing "
            f"from it. Name a directory of the deploy's own in site.toml ({fields}), or, if it is yours to give: "
            f"sudo chown root: {path} && sudo chmod go-w {path}")


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
            raise OperationError(f"{host.name}: {no_parent(parent, claim)}")
        if not trusted(info, owner, shared=True):
            raise OperationError(f"{host.name}: {parent} is {info['owner'].split(':')[0]}'s, mode {info['mode']}: "
                                 f"{foreign(parent, claim.field, owner)}")
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
            raise OperationError(f"{host.name}: {level.path} is {info['owner'].split(':')[0]}'s, mode {info['mode']}: "
                                 f"{foreign(level.path, fields, owner)}")
        if MANAGED_MARKER not in info["holds"]:
            earlier = legacy(claim)
            if not (earlier and info["owner"].split(":")[0] == "root" and all(name in info["holds"] for name in earlier)):
                raise OperationError(f"{host.name}: {not_ours(level.path, fields)}")
            result.lines.append(f"Will adopt {level.path} (an earlier version's {' and '.join(earlier)}, root-owned): "
                                f"mark it {MANAGED_MARKER}")
        if claim is not None and (info["owner"].split(":")[0] != owner or info["mode"] != mode):
            result.owned.append(claim)
            result.lines.append(f"Will set {level.path} to {owner}, mode {mode} (now {info['owner']}, mode {info['mode']})")
    return result


def claim_command(claims: list[Claim], owned: list[Claim]) -> StringCommand:
    """Check every level of every claim, then act: make what is absent (one level at a time) and
    mark it, mark an earlier version's directory, give the ``owned`` final directories their owner
    and mode. A refusal exits before anything is changed."""
    parents, ordered = structure(claims)
    owner = owner_of(claims)
    parts: list = [checks(owner)]
    for parent, claim in parents:
        parts += ["real", QuoteString(parent), "||", "no", QuoteString(no_parent(parent, claim)), ";",
                  "above", QuoteString(parent), "||", "foreign", '"$up"', QuoteString(claim.field), ";"]
    for level in ordered:
        path, fields, earlier = QuoteString(level.path), ", ".join(level.fields), legacy(level.final)
        adoptable = ["||", "{", "[", '"$(stat', "-c", "%u", "--", path, ')"', "=", "0", "]", *[
            piece for name in earlier for piece in ("&&", "regular", QuoteString(f"{level.path}/{name}"))], ";", "}"] if earlier else []
        parts += ["if", "[", "-e", path, "]", "||", "[", "-L", path, "];", "then",
                  "real", path, "||", "not_real", path, QuoteString(fields), ";",
                  "closed", path, "||", "foreign", path, QuoteString(fields), ";",
                  "marked", path, *adoptable, "||", "not_ours", path, QuoteString(fields), ";", "fi;"]
    for level in ordered:
        path, earlier = QuoteString(level.path), legacy(level.final)
        marker = QuoteString(f"{level.path}/{MANAGED_MARKER}")
        parts += ["if", "[", "!", "-e", path, "];", "then", "mkdir", "-m", "755", "--", path, "&&", "mark", marker,
                  "&&", "echo", QuoteString(f"made {level.path}, marked {MANAGED_MARKER}"), "||", "exit", "1;"]
        if earlier:
            parts += ["elif", "!", "marked", path, ";", "then", "rm", "-f", "--", marker, "&&", "mark", marker, "&&",
                      "echo", QuoteString(f"adopted {level.path} (an earlier version's {' and '.join(earlier)}), marked {MANAGED_MARKER}"),
                      "||", "exit", "1;"]
        parts += ["fi;"]
    for claim in owned:  # on the directory itself, entered without a link: no path is resolved again after the check
        path = QuoteString(claim.path)
        parts += ["(", "cd", "-P", "--", path, "&&", "[", '"$(pwd -P)"', "=", path, "]", "&&",
                  "chown", QuoteString(f"{claim.owner}:"), ".", "&&", "chmod", claim.mode, ".", ")", "||", "exit", "1;"]
    parts += ["true"]
    return StringCommand(*parts)


def claimed(path: str, field: str, owner: str = "root") -> StringCommand:
    """Shell that goes on only if ``path`` is a directory the deploy claimed for ``owner`` (real,
    only root and ``owner`` can change it, marked by one of them): the guard of a later command
    that writes there as root."""
    quoted = QuoteString(path)
    return StringCommand(checks(owner), "{", "real", quoted, "&&", "marked", quoted, "||", "no",
                         QuoteString(f"{field} {path} is not a directory the deploy claimed (a real directory only root "
                                     f"and {owner} can change, holding their {MANAGED_MARKER}): run `pyinfra inventory.py tasks/runtime.py`, which makes and marks it"),
                         ";", "}")


def entry_claimed(store: str, entry: str, user: str) -> StringCommand:
    """Shell, after ``claimed(store, ..., user)`` (whose functions it uses), that goes on only if
    ``entry``, a directory of the model store ``store``, is the deploy's: found real, root's or
    ``user``'s and marked, or made there now by ``user`` and marked. Never a directory someone
    else made."""
    quoted = QuoteString(entry)
    make = f'mkdir -m 755 -- "$1" && echo {shlex.quote(MARKER_TEXT)} > "$1/{MANAGED_MARKER}"'
    return StringCommand("{", "if", "[", "-e", quoted, "]", "||", "[", "-L", quoted, "];", "then", "real", quoted, "||",
                         "not_real", quoted, "model_dir;", "closed", quoted, "||", "foreign", quoted, "model_dir;", "marked", quoted, "||",
                         "not_ours", quoted, "model_dir;", "else", "sudo", "-n", "-u",
                         QuoteString(user), "sh", "-c", QuoteString(make), "-", quoted, "||", "exit", "1;", "fi;", "}")


# The site's secrets (container_secrets): files of root's that only root can read, in directories
# only root can change, all the way up. The deploy reads who owns them, never what they hold.
SECRET_MODES = ("600", "400")


def secret_fix(path: str) -> str:
    return f"sudo chown root: {path} && sudo chmod 600 {path}"


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


def sealed(secrets: dict[str, str]) -> StringCommand:
    """Shell that goes on only if every secret file is still as ``secret_refusal`` wants it (the
    guard of the command that mounts them, so no path is trusted from an earlier reading)."""
    parts: list = [checks("root"),
                   'secret() { regular "$1" && [ "$(stat -c %u -- "$1")" = 0 ] && case "$(stat -c %a -- "$1")" in '
                   f'{"|".join(SECRET_MODES)}) ;; *) return 1;; esac && d=$(dirname -- "$1") && real "$d" && '
                   'while closed "$d"; do [ "$d" = / ] && return 0; d=$(dirname -- "$d"); done; return 1; };']
    for name, path in sorted(secrets.items()):
        parts += ["secret", QuoteString(path), "||", "no", QuoteString(
            f"container_secrets.{name} = {path} is not a regular file of root's, mode 600 or 400, in directories only root can "
            f"change: nothing was started. Fix: {secret_fix(path)} (and sudo chmod go-w on each directory above it)"), ";"]
    return StringCommand(*parts)


def cache_kept(state_dir: str, cache: str, named: list[str], owner: str = "root") -> StringCommand:
    """Shell, before a start, that claims ``cache`` (an image's directory of caches, in the
    directory of caches under ``state_dir``) and prunes its siblings. Goes on only if state_dir is
    the deploy's (``claimed``); the directory of caches and ``cache`` each either exist as the
    deploy's (real, root's, writable by no one else, marked) or are made now and marked; anything
    else there is refused, nothing changed. Then every other directory there that the deploy made
    (real and marked) is removed unless the ``named`` stack files (compose.yaml: the stack in place,
    its previous one, the recorded states') mount it as a ``source:``. A directory without the
    marker is never removed, whatever its name. ``owner``: the user besides root trusted (root on a
    node, where root makes them)."""
    root = posixpath.dirname(cache)
    parts: list = [claimed(state_dir, "state_dir", owner), "&&"]
    for path in (root, cache):
        quoted, marker = QuoteString(path), QuoteString(f"{path}/{MANAGED_MARKER}")
        parts += ["if", "[", "-e", quoted, "]", "||", "[", "-L", quoted, "];", "then",
                  "real", quoted, "||", "not_real", quoted, "state_dir;", "closed", quoted, "||", "foreign", quoted, "state_dir;",
                  "marked", quoted, "||", "not_ours", quoted, "state_dir;",
                  "else", "mkdir", "-m", "755", "--", quoted, "&&", "mark", marker, "&&",
                  "echo", QuoteString(f"made {path}, marked {MANAGED_MARKER}"), "||", "exit", "1;", "fi;"]
    sources = StringCommand("cat", "--", *(QuoteString(path) for path in named), "2>/dev/null", "|", "sed", "-n",
                            QuoteString("s/^ *source: //p"))
    parts += ["named=$(", sources, ");",
              "for", "d", "in", StringCommand(QuoteString(root), "/*", _separator=""), ";", "do",
              "[", '"$d"', "=", QuoteString(cache), "]", "&&", "continue;",
              "{", "real", '"$d"', "&&", "marked", '"$d"', ";", "}", "||", "continue;",
              "printf", "'%s\\n'", '"$named"', "|", "grep", "-qxF", "--", '"$d"', "&&", "continue;",
              "rm", "-rf", "--", '"$d"', "&&", "echo", '"removed $d: the caches of an image no stack here names"', "||", "exit", "1;",
              "done"]
    return StringCommand(*parts)
