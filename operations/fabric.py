"""Operations for the QSFP fabric: one netplan file of our own, for the CX-7 rails only."""

from __future__ import annotations

import posixpath
from io import StringIO
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from pyinfra import host, logger, state
from pyinfra.api import FileUploadCommand, OperationError, QuoteString, StringCommand, operation
from pyinfra.facts.files import File, FileContents
from pyinfra.operations.util.files import generate_color_diff

from facts.fabric import NetLinks, NetworkManagerDevices

STAGING_DIR = "/run/dual-spark/netplan-check"
TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).resolve().parents[1] / "templates"),
    undefined=StrictUndefined,
    keep_trailing_newline=True,
)


def render_netplan(hostname: str, peer: str, rails: list[dict], mtu: int) -> str:
    """The fabric's netplan YAML from templates/fabric/netplan.yaml.j2."""
    return TEMPLATES.get_template("fabric/netplan.yaml.j2").render(hostname=hostname, peer=peer, rails=rails, mtu=mtu)


@operation()
def netplan_rails(path: str, content: str, rails: list[dict], mtu: int, management_address: str):
    """
    Install a netplan file for the fabric rails and apply it, only when it changed. The new
    file is first checked by the real ``netplan generate`` beside the node's other netplan
    files in a staging root, and never installed or applied if that fails. The previous
    version is backed up next to it. An unchanged file is applied again only when a rail's
    live MTU or address drifted from it. Refuses a rail netdev that is absent or that carries
    the management address.

    + path: the netplan file (mode 600)
    + content: its YAML
    + rails: the rails it configures (``netdev`` and ``cidr`` of each)
    + mtu: the MTU it sets on them
    + management_address: the address pyinfra reaches this node on, never to be touched

    **Example:**

    .. code:: python

        netplan_rails(path="/etc/netplan/40-dual-spark.yaml", content=yaml, rails=rails,
                      mtu=9000, management_address="192.168.1.10")
    """
    links = host.get_fact(NetLinks)
    for rail in rails:
        netdev = rail["netdev"]
        if netdev not in links:
            present = ", ".join(sorted(name for name in links if name.startswith("en")))
            raise OperationError(f"{host.name}: no netdev {netdev!r} (present: {present}). "
                                 "Fix: set the rail's netdev in site.toml to one of this node's CX-7 interfaces.")
        if any(address.split("/")[0] == management_address for address in links[netdev]["ipv4"]):
            raise OperationError(f"{host.name}: {netdev} carries the management address {management_address}; "
                                 "refusing to reconfigure it. Fix: name the CX-7 fabric interfaces in site.toml, not the LAN one.")
    managed = {netdev: nm_state for netdev, nm_state in host.get_fact(NetworkManagerDevices).items()
               if netdev in {rail["netdev"] for rail in rails} and nm_state != "unmanaged"}
    if managed:
        logger.warning(f"{host.print_prefix}NetworkManager manages {', '.join(managed)}: it may undo this netplan "
                       "file. Consider `nmcli device set <netdev> managed no`.")

    current = host.get_fact(FileContents, path=path)
    desired = content.splitlines()
    if current == desired:
        if (host.get_fact(File, path=path) or {}).get("mode") != 600:
            yield StringCommand("chmod", "600", QuoteString(path))
        drift = live_drift(links, rails, mtu)
        if drift:
            host.log(f"{path} is up to date but the rails drifted ({'; '.join(drift)}): applying it again", logger.info)
            yield "netplan apply"
        else:
            host.noop(f"{path} is up to date and applied")
        return

    if state.config.DIFF:
        host.log(f"Will {'modify' if current else 'create'} {path}", logger.info)
        for line in generate_color_diff([line + "\n" for line in current or []], [line + "\n" for line in desired]):
            logger.info("  %s", line)
    staged = posixpath.join(STAGING_DIR, path.lstrip("/"))
    yield StringCommand("rm", "-rf", STAGING_DIR, "&&", "mkdir", "-p", posixpath.join(STAGING_DIR, "etc"),
                        "&&", "cp", "-a", "/etc/netplan", posixpath.join(STAGING_DIR, "etc/"))
    yield FileUploadCommand(StringIO(content), staged, remote_temp_filename=host.get_temp_filename(staged))
    yield StringCommand("chmod", "600", staged, "&&", "netplan", "generate", "--root-dir", STAGING_DIR)
    if current is not None:
        yield StringCommand("cp", "-p", path, f'{path}.bak-"$(date +%Y%m%d-%H%M%S)"')
    yield StringCommand("install", "-m", "600", "-o", "root", "-g", "root", staged, QuoteString(path))
    yield "netplan apply"
    yield StringCommand("rm", "-rf", STAGING_DIR)


def live_drift(links: dict, rails: list[dict], mtu: int) -> list[str]:
    """How the rails' live MTU and addresses differ from what the netplan file sets."""
    drift = []
    for rail in rails:
        link = links[rail["netdev"]]
        if link["mtu"] != mtu:
            drift.append(f"{rail['netdev']} MTU {link['mtu']}, not {mtu}")
        if rail["cidr"] not in link["ipv4"]:
            drift.append(f"{rail['netdev']} lacks {rail['cidr']}")
    return drift
