"""Fabric benchmark between two Sparks of a site file (the head and rank 1 unless --pair names
two others), run from the control machine.

Per rail: a don't-fragment ping at MTU-28, iperf3 in both directions (JSON), ib_write_bw;
then ib_write_bw on every rail at once, and NCCL all_reduce_perf across the pair when the
binary is on the first node (flagged below 21.875 GB/s bus bandwidth, and at the ~2 GB/s of a
TCP fallback). Every tool's raw output is kept beside the JSON.

    python -m bench.fabric [--site site.toml] [--pair spark-1,spark-3] [--seconds 10] [--out bench/results]
"""

from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime
from pathlib import Path

import click

from bench import cli
from bench.parsers import parse_all_reduce_perf, parse_ib_write_bw, parse_iperf3, parse_ping
from bench.remote import Target, connect, run
from cluster import Cluster, Node
from facts.fabric import RdmaDevices, roce_v2_gid_index

SCHEMA_VERSION = 2  # 2: the pair measured is named, each rail holds both nodes' netdevs
IPERF_PORT, IB_PORT = 5201, 18515
NCCL_COMMAND = (
    "mpirun -np 2 -H {first},{second} --bind-to none -x NCCL_IB_HCA={hcas} -x NCCL_IB_GID_INDEX={gid} "
    "-x NCCL_SOCKET_IFNAME={ifname} -x NCCL_NET=IB all_reduce_perf -b 8 -e 1G -f 2 -g 1"
)
NCCL_PLACEHOLDERS = ("first", "second", "hcas", "gid", "ifname")  # what Fabric.nccl fills in


class Fabric:
    """SSH sessions to two nodes and the rails between them: the first measures, the second
    answers (iperf3 and ib_write_bw servers)."""

    def __init__(self, cluster: Cluster, pair: tuple[Node, Node], out: Path):
        self.out = out
        self.pair = pair
        key = os.path.expanduser(cluster.ssh_key) if cluster.ssh_key else None
        known_hosts = os.path.expanduser(cluster.known_hosts) if cluster.known_hosts else None
        self.first, self.second = (connect(Target(cluster.deploy_user, node.ssh_host, cluster.ssh_port, key), known_hosts)
                                   for node in pair)
        self.rails = list(zip(pair[0].rails, pair[1].rails))

    def keep(self, name: str, output: str) -> str:
        (self.out / f"{name}.txt").write_text(output)
        return output

    def gid_index(self, client, rdma: str, address: str) -> int | None:
        fact = RdmaDevices()
        _, output = run(client, fact.command())
        return roce_v2_gid_index(fact.process(output.splitlines())["devices"], rdma, address)

    def ping(self, index: int, mtu: int) -> dict:
        mine, theirs = self.rails[index]
        _, output = run(self.first, f"ping -M do -s {mtu - 28} -c 5 -i 0.2 -W 1 -I {mine.netdev} {theirs.address.ip}")
        return {"size": mtu - 28, **parse_ping(self.keep(f"ping-rail{index}", output))}

    def iperf3(self, index: int, seconds: int, reverse: bool) -> dict:
        _, theirs = self.rails[index]
        port = IPERF_PORT + index
        run(self.second, f"iperf3 -s -1 -D -B {theirs.address.ip} -p {port}")
        flags = " -R" if reverse else ""
        _, output = run(self.first, f"iperf3 -c {theirs.address.ip} -p {port} -J -t {seconds}{flags}", timeout=seconds + 60)
        name = f"iperf3-rail{index}-{'reverse' if reverse else 'forward'}"
        try:
            return parse_iperf3(self.keep(name, output))
        except (json.JSONDecodeError, KeyError):
            return {"error": output.strip()[-300:] or "no output"}

    def ib_write_bw(self, indexes: list[int], seconds: int) -> list[dict]:
        """ib_write_bw on the given rails at the same time; one result per rail."""
        results: dict[int, dict] = {}

        def one(index: int) -> None:
            mine, theirs = self.rails[index]
            flags = f"--report_gbits -D {seconds} -p {IB_PORT + index}"
            my_gid = self.gid_index(self.first, mine.rdma, str(mine.address.ip))
            their_gid = self.gid_index(self.second, theirs.rdma, str(theirs.address.ip))
            if my_gid is None or their_gid is None:
                results[index] = {"rail": index, "error": "no RoCE v2 GID for the rail's address "
                                  f"({self.pair[0].hostname} {my_gid}, {self.pair[1].hostname} {their_gid})"}
                return
            server = threading.Thread(target=run, args=(self.second, f"timeout {seconds + 30} ib_write_bw -d {theirs.rdma} -x {their_gid} {flags}"))
            server.start()
            _, output = run(self.first, f"sleep 1; timeout {seconds + 30} ib_write_bw -d {mine.rdma} -x {my_gid} {flags} {theirs.address.ip}")
            server.join()
            name = f"ib_write_bw-rail{index}" + ("-together" if len(indexes) > 1 else "")
            results[index] = {"rail": index, **parse_ib_write_bw(self.keep(name, output))}

        threads = [threading.Thread(target=one, args=(index,)) for index in indexes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return [results[index] for index in indexes]

    def nccl(self, command: str) -> dict:
        status, _ = run(self.first, "command -v all_reduce_perf")
        if status != 0:
            return {"skipped": f"all_reduce_perf is not on {self.pair[0].hostname}'s PATH (build nccl-tests with MPI to measure NCCL)"}
        mine, theirs = self.rails[0]
        command = command.format(
            first=mine.address.ip, second=theirs.address.ip, hcas=",".join(rail.rdma for rail, _ in self.rails),
            gid=self.gid_index(self.first, mine.rdma, str(mine.address.ip)), ifname=mine.netdev,
        )
        _, output = run(self.first, command, timeout=1800)
        return {"command": command, **parse_all_reduce_perf(self.keep("all_reduce_perf", output))}

    def close(self) -> None:
        self.first.close()
        self.second.close()


def pair_of(cluster: Cluster, names: str | None) -> tuple[Node, Node]:
    """The two nodes ``--pair`` names (``first,second``, hostnames of the site); the head and rank 1 without it."""
    if not names:
        return cluster.head, cluster.nodes[1]
    wanted = [name.strip() for name in names.split(",")]
    known = {node.hostname: node for node in cluster.nodes}
    if len(wanted) != 2 or wanted[0] == wanted[1] or not set(wanted) <= set(known):
        raise click.BadParameter(f"{names!r}: name two different nodes of the site, first,second (of {', '.join(known)})",
                                 param_hint="'--pair'")
    return known[wanted[0]], known[wanted[1]]


@click.command()
@cli.site_option()
@click.option("--pair", "nodes", callback=lambda ctx, _, names: pair_of(ctx.params["cluster"], names),
              help="The two nodes to measure between, first,second (default: the head and rank 1).")
@click.option("--seconds", type=cli.count(3600), default=10, show_default=True, help="Duration of each iperf3 and ib_write_bw run.")
@click.option("--mtu", type=cli.count(9216, min=1280), help="MTU to ping at (default: the site's fabric_mtu).")
@click.option("--nccl-command", type=cli.Placeholders(*NCCL_PLACEHOLDERS), default=NCCL_COMMAND, show_default=True,
              help="How to run all_reduce_perf across the pair ({first}, {second}: their rail 0 addresses; {hcas}: the first's "
                   "RDMA devices; {gid}: its RoCE v2 GID index; {ifname}: its rail 0 netdev).")
@click.option("--out", "out_dir", default="bench/results", show_default=True, type=cli.OutputDir())
def main(cluster: Cluster, nodes: tuple[Node, Node], seconds: int, mtu: int | None, nccl_command: str, out_dir: Path) -> None:
    """Measure the QSFP fabric between two nodes, the head and rank 1 by default."""
    mtu = mtu or cluster.settings.fabric_mtu
    started = datetime.now(UTC)
    out = out_dir / f"fabric-{started.strftime('%Y%m%dT%H%M%SZ')}"
    out.mkdir(parents=True, exist_ok=True)
    fabric = Fabric(cluster, nodes, out)
    try:
        rails = []
        with click.progressbar(range(len(fabric.rails)), label="rails") as bar:
            for index in bar:
                rails.append({
                    "rail": index, "netdevs": [rail.netdev for rail in fabric.rails[index]],
                    "ping": fabric.ping(index, mtu),
                    "iperf3_forward": fabric.iperf3(index, seconds, reverse=False),
                    "iperf3_reverse": fabric.iperf3(index, seconds, reverse=True),
                    "ib_write_bw": fabric.ib_write_bw([index], seconds)[0],
                })
        together = fabric.ib_write_bw(list(range(len(fabric.rails))), seconds) if len(fabric.rails) > 1 else []
        record = {
            "schema_version": SCHEMA_VERSION, "started": started.isoformat(), "seconds": seconds, "mtu": mtu,
            "pair": [node.hostname for node in nodes],
            "rails": rails,
            "ib_write_bw_all_rails": {
                "rails": together,
                "total_gbps": sum(r.get("average_gbps") or 0 for r in together) if together else None,
            },
            "nccl_all_reduce": fabric.nccl(nccl_command),
            "raw_output_dir": str(out),
        }
    finally:
        fabric.close()
    path = out_dir / f"{out.name}.json"
    path.write_text(json.dumps(record, indent=2))
    for rail in record["rails"]:
        click.echo(f"rail {rail['rail']} {' -> '.join(rail['netdevs'])}: ping {rail['ping']['received']}/{rail['ping']['sent']} at {mtu - 28} B, "
                   f"iperf3 {rail['iperf3_forward'].get('received_gbps', '-')}/{rail['iperf3_reverse'].get('received_gbps', '-')} Gb/s, "
                   f"ib_write_bw {rail['ib_write_bw'].get('average_gbps') or rail['ib_write_bw'].get('error')}")
    nccl = record["nccl_all_reduce"]
    click.echo("nccl: " + (nccl.get("skipped") or f"avg bus {nccl['average_busbw_gbps']} GB/s"
                          + (" BELOW 21.875" if nccl["below_target"] else "")
                          + (" - looks like a TCP fallback" if nccl["tcp_fallback_suspected"] else "")))
    click.echo(f"--> raw results: {path} (tool output in {out})")


if __name__ == "__main__":
    main()
