"""The command-line layer every tool shares (bench.* and clients): parameter types that refuse a
bad argument while click parses, before anything is contacted or measured.

Each refusal is click's usage error, "Error: Invalid value for '--option': <what> Fix: <how>",
exit code 2, never a traceback. The types:

- PositiveIntList: comma-separated whole numbers from 1 to a bound (--concurrency 1,4).
- count / Bounded: whole or real numbers within bounds (a real NaN is refused too).
- Port: a TCP port, 1 to 65535.
- Schedule: a speculative schedule, JSON [[batch_start, batch_end, k], ...]; its shape, its
  order from batch size 1 and each k (0 to 16) checked as the site file's own is (site_schema).
- Placeholders: a command template whose {placeholders} are only the ones the tool fills in.
- Url, SshTarget, Name, TextFile, InputDir: an http(s) URL with a valid port, user@host[:port],
  a profile name, a file of UTF-8 text (an API or SSH key), a directory of results to read.
- site_option: --site, the site file loaded and validated (site_config.load_site) at parse time.
- OutputDir / OutputFile: an output proved writable (made, a file written and removed in it)
  before the run, never under /proc, /sys or /dev.
"""

from __future__ import annotations

import json
import math
import os
import re
import string
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import click

from bench.reference import ReferenceError, read_text
from site_config import SITE_ENV, SiteError, load_site, site_path
from site_schema import NAME, SCHEDULE_EXAMPLE, kind_ok, schedule_range, speculative_schedule

# Bounds shared by the tools: the site schema's own where it has one.
MAX_TOKENS = 16_777_216  # the longest max_model_len a profile may set
MAX_CONCURRENCY = 1024  # the most sequences a profile may batch (max_num_seqs)
MAX_ITEMS = 64  # values in one comma-separated list
KERNEL_TREES = ("/proc", "/sys", "/dev")


class PositiveIntList(click.ParamType):
    """Comma-separated whole numbers, each 1 to ``max``; a list of ints."""

    name = "list"

    def __init__(self, max: int, example: str = "1,4"):
        self.max, self.example = max, example

    def convert(self, value, param, ctx) -> list[int]:
        if isinstance(value, list):
            value = ",".join(map(str, value))
        parts = [part.strip() for part in str(value).split(",")]
        fix = f"Fix: write whole numbers from 1 to {self.max:,} separated by commas, e.g. {self.example}"
        if len(parts) > MAX_ITEMS:
            self.fail(f"{len(parts)} values, more than {MAX_ITEMS}. {fix}", param, ctx)
        numbers = []
        for part in parts:
            where = f" in {value!r}" if len(parts) > 1 else ""
            if not re.fullmatch(r"[0-9]+", part):
                self.fail(f"{part!r}{where} is not a whole number. {fix}", param, ctx)
            digits = part.lstrip("0") or "0"
            number = int(digits) if len(digits) <= len(str(self.max)) else None
            if number is None or not 1 <= number <= self.max:
                self.fail(f"{part}{where} is out of range. {fix}", param, ctx)
            numbers.append(number)
        return numbers


def count(max: int, min: int = 1) -> click.IntRange:
    """A whole number from ``min`` (1) to ``max``."""
    return click.IntRange(min, max)


class Bounded(click.FloatRange):
    """click.FloatRange that also refuses NaN (which compares false with every bound)."""

    def convert(self, value, param, ctx) -> float:
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number. Fix: give a number in the range {self._describe_range()}", param, ctx)
        return number


class Port(click.IntRange):
    """A TCP port, 1 to 65535."""

    name = "port"

    def __init__(self):
        super().__init__(1, 65535)

    def convert(self, value, param, ctx) -> int:
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            self.fail(f"{value!r} is not a TCP port. Fix: use a port from 1 to 65535", param, ctx)


class Schedule(click.ParamType):
    """A speculative schedule as JSON, checked as the site file checks one (site_schema): a list
    of [batch_start, batch_end, k] of whole numbers, in order from batch size 1 without gaps or
    overlaps, each k 0 to 16. Its fit with a profile is the tool's to check."""

    name = "schedule"
    SHAPE = f"Fix: write a JSON list of [batch_start, batch_end, k], '[[1, 1, 7], [2, 4, 3]]' ({SCHEDULE_EXAMPLE})"

    def convert(self, value, param, ctx) -> list[list[int]]:
        if isinstance(value, list):
            schedule = value
        else:
            try:
                schedule = json.loads(value)
            except (ValueError, RecursionError):
                self.fail(f"{value!r} is not JSON. {self.SHAPE}", param, ctx)
        if not isinstance(schedule, list) or not schedule:
            self.fail(f"{value!r} is not a list of ranges. {self.SHAPE}", param, ctx)
        for index, entry in enumerate(schedule):
            if not (isinstance(entry, list) and len(entry) == 3 and all(kind_ok(number, int) for number in entry)):
                self.fail(f"range {index + 1}, {json.dumps(entry)}, is not three whole numbers. {self.SHAPE}", param, ctx)
            problem = schedule_range(entry)
            if problem:
                self.fail(f"range {index + 1}, {json.dumps(entry)}: Fix: {problem}", param, ctx)
        problem = speculative_schedule(schedule)
        if problem:
            self.fail(f"{json.dumps(schedule)}: Fix: {problem}", param, ctx)
        return schedule


class Placeholders(click.ParamType):
    """A command template (str.format) whose placeholders are only ``names``, each plain
    ({first}, no conversion, format spec or index): an unknown one is refused before the run."""

    name = "template"

    def __init__(self, *names: str):
        self.names = names

    def convert(self, value, param, ctx) -> str:
        known = ", ".join(f"{{{name}}}" for name in self.names)
        fix = f"Fix: use only {known}; write a literal brace as {{{{ or }}}}"
        try:
            fields = [(name, conversion, spec) for _, name, spec, conversion in string.Formatter().parse(value) if name is not None]
        except ValueError as error:
            self.fail(f"{value!r}: {error}. {fix}", param, ctx)
        for name, conversion, spec in fields:
            if name not in self.names:
                self.fail(f"unknown placeholder {{{name}}} in {value!r}. {fix}", param, ctx)
            if conversion or spec:
                self.fail(f"{{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}} in {value!r}: "
                          f"write the placeholder plainly, {{{name}}}. {fix}", param, ctx)
        return value


class Url(click.ParamType):
    """An http:// or https:// URL with a host and, if any, a port from 1 to 65535."""

    name = "url"

    def convert(self, value, param, ctx) -> str:
        fix = "Fix: give the API's base URL, e.g. http://127.0.0.1:8888"
        if re.search(r"[\s\x00-\x1f\x7f]", value):
            self.fail(f"{value!r} holds spaces or control characters. {fix}", param, ctx)
        try:
            parsed = urlparse(value)
        except ValueError:  # an unclosed [IPv6 address
            parsed = urlparse("")
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            self.fail(f"{value!r} is not an http:// or https:// URL with a host. {fix}", param, ctx)
        try:
            port = parsed.port
        except ValueError:
            port = 0
        if port == 0:
            self.fail(f"{value!r}: its port is not one from 1 to 65535. {fix}", param, ctx)
        return value


class SshTarget(click.ParamType):
    """``user@host[:port]`` as bench.remote.Target parses it, the port 1 to 65535."""

    name = "user@host[:port]"
    PATTERN = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_.-]{0,31}@)?[A-Za-z0-9][A-Za-z0-9.-]{0,252}(?::([0-9]{1,5}))?")

    def convert(self, value, param, ctx) -> str:
        match = self.PATTERN.fullmatch(value)
        if not match or not 1 <= int(match.group(1) or 22) <= 65535:
            self.fail(f"{value!r} is not user@host or user@host:port (port 1 to 65535). Fix: e.g. spark@spark-head", param, ctx)
        return value


class Name(click.ParamType):
    """A profile name as the site file takes one (it becomes part of a file name)."""

    name = "name"

    def convert(self, value, param, ctx) -> str:
        if not NAME.fullmatch(value):
            self.fail(f"{value!r} is not a profile name. Fix: use lower-case letters, digits, '-' and '_', "
                      "at most 40, e.g. adaptive", param, ctx)
        return value


class TextFile(click.ParamType):
    """A file that exists and reads as UTF-8 text (an API key file); its path as given."""

    name = "file"

    def convert(self, value, param, ctx) -> str:
        path = Path(value).expanduser()
        if not path.exists():  # False for a path holding a NUL byte too
            self.fail(f"{value}: no such file. Fix: give the file holding it", param, ctx)
        try:
            read_text(path, "Fix: give the file holding it alone, as text")
        except ReferenceError as error:
            self.fail(str(error), param, ctx)
        return value


class InputDir(click.ParamType):
    """A directory that exists (results to read); a Path."""

    name = "directory"

    def convert(self, value, param, ctx) -> Path:
        path = Path(value).expanduser()
        if "\x00" in str(value) or not path.is_dir():
            what = "is not a directory" if path.exists() else "does not exist"
            self.fail(f"{value!r} {what}. Fix: give the directory holding the results", param, ctx)
        return path


class SiteFile(click.ParamType):
    """A site file, loaded and validated as the deploy does; a problem is a usage error."""

    name = "file"

    def convert(self, value, param, ctx):
        if not isinstance(value, (str, os.PathLike)):
            return value  # already loaded
        try:
            return load_site(Path(value).expanduser())
        except SiteError as error:
            self.fail(str(error), param, ctx)


def site_option(default: bool = True, help: str | None = None):
    """``--site`` as the Cluster it describes (parameter ``cluster``), loaded before the other
    options are read (eager). With ``default``, the deploy's own site file when not given
    ($DUAL_SPARK_SITE, else site.toml); without, None."""
    return click.option(
        "--site", "cluster", type=SiteFile(), is_eager=True, default=(lambda: str(site_path())) if default else None,
        help=help or f"Site file (default: ${SITE_ENV}, else site.toml, as inventory.py).")


def _refuse(option: str, message: str):
    raise click.BadParameter(message, param_hint=f"'{option}'")


def _path(value, option: str, fix: str) -> Path:
    if "\x00" in str(value):
        _refuse(option, f"{value!r} holds a NUL byte, which no path can. {fix}")
    return Path(value).expanduser()


def _kernel_tree(path: Path, option: str, fix: str) -> str | None:
    try:
        real = path.resolve()
    except (OSError, RuntimeError) as error:  # a symlink loop
        _refuse(option, f"{path} cannot be followed ({error}). {fix}")
    return next((tree for tree in KERNEL_TREES if real == Path(tree) or real.is_relative_to(tree)), None)


def writable_directory(value, option: str = "--out", mode: int = 0o777) -> Path:
    """``value`` as a directory this process can write: made (mkdir -p) if missing, a temporary
    file created and removed in it. Refused (click.BadParameter naming ``option``) under /proc,
    /sys or /dev, where a file is in the way, or where it cannot be made or written."""
    fix = f"Fix: give {option} a directory you can write"
    path = _path(value, option, fix)
    tree = _kernel_tree(path, option, fix)
    if tree:
        _refuse(option, f"{value} is under {tree}, the kernel's, not a place for results. {fix}")
    blocker = next((p for p in (path, *path.parents) if p.exists() or p.is_symlink()), None)
    if blocker is not None and not blocker.is_dir():
        what = "exists and is not a directory" if blocker == path else f"cannot be made: {blocker} is a file, not a directory"
        _refuse(option, f"{value} {what}. {fix}")
    try:
        path.mkdir(parents=True, exist_ok=True, mode=mode)
    except OSError as error:
        _refuse(option, f"{value} cannot be made ({error.strerror}). {fix}")
    try:
        handle, probe = tempfile.mkstemp(dir=path, prefix=".writable-")
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        _refuse(option, f"{value}: cannot write in it ({error.strerror}). {fix}")
    return path


def writable_file(value, option: str, overwrite: bool = False) -> Path:
    """``value`` as a file to write: never under /proc, /sys or /dev, not a directory, not an
    existing file unless ``overwrite``; its directory made and proved writable."""
    fix = f"Fix: give {option} a new file in a directory you can write"
    path = _path(value, option, fix)
    tree = _kernel_tree(path, option, fix)
    if tree:
        _refuse(option, f"{value} is under {tree}, the kernel's, not a place for results. {fix}")
    if path.is_dir():
        _refuse(option, f"{value} is a directory. {fix}")
    blocker = next((p for p in path.parents if p.exists() or p.is_symlink()), None)
    if blocker is not None and not blocker.is_dir():
        _refuse(option, f"{value} cannot be made: {blocker} is a file, not a directory. {fix}")
    if path.exists() or path.is_symlink():
        if not overwrite:
            _refuse(option, f"{value} exists and would be overwritten. {fix}, or remove this one")
        if not path.is_file() or not os.access(path, os.W_OK):
            _refuse(option, f"{value} is not a regular file this user can write. {fix}")
    writable_directory(path.parent, option)
    return path


class OutputDir(click.ParamType):
    """An output directory, proved writable at parse time (writable_directory)."""

    name = "directory"

    def __init__(self, mode: int = 0o777):
        self.mode = mode

    def convert(self, value, param, ctx) -> Path:
        return writable_directory(value, param.opts[0] if param else "--out", self.mode)


class OutputFile(click.ParamType):
    """An output file, checked at parse time (writable_file)."""

    name = "file"

    def __init__(self, overwrite: bool = False):
        self.overwrite = overwrite

    def convert(self, value, param, ctx) -> Path:
        return writable_file(value, param.opts[0] if param else "--out", self.overwrite)


def git_revision() -> str:
    """The checkout's commit, recorded beside every result."""
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    return result.stdout.strip() or "unknown"
