"""Readings of the runtime artifacts: the runtime image on a node, and the model's bytes."""

from __future__ import annotations

import json
from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts.combine import combined, split


class Image(TypedDict):
    id: str | None
    size: int | None
    smoke_tested: str | None
    speculative_keys: list[str] | None
    unreadable: list[str]


class ImageState(FactBase[Image]):
    """
    The ID and size in bytes of the image tagged ``tag`` (None where the node lacks it), the
    image ID the smoke test last passed for and the field names of that image's vLLM
    SpeculativeConfig it read (from ``marker``, the shell word layout.smoke_marker gives for the
    image's ID: the ID, then the names as JSON; None for a marker written before the names were read).

    .. code:: python

        {"id": "sha256:9e69ec7f2e68...", "size": 21474836480, "smoke_tested": "sha256:9e69ec7f2e68...",
         "speculative_keys": ["method", "num_speculative_tokens", ...], "unreadable": []}
    """

    @staticmethod
    def default() -> Image:
        return {"id": None, "size": None, "smoke_tested": None, "speculative_keys": None, "unreadable": []}

    def command(self, tag: str, marker: str) -> StringCommand:
        """One docker call for the ID and the size (each a section of its own, as the ID alone)."""
        return StringCommand("(", "i=$(docker", "image", "inspect", "-f", "'{{.Id}} {{.Size}}'", QuoteString(tag), "2>/dev/null);", combined({
            "id": StringCommand('echo "${i%% *}"'),
            "size": StringCommand('echo "${i#* }"'),
            "smoke": StringCommand("cat", marker, "2>/dev/null"),
        }), ")")

    def process(self, output: list[str]) -> Image:
        sections = split(output)

        def image_id(lines: list[str]) -> tuple[str | None, list[str]]:
            values = [line.strip() for line in lines if line.strip()]
            if len(values) == 1 and values[0].startswith("sha256:"):
                return values[0], []
            return None, values

        def names(lines: list[str]) -> tuple[list[str] | None, list[str]]:
            try:
                found = json.loads(lines[0]) if len(lines) == 1 else None
            except ValueError:
                found = None
            if isinstance(found, list) and all(isinstance(name, str) for name in found):
                return found, []
            return None, lines

        found, bad = image_id(sections.get("id", []))
        marker = [line.strip() for line in sections.get("smoke", []) if line.strip()]
        smoke, bad_smoke = image_id(marker[:1])
        keys, bad_keys = names(marker[1:]) if marker[1:] else (None, [])
        size = [line.strip() for line in sections.get("size", []) if line.strip()]
        known = len(size) == 1 and size[0].isdecimal()
        return {"id": found, "size": int(size[0]) if known else None, "smoke_tested": smoke, "speculative_keys": keys,
                "unreadable": sections[""] + bad + bad_smoke + bad_keys + ([] if known else size)}


class Token(TypedDict):
    mode: str
    owner: str
    kind: str  # stat's name for it: "regular file", "regular empty file", "symbolic link", "directory", ...


class Model(TypedDict):
    exists: bool
    free_bytes: int | None
    bytes: int
    manifest: dict | None
    verified: str | None
    changed: list[str]
    token: Token | None
    unreadable: list[str]


class ModelState(FactBase[Model]):
    """
    The model directory as `sync status` reads it without hashing: whether it exists, the free
    space (of the store where it does not), the bytes of the model's files it holds, the manifest (head) or the digest recorded as verified (worker), the files whose size
    or mtime moved since; and, given ``token_file``, what the deploy user sees there (stat run as
    that user, not following a link: mode, owner, kind; None where it sees nothing).

    .. code:: python

        {"exists": True, "free_bytes": 3221225472000, "bytes": 166798331904, "manifest": {"digest": "ab12...", "files": 52,
         "bytes": 166798331904, "source": {"repo": "...", "revision": "..."}}, "verified": None,
         "changed": [], "token": {"mode": "600", "owner": "spark", "kind": "regular file"}, "unreadable": []}
    """

    @staticmethod
    def default() -> Model:
        return {"exists": False, "free_bytes": None, "bytes": 0, "manifest": None, "verified": None, "changed": [],
                "token": None, "unreadable": []}

    def command(self, programs: str, model_dir: str, manifest: str, state: str, user: str, token_file: str | None = None) -> StringCommand:
        status = ["python3", QuoteString(programs), "sync", "status", "--dir", QuoteString(model_dir), "--state", QuoteString(state)]
        if manifest:
            status += ["--manifest", QuoteString(manifest)]
        sections: dict = {"status": StringCommand("test", "-f", QuoteString(programs), "&&", *status)}
        if token_file is not None:
            sections["token"] = StringCommand(token_path(user, token_file), "sudo", "-n", "-u", QuoteString(user), "stat", "-c",
                                              "'%a %U %F'", "--", '"$t"', "2>/dev/null")
        return combined(sections)

    def process(self, output: list[str]) -> Model:
        sections = split(output)
        reading = self.default()
        lines = [line for line in sections.get("status", []) if line.strip()]
        unreadable = list(sections[""])
        if lines:
            try:
                status = json.loads(lines[-1])
                reading.update({key: status[key] for key in ("exists", "free_bytes", "bytes", "manifest", "verified", "changed")})
            except (ValueError, KeyError, TypeError):
                unreadable += lines
        token = [line.strip() for line in sections.get("token", []) if line.strip()]
        fields = token[0].split(" ", 2) if len(token) == 1 else []
        if len(fields) == 3 and fields[0].isdecimal():
            reading["token"] = {"mode": fields[0], "owner": fields[1], "kind": fields[2]}
        else:
            unreadable += token
        reading["unreadable"] = unreadable
        return reading


TOKEN_KINDS = ("regular file", "regular empty file")  # what stat calls a regular file


def token_path(user: str, token_file: str) -> StringCommand:
    """Shell that sets $t to the token file: ``~/...`` in the deploy user's home (the only form the
    site takes)."""
    if not token_file.startswith("~/"):
        raise ValueError(f"hf_token_file = {token_file!r}: name it as ~/<path> in the deploy user's home")
    home = StringCommand('"$(getent passwd', QuoteString(user), '| cut -d: -f6)"')
    return StringCommand("t=", home, "/", QuoteString(token_file[2:]), ";", _separator="")


def token_refusal(token_file: str, user: str, token: Token | None) -> str | None:
    """Why the token file may not be used (None: it may, or there is none): only a regular file
    of the deploy user's, not a link."""
    if token is None or (token["kind"] in TOKEN_KINDS and token["owner"] == user):
        return None
    what = f"a {token['kind']}" if token["kind"] not in TOKEN_KINDS else f"owned by {token['owner']}, not {user}"
    return token_fix(token_file, user, what)


def token_fix(token_file: str, user: str, what: str) -> str:
    return (f"hf_token_file = {token_file} is {what}: the hub token must be a regular file owned by {user}, in its home, "
            f"never a link. Fix: as {user}, replace it with the token itself (hf auth login, or write the token there), "
            "or set hf_token_file in site.toml to such a file")
