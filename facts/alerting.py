"""Readings for the delivery of alerts, on the head, in one round trip: Alertmanager's package, the
files the deploy writes for it, its service's state, and its configuration as the diff may show it:
each webhook URL cut after its host on the node itself (``SHOWN``), so that a token in its path or
query never leaves the head."""

from __future__ import annotations

import re
from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts.combine import combined, split
from facts.host_prep import FileDigests, Files, Packages, PackageStatus
from facts.units import Service, units_command, units_read
from layout import ALERTMANAGER_CONFIG, UNIT_FILES, UNITS

PACKAGE = "prometheus-alertmanager"
# A webhook's line of alertmanager.yml as the diff shows it: the URL to its host, the rest cut. The
# same expression in POSIX ERE (sed -E, on the node) and in Python's re (``shown``, the deploy's side),
# so that an unchanged file shows no difference.
URL_LINE = r"^( *(- )?url: )(https?://[^/?#]*).*$"
SHOWN_AS = r"\1\3/(not shown)"


def shown(text: str) -> str:
    """alertmanager.yml as the diff shows it: each webhook URL cut after its host."""
    return re.sub(URL_LINE, SHOWN_AS, text, flags=re.M)


class Alertmanager(TypedDict):
    packages: Packages
    files: Files
    services: dict[str, Service]
    shown: list[str] | None  # alertmanager.yml's lines, each URL cut after its host; None: no such file
    unreadable: list[str]


class AlertmanagerState(FactBase[Alertmanager]):
    """
    On the head: whether dpkg has prometheus-alertmanager (PackageStatus), its drop-in and
    configuration (FileDigests), its service's state as systemctl says it, and the configuration's
    lines with every webhook URL cut after its host (``shown``), by sed on the head.

    .. code:: python

        {"packages": {"installed": ["prometheus-alertmanager"], "missing": [], "unreadable": []},
         "files": {"files": {"/etc/prometheus/dual-spark/alertmanager.yml": {"kind": "file", "mode": "640",
                                                                            "owner": "root:prometheus", ...}}, "unreadable": []},
         "services": {"prometheus-alertmanager": {"active": "active", "enabled": "enabled"}},
         "shown": ["# Managed by the dual-spark deploy ...", "route:", ..., "  - url: https://hooks.example.com/(not shown)"],
         "unreadable": []}
    """

    @staticmethod
    def default() -> Alertmanager:
        return {"packages": PackageStatus.default(), "files": FileDigests.default(), "services": {}, "shown": None, "unreadable": []}

    def command(self) -> StringCommand:
        return combined({
            "packages": PackageStatus().command([PACKAGE]),
            "files": FileDigests().command([UNIT_FILES["alertmanager"], ALERTMANAGER_CONFIG]),
            "services": units_command([UNITS["alertmanager"]]),
            "shown": StringCommand("test", "-f", ALERTMANAGER_CONFIG, "&&", "sed", "-E", QuoteString(f"s|{URL_LINE}|{SHOWN_AS}|"),
                                   ALERTMANAGER_CONFIG),
        })

    def process(self, output: list[str]) -> Alertmanager:
        sections = split(output)
        units, unreadable = units_read(sections.get("services", []))
        files = FileDigests().process(sections.get("files", []))
        there = (files["files"].get(ALERTMANAGER_CONFIG) or {}).get("kind") == "file"
        return {"packages": PackageStatus().process(sections.get("packages", [])), "files": files, "services": units,
                "shown": sections.get("shown", []) if there else None, "unreadable": sections[""] + unreadable}
