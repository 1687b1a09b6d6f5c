"""Operations for the QSFP fabric: one netplan file of our own, for the CX-7 rails only."""

from __future__ import annotations

import posixpath
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import OperationError, QuoteString, StringCommand, operation

from cluster import Cluster
from facts.fabric import FabricState, Link
from layout import RUN_DIR
from operations.managed import refuse_theirs
from operations.readings import Reading, plans, read
from operations.render import render, show_diff
from operations.upload import upload

STAGING_DIR = f"{RUN_DIR}/netplan-check"


@plans
def readings(cluster: Cluster, name: str) -> list[Reading]:
    return [(FabricState, {"path": cluster.settings.netplan_path})]


def render_netplan(hostname: str, others: list[str], rails: list[dict], mtu: int) -> str:
    """The fabric's netplan YAML from templates/fabric/netplan.yaml.j2."""
    return render("fabric/netplan.yaml.j2", hostname=hostname, others=others, rails=rails, mtu=mtu)


@operation()
def netplan_rails(path: str, rails: list[dict], mtu: int, hostname: str, others: list[str]):
    """
    Install a netplan file for the fabric rails and apply it, only when it changed. The file is
    rendered from the rails, then checked by the real ``netplan generate`` beside the node's
    other netplan files in a staging root, and never installed or applied if that fails. The
    previous version is backed up next to it; a file there the deploy did not write (no header of
    its own) is refused, never replaced. An unchanged file is applied again only when a
    rail's live MTU or address drifted from it. Refuses a rail netdev that is absent, or that
    carries the address this node is reached on (the management LAN, read from the node).

    + path: the netplan file (mode 600)
    + rails: the rails it configures (``netdev`` and ``cidr`` of each)
    + mtu: the MTU it sets on them
    + hostname, others: this node and the others of the cluster, named in the file's header

    **Example:**

    .. code:: python

        netplan_rails(path="/etc/netplan/40-dual-spark.yaml", rails=cluster.node(host.name).rail_data, mtu=9000,
                      hostname="spark-head", others=["spark-worker"])
    """
    current = read(host, FabricState, path=path)
    links = current["links"]["links"]
    management = current["reached_on"]["address"] or host.data.ssh_hostname
    for rail in rails:
        netdev = rail["netdev"]
        if netdev not in links:
            present = ", ".join(sorted(name for name in links if name.startswith("en")))
            raise OperationError(f"{host.name}: no netdev {netdev!r} (present: {present}). "
                                 "Fix: set the rail's netdev in site.toml to one of this node's CX-7 interfaces.")
        if any(address.split("/")[0] == management for address in links[netdev]["ipv4"]):
            raise OperationError(f"{host.name}: {netdev} carries the management address {management}; "
                                 "refusing to reconfigure it. Fix: name the CX-7 fabric interfaces in site.toml, not the LAN one.")
    managed = sorted(netdev for netdev, nm_state in current["network_manager"]["states"].items()
                     if netdev in {rail["netdev"] for rail in rails} and nm_state != "unmanaged")
    if managed:
        logger.warning(f"{host.print_prefix}NetworkManager manages {', '.join(managed)}: it may undo this netplan "
                       "file. Consider `nmcli device set <netdev> managed no`.")

    content = render_netplan(hostname, others, rails, mtu)
    installed = current["netplan"]["lines"]
    if installed == content.splitlines():
        if current["netplan"]["mode"] != "600":
            yield StringCommand("chmod", "600", QuoteString(path))
        drift = live_drift(links, rails, mtu)
        if drift:
            host.log(f"{path} is up to date but the rails drifted ({'; '.join(drift)}): applying it again", logger.info)
            yield "netplan apply"
        elif current["netplan"]["mode"] == "600":
            host.noop(f"{path} is up to date and applied")
        return

    refuse_theirs(path, installed, "root", "netplan_path")
    show_diff(path, installed, content)
    staged = posixpath.join(STAGING_DIR, path.lstrip("/"))
    yield StringCommand("rm", "-rf", STAGING_DIR, "&&", "mkdir", "-p", posixpath.join(STAGING_DIR, "etc"),
                        "&&", "cp", "-a", "/etc/netplan", posixpath.join(STAGING_DIR, "etc/"))
    yield from upload(StringIO(content), staged)
    yield StringCommand("chmod", "600", QuoteString(staged), "&&", "netplan", "generate", "--root-dir", STAGING_DIR)
    if installed is not None:
        yield StringCommand("cp", "-p", QuoteString(path), StringCommand(QuoteString(f"{path}.bak-"), '"$(date +%Y%m%d-%H%M%S)"', _separator=""))
    yield StringCommand("install", "-m", "600", "-o", "root", "-g", "root", QuoteString(staged), QuoteString(path))
    yield "netplan apply"
    yield StringCommand("rm", "-rf", STAGING_DIR)


def live_drift(links: dict[str, Link], rails: list[dict], mtu: int) -> list[str]:
    """How the rails' live MTU and addresses differ from what the netplan file sets."""
    drift = []
    for rail in rails:
        link = links[rail["netdev"]]
        if link["mtu"] != mtu:
            drift.append(f"{rail['netdev']} MTU {link['mtu']}, not {mtu}")
        if rail["cidr"] not in link["ipv4"]:
            drift.append(f"{rail['netdev']} lacks {rail['cidr']}")
    return drift
