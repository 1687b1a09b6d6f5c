"""Readings of the model store: its directories, and which of them the stack files mount."""

from __future__ import annotations

from typing import TypedDict

import yaml
from pyinfra.api import FactBase, QuoteString, StringCommand

from facts.combine import combined, split
from layout import IN_CONTAINER, MANAGED_MARKER, STORE_ENTRY

FILE = "@@file "  # the line before each stack file's text


class Store(TypedDict):
    entries: dict[str, bool]
    mounted: list[str]
    unreadable: list[str]


class StoreState(FactBase[Store]):
    """
    The directories directly in the model store ``model_dir`` named as its entries are
    (``layout.STORE_ENTRY``), each with whether it is the deploy's (a real directory of root's or
    of the store's owner, writable by no one else, holding its marker, also theirs); and the host paths that any file named ``compose.yaml*`` under ``stack_dir`` (the
    stack, the one before it, rollback records) mounts at /model in a container. A stack file that
    does not read as YAML is named in ``unreadable``.

    .. code:: python

        {"entries": {"lab-tiny-llama-9c1e0f2a7b3d-832a99825131": True, "big-c03b0711ea65": False},
         "mounted": ["/var/lib/dual-spark/model/lab-tiny-llama-9c1e0f2a7b3d-832a99825131"], "unreadable": []}
    """

    @staticmethod
    def default() -> Store:
        return {"entries": {}, "mounted": [], "unreadable": []}

    def command(self, model_dir: str, stack_dir: str) -> StringCommand:
        marker = MANAGED_MARKER
        ours = 'ours() { case "$(stat -c %u -- "$1")" in 0|"$(stat -c %u .)") ;; *) return 1;; esac; }; '
        entries = (ours + 'for e in *; do if [ -d "$e" ] && [ ! -L "$e" ] && ours "$e" && [ $((0$(stat -c %a -- "$e") & 022)) -eq 0 ] '
                   '&& [ -f "$e/' + marker + '" ] && [ ! -L "$e/' + marker + '" ] && ours "$e/' + marker + '"; '
                   'then echo "marked $e"; elif [ -e "$e" ] || [ -L "$e" ]; then echo "other $e"; fi; done')
        stacks = ('for f; do echo "' + FILE + '$f"; cat -- "$f"; echo; done')
        return combined({
            "entries": StringCommand("cd", QuoteString(model_dir), "2>/dev/null", "&&", entries),
            "stacks": StringCommand("find", QuoteString(stack_dir), "-name", "'compose.yaml*'", "-type", "f", "-exec", "sh", "-c",
                                    QuoteString(stacks), "-", "{}", "+", "2>/dev/null"),
        })

    def process(self, output: list[str]) -> Store:
        sections = split(output)
        reading = self.default()
        for line in sections.get("entries", []):
            kind, _, name = line.partition(" ")
            if kind in ("marked", "other") and STORE_ENTRY.fullmatch(name):
                reading["entries"][name] = kind == "marked"
        files: list[tuple[str, list[str]]] = []
        for line in sections.get("stacks", []):
            if line.startswith(FILE):
                files.append((line[len(FILE):], []))
            elif files:
                files[-1][1].append(line)
        for path, lines in files:
            try:
                services = (yaml.safe_load("\n".join(lines)) or {}).get("services") or {}
                for service in services.values():
                    for volume in service.get("volumes") or []:
                        source, target = (volume.get("source"), volume.get("target")) if isinstance(volume, dict) else (volume.split(":") + [""])[:2]
                        if target == IN_CONTAINER["model"] and source not in reading["mounted"]:
                            reading["mounted"].append(source)
            except (yaml.YAMLError, AttributeError, TypeError):
                reading["unreadable"].append(path)
        reading["unreadable"] += sections[""]
        return reading
