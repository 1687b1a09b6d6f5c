"""Readings for observability, in one round trip: the packages, the files the deploy writes for
them, their services' state, and on the head Grafana's container when the site runs one."""

from __future__ import annotations

from typing import TypedDict

from pyinfra.api import FactBase, StringCommand

from facts.combine import combined, split
from facts.host_prep import FileDigests, Files, Packages, PackageStatus
from facts.units import Service, units_command, units_read
from layout import COLLECTOR_USER, GRAFANA_PROJECT, PROMETHEUS_DIR, TEXTFILE_DIR, UNIT_FILES, UNITS

PACKAGES = {"head": ["prometheus", "prometheus-node-exporter"], "worker": ["prometheus-node-exporter"]}
CONFIG_FILES = ("prometheus.yml", "recording.yml", "alerts.yml", "objectives.yml")  # in PROMETHEUS_DIR
GRAFANA_CONTAINER = GRAFANA_PROJECT


def services(role: str) -> list[str]:
    """The units of a node of ``role``: the node exporter and the collector, and Prometheus and the
    watch of the answers on the head."""
    return [UNITS["prometheus"]] * (role == "head") + [UNITS["node_exporter"], UNITS["collector"]] + [UNITS["answers"]] * (role == "head")


def config_paths(role: str) -> list[str]:
    """The files the deploy writes for observability on a node of ``role``, and the collector's directory."""
    units = ([UNIT_FILES["prometheus"]] * (role == "head") + [UNIT_FILES["node_exporter"], UNIT_FILES["collector"]]
             + [UNIT_FILES["answers"]] * (role == "head"))
    return units + [f"{PROMETHEUS_DIR}/{name}" for name in CONFIG_FILES] * (role == "head") + [TEXTFILE_DIR]


class Grafana(TypedDict):
    files: Files
    container: str | None  # the container's state ("running", "exited", ...); None: no such container


class Observability(TypedDict):
    packages: Packages
    files: Files
    collector_user: bool  # whether the collector's own system user exists
    services: dict[str, Service]
    grafana: Grafana | None
    unreadable: list[str]


class ObservabilityState(FactBase[Observability]):
    """
    For a node of ``role``: which of its packages dpkg has (PackageStatus), the files the deploy
    writes for them (FileDigests: the units' drop-ins, the collector's unit and directory,
    Prometheus's configuration on the head), whether the collector's user exists, and each
    service's state as systemctl says it. With ``grafana``
    (the head's Grafana files, when the site runs Grafana): those files and the container's state.

    .. code:: python

        {"packages": {"installed": ["prometheus", "prometheus-node-exporter"], "missing": [], "unreadable": []},
         "files": {"files": {"/etc/prometheus/dual-spark/prometheus.yml": {"kind": "file", "mode": "644", ...}}, "unreadable": []},
         "collector_user": True,
         "services": {"prometheus": {"active": "active", "enabled": "enabled"}, ...},
         "grafana": None, "unreadable": []}
    """

    @staticmethod
    def default() -> Observability:
        return {"packages": PackageStatus.default(), "files": FileDigests.default(), "collector_user": False, "services": {},
                "grafana": None, "unreadable": []}

    def command(self, role: str, grafana: list[str] | None = None) -> StringCommand:
        sections = {
            "packages": PackageStatus().command(PACKAGES[role]),
            "files": FileDigests().command(config_paths(role)),
            "collector_user": StringCommand("getent", "passwd", COLLECTOR_USER, "|", "cut", "-d:", "-f1"),
            "services": units_command(services(role)),
        }
        if grafana is not None:
            sections["grafana"] = FileDigests().command(grafana)
            sections["grafana_container"] = StringCommand("docker", "inspect", "-f", "'{{.State.Status}}'", GRAFANA_CONTAINER,
                                                          "2>/dev/null")
        return combined(sections)

    def process(self, output: list[str]) -> Observability:
        sections = split(output)
        units, unreadable = units_read(sections.get("services", []))
        grafana = None
        if "grafana" in sections:
            state = [line.strip() for line in sections.get("grafana_container", []) if line.strip()]
            grafana = {"files": FileDigests().process(sections["grafana"]), "container": state[-1] if state else None}
        return {"packages": PackageStatus().process(sections.get("packages", [])), "files": FileDigests().process(sections.get("files", [])),
                "collector_user": COLLECTOR_USER in [line.strip() for line in sections.get("collector_user", [])], "services": units, "grafana": grafana, "unreadable": sections[""] + unreadable}
