"""Readings of a node's serving stack: its files, its container, the RoCE GID it must name, the
model's attention heads, the site's secret files (who owns them, never what they hold)."""

from __future__ import annotations

import json
import re
from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts.combine import combined, part, read_lines, split
from facts.fabric import Rdma, RdmaDevices
from layout import CONTAINER, LABELS, RECORD_STATE, RECORDS

LABEL = '{{index .Config.Labels "%s"}}'
INSPECT = "|".join(["{{.Id}}", "{{.State.Status}}", "{{.State.StartedAt}}", "{{.RestartCount}}", LABEL % LABELS["stack"],
                    LABEL % LABELS["profile"], "{{.Image}}", '{{with index .State "Health"}}{{.Status}}{{end}}', "{{.State.ExitCode}}",
                    "{{.State.FinishedAt}}"])


class Container(TypedDict):
    id: str
    status: str
    started: str
    restarts: int
    stack: str
    profile: str
    image: str
    health: str
    exit_code: int
    finished: str


class Serving(TypedDict):
    compose: list[str] | None
    launch: list[str] | None
    container: Container | None
    rdma: Rdma
    api_key: bool
    model_digest: str | None
    records: dict[str, dict | None]
    unreadable: list[str]


def record_sections(stack_dir: str) -> dict[str, StringCommand]:
    """The state.json of each record in stack_dir (layout.RECORDS): the states that served."""
    return {name: StringCommand("cat", QuoteString(f"{stack_dir}/{name}/{RECORD_STATE}"), "2>/dev/null") for name in RECORDS}


def records_reading(sections: dict[str, list[str]]) -> tuple[dict[str, dict | None], list[str]]:
    """Each record's state (None where there is none), and the lines that did not read."""
    records, unreadable = {}, []
    for name in RECORDS:
        found = [line for line in sections.get(name, []) if line.strip()]
        try:
            value = json.loads(found[-1]) if found else None
        except ValueError:
            value = None
        if found and not (isinstance(value, dict) and isinstance(value.get("cluster"), str) and isinstance(value.get("stack"), str)):
            value, unreadable = None, unreadable + found
        records[name] = value
    return records, unreadable


def stack_sections(stack_dir: str, key_file: str, model_record: str) -> dict[str, StringCommand]:
    """The sections of ServingState other than the RDMA tree (verification reads that once)."""
    def lines_of(name: str) -> StringCommand:
        path = QuoteString(f"{stack_dir}/{name}")
        return StringCommand("test", "-f", path, "&&", "echo", "present", "&&", "cat", path)

    return {
        "compose": lines_of("compose.yaml"),
        "launch": lines_of("launch.sh"),
        "container": container_command(),
        "api_key": StringCommand("test", "-s", QuoteString(key_file), "&&", "echo", "present"),
        "model_digest": StringCommand("sed", "-n", QuoteString(r's/^ *"digest": "\([0-9a-f]*\)".*/\1/p'), QuoteString(model_record),
                                      "2>/dev/null"),
        **record_sections(stack_dir),
    }


def container_command() -> StringCommand:
    return StringCommand("docker", "inspect", "-f", QuoteString(INSPECT), CONTAINER, "2>/dev/null")


def container_reading(lines: list[str]) -> tuple[Container | None, list[str]]:
    """The container from `container_command`'s output (None where there is none), and the
    lines that did not read."""
    found = [line for line in lines if line.strip()]
    if not found:
        return None, []
    fields = found[-1].split("|")
    if len(fields) != 10 or not fields[3].isdecimal() or not fields[8].lstrip("-").isdecimal():
        return None, found
    return {"id": fields[0], "status": fields[1], "started": fields[2], "restarts": int(fields[3]), "stack": fields[4],
            "profile": fields[5], "image": fields[6], "health": fields[7], "exit_code": int(fields[8]),
            "finished": fields[9]}, []


class ServingState(FactBase[Serving]):
    """
    A node's stack files in ``stack_dir`` (their lines, None where absent), its vLLM container
    (None where there is none), the RDMA devices (for the RoCE v2 GID index NCCL must use),
    whether the API key file exists (never its content), and the digest of the model in
    ``model_record`` (the head's manifest: the stack names the model it serves); ``records``: the
    state of each record of a state that served (``RECORDS``; None where there is none).

    .. code:: python

        {"compose": ["# Managed by ...", "..."], "launch": ["#!/bin/sh", "..."],
         "container": {"id": "4f1c...", "status": "running", "started": "2026-11-29T20:01:02.5Z", "restarts": 0,
                       "stack": "9d2e...", "profile": "adaptive", "image": "sha256:5ebd...", "health": "healthy",
                       "exit_code": 0, "finished": "0001-01-01T00:00:00Z"},
         "rdma": {...RdmaDevices...}, "api_key": True, "model_digest": "e83a3654f563...",
         "records": {"served": {"cluster": "5c1f...", "stack": "9d2e...", "profile": "adaptive", "image": "dual-spark/...",
                                "image_id": "sha256:5ebd...", "model": {"repo": "...", "revision": "..."},
                                "model_digest": "e83a3654f563", "since": "2026-11-29T20:03:40Z"}, "rollback": None},
         "unreadable": []}
    """

    @staticmethod
    def default() -> Serving:
        return {"compose": None, "launch": None, "container": None, "rdma": RdmaDevices.default(), "api_key": False,
                "model_digest": None, "records": dict.fromkeys(RECORDS), "unreadable": []}

    def command(self, stack_dir: str, key_file: str, model_record: str) -> StringCommand:
        return combined({**stack_sections(stack_dir, key_file, model_record), "rdma": RdmaDevices().command()})

    def process(self, output: list[str]) -> Serving:
        sections = split(output)
        reading = self.default()
        unreadable = list(sections[""])
        for name in ("compose", "launch"):
            lines = sections.get(name, [])
            if lines[:1] == ["present"]:
                reading[name] = lines[1:]
        reading["container"], bad = container_reading(sections.get("container", []))
        unreadable += bad
        reading["rdma"] = RdmaDevices().process(part(sections, "rdma"))
        reading["api_key"] = [line.strip() for line in sections.get("api_key", [])] == ["present"]
        digest = [line.strip() for line in sections.get("model_digest", []) if line.strip()]
        if len(digest) == 1 and re.fullmatch(r"[0-9a-f]{64}", digest[0]):
            reading["model_digest"] = digest[0]
        else:
            unreadable += digest
        reading["records"], bad = records_reading(sections)
        reading["unreadable"] = unreadable + bad
        return reading


class Files(TypedDict):
    compose: list[str] | None
    launch: list[str] | None
    unreadable: list[str]


class RecordFiles(FactBase[Files]):
    """
    The stack files of record ``record`` in ``stack_dir`` (layout.RECORDS): their lines, None
    where absent.

    .. code:: python

        {"compose": ["# Managed by ...", "..."], "launch": ["#!/bin/sh", "..."], "unreadable": []}
    """

    @staticmethod
    def default() -> Files:
        return {"compose": None, "launch": None, "unreadable": []}

    def command(self, stack_dir: str, record: str) -> StringCommand:
        return combined({part_name: StringCommand("test", "-f", QuoteString(f"{stack_dir}/{record}/{file}"), "&&", "echo", "present",
                                                  "&&", "cat", QuoteString(f"{stack_dir}/{record}/{file}"))
                         for part_name, file in (("compose", "compose.yaml"), ("launch", "launch.sh"))})

    def process(self, output: list[str]) -> Files:
        sections = split(output)
        files = {name: lines[1:] if (lines := sections.get(name, []))[:1] == ["present"] else None for name in ("compose", "launch")}
        return {**files, "unreadable": sections[""]}


# Where vLLM 0.32 reads the KV head count (ModelArchConfigConvertor.get_total_num_kv_heads), in its order.
KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", "num_attention_groups")


class Heads(TypedDict):
    attention_heads: int | None
    kv_heads: int | None
    unreadable: list[str]


class ModelHeads(FactBase[Heads]):
    """
    The attention and KV head counts in the ``config.json`` of the model in ``model_dir`` (its
    ``text_config`` where it has one), as vLLM reads them: without a KV count, every attention
    head is one. None counts without a config.json, or where it does not read (its first lines
    then in ``unreadable``).

    .. code:: python

        {"attention_heads": 64, "kv_heads": 8, "unreadable": []}
    """

    @staticmethod
    def default() -> Heads:
        return {"attention_heads": None, "kv_heads": None, "unreadable": []}

    def command(self, model_dir: str) -> StringCommand:
        return StringCommand("cat", QuoteString(f"{model_dir}/config.json"), "2>/dev/null", "||", "true")

    def process(self, output: list[str]) -> Heads:
        reading = self.default()
        try:
            config = json.loads("\n".join(output) or "{}")
            config = config.get("text_config") or config
            heads = count(config.get("num_attention_heads"))
            kv = next((config[key] for key in KV_HEAD_KEYS if config.get(key) is not None), heads)
        except (ValueError, AttributeError):
            return {**reading, "unreadable": output[:3]}
        return {**reading, "attention_heads": heads, "kv_heads": count(kv)}


def count(value) -> int | None:
    """A positive head count, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


class Holder(TypedDict):
    path: str
    mode: str
    owner: str


class SecretFile(TypedDict):
    kind: str  # stat's name for it, not following a link ("regular file", "symbolic link", ...), or "absent"
    mode: str | None
    owner: str | None
    directory: str | None  # where realpath resolves its directory (None: absent)
    above: list[Holder]  # its directory and every one above it, up to /


class Secrets(TypedDict):
    files: dict[str, SecretFile]
    unreadable: list[str]


class SecretFiles(FactBase[Secrets]):
    """
    Who owns each secret file in ``paths`` and every directory above it, and their modes, as
    `stat` says without following a link; never what a file holds (not even its hash).

    .. code:: python

        {"files": {"/etc/dual-spark/secrets/wandb": {
            "kind": "regular file", "mode": "600", "owner": "root", "directory": "/etc/dual-spark/secrets",
            "above": [{"path": "/etc/dual-spark/secrets", "mode": "700", "owner": "root"},
                      {"path": "/etc/dual-spark", "mode": "755", "owner": "root"}, {"path": "/etc", "mode": "755", "owner": "root"},
                      {"path": "/", "mode": "755", "owner": "root"}]}},
         "unreadable": []}
    """

    @staticmethod
    def default() -> Secrets:
        return {"files": {}, "unreadable": []}

    def command(self, paths: list[str]) -> StringCommand:
        return StringCommand(
            "for p in", *(QuoteString(p) for p in paths), "; do", 'echo "path $p";',
            "stat -c 'file %a %U %F' -- \"$p\" 2>/dev/null;", 'd=$(dirname -- "$p");',
            'echo "directory $(realpath -e -- "$d" 2>/dev/null)";',
            "while :; do stat -c 'above %a %U %n' -- \"$d\" 2>/dev/null;", '[ "$d" = / ] && break; d=$(dirname -- "$d"); done;',
            "done",
        )

    def process(self, output: list[str]) -> Secrets:
        files: dict[str, SecretFile] = {}
        current: list[SecretFile] = []

        def parse(line: str) -> None:
            kind, _, rest = line.partition(" ")
            if kind == "path" and rest.startswith("/"):
                files[rest] = {"kind": "absent", "mode": None, "owner": None, "directory": None, "above": []}
                current[:] = [files[rest]]
                return
            info = current[0]
            if kind == "file":
                mode, owner, what = rest.split(" ", 2)
                if not mode.isdecimal():
                    raise ValueError(line)
                info.update({"kind": what, "mode": mode, "owner": owner})
            elif kind == "directory":
                info["directory"] = rest or None
            elif kind == "above":
                mode, owner, path = rest.split(" ", 2)
                if not mode.isdecimal() or not path.startswith("/"):
                    raise ValueError(line)
                info["above"].append({"path": path, "mode": mode, "owner": owner})
            else:
                raise ValueError(line)

        unreadable = read_lines(output, parse)
        return {"files": files, "unreadable": unreadable}
