"""Uploads through a directory no other local user can enter. pyinfra's own temporary name is a
hash of the destination under /tmp, which any local user can create first (mode 0666) and so
write what root then copies into place. Here root makes ``RUN_DIR`` (root's, mode 755) and in it
``UPLOAD_DIR``, the deploy user's, mode 700, just before each upload; the file lands there over
SFTP as that user, then pyinfra copies it into place as root."""

from __future__ import annotations

import hashlib
import posixpath
from typing import IO

from pyinfra import host
from pyinfra.api import FileUploadCommand, QuoteString, StringCommand

from layout import RUN_DIR

UPLOAD_DIR = f"{RUN_DIR}/upload"


def private_dir() -> StringCommand:
    """Shell (as root) that makes or keeps ``UPLOAD_DIR`` the deploy user's alone."""
    return StringCommand("install", "-d", "-m", "755", "-o", "root", "-g", "root", RUN_DIR, "&&",
                         "install", "-d", "-m", "700", "-o", QuoteString(host.data.cluster.deploy_user), UPLOAD_DIR)


def temporary(dest: str) -> str:
    """Where the upload to ``dest`` lands first: one name per destination, in ``UPLOAD_DIR``."""
    return posixpath.join(UPLOAD_DIR, hashlib.sha256(dest.encode()).hexdigest()[:16])


def upload(src: str | IO, dest: str) -> list:
    """The commands that put ``src`` (a local path or a file object) at ``dest``."""
    return [private_dir(), FileUploadCommand(src, dest, remote_temp_filename=temporary(dest))]
