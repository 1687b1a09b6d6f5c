"""Secrets the programs read from files (the hub token, the API key): opened without following a
link, a regular file of at most 4 KiB holding one line of printable ASCII without spaces, and
refused otherwise with words that name the file, never what it holds. Text a library wrote,
which may hold the secret, is masked before it is printed."""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

MAX_BYTES = 4096
TOKEN = re.compile(rb"[!-~]+\n?")  # one line of printable ASCII, no space
MASK = "***"
KEY_FIX = "Fix: remove it and deploy again: the deploy writes a new key there (mode 600)"


class SecretError(Exception):
    """Why a secret's file was refused: it names the file, never its text."""


def kind(mode: int) -> str:
    return "a directory" if stat.S_ISDIR(mode) else "a pipe" if stat.S_ISFIFO(mode) else "a device or socket"


def read_secret(path: Path, what: str, fix: str) -> str:
    """The one line of the file at ``path`` (``what`` names it in a refusal, ``fix`` ends it)."""
    try:  # O_NONBLOCK: a pipe planted there is refused, not waited on
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        found = "a symbolic link" if error.errno == errno.ELOOP else f"unreadable ({error.strerror})"
        raise SecretError(f"{what} {path} is {found}. {fix}") from None
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise SecretError(f"{what} {path} is {kind(mode)}, not a regular file. {fix}")
        data = os.read(descriptor, MAX_BYTES + 1)
    finally:
        os.close(descriptor)
    if len(data) > MAX_BYTES:
        raise SecretError(f"{what} {path} holds more than {MAX_BYTES} bytes, not one token. {fix}")
    if not TOKEN.fullmatch(data):
        raise SecretError(f"{what} {path} does not hold exactly one line of printable ASCII without spaces. {fix}")
    return data.rstrip(b"\n").decode("ascii")


def masked(text: str, secret: str | None) -> str:
    """``text`` with every copy of ``secret`` replaced by ***."""
    return text.replace(secret, MASK) if secret else text
