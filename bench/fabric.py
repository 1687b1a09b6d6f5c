"""Fabric benchmark between the two Sparks of a site file, run from the control machine.

Per rail: a don't-fragment ping at MTU-28, iperf3 in both directions (JSON), ib_write_bw;
then ib_write_bw on every rail at once, and NCCL all_reduce_perf across the nodes when the
binary is on the head (flagged below 21.875 GB/s bus bandwidth, and at the ~2 GB/s of a TCP
fallback). Every tool's raw output is kept beside the JSON.

    python -m bench.fabric [--site site.toml] [--seconds 10] [--out bench/results]
"""

from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime
from pathlib import Path

import click

from bench.parsers import parse_all_reduce_perf, parse_ib_write_bw, parse_iperf3, parse_ping
from bench.remote import Target, connect, run
from facts.fabric import RdmaDevices, roce_v2_gid_index
from site_config import default_settings, load_site, site_path

SCHEMA_VERSION = 1
IPERF_PORT, IB_PORT = 5201, 18515
NCCL_COMMAND = (
    "mpirun -np 2 -H {head},{worker} --bind-to none -x NCCL_IB_HCA={hcas} -x NCCL_IB_GID_INDEX={gid} "
    "-x NCCL_SOCKET_IFNAME={ifname} -x NCCL_NET=IB all_reduce_perf -b 8 -e 1G -f 2 -g 1"
)


class Fabric:
    """SSH sessions to both nodes and the rails between them, from the site file."""

    def __init__(self, site, out: Path):
        self.site, self.out = site, out
        self.head_node, self.worker_node = site.nodes["head"], site.nodes["worker"]
        key = os.path.expanduser(site.ssh_key) if site.ssh_key else None
        known_hosts = os.path.expanduser(site.known_hosts) if site.known_hosts else None
        self.head = connect(Target(site.deploy_user, self.head_node.ssh_host, site.ssh_port, key), known_hosts)
        self.worker = connect(Target(site.deploy_user, self.worker_node.ssh_host, site.ssh_port, key), known_hosts)
        self.rails = list(zip(self.head_node.rails, self.worker_node.rails))

    def keep(self, name: str, output: str) -> str:
        (self.out / f"{name}.txt").write_text(output)
        return output

    def gid_index(self, client, rdma: str, address: str) -> int | None:
        fact = RdmaDevices()
        _, output = run(client, fact.command())
        return roce_v2_gid_index(fact.process(output.splitlines())["devices"], rdma, address)

    def ping(self, index: int, mtu: int) -> dict:
        mine, theirs = self.rails[index]
        _, output = run(self.head, f"ping -M do -s {mtu - 28} -c 5 -i 0.2 -W 1 -I {mine.netdev} {theirs.address.ip}")
        return {"size": mtu - 28, **parse_ping(self.keep(f"ping-rail{index}", output))}

    def iperf3(self, index: int, seconds: int, reverse: bool) -> dict:
        _, theirs = self.rails[index]
        port = IPERF_PORT + index
        run(self.worker, f"iperf3 -s -1 -D -B {theirs.address.ip} -p {port}")
        flags = " -R" if reverse else ""
        _, output = run(self.head, f"iperf3 -c {theirs.address.ip} -p {port} -J -t {seconds}{flags}", timeout=seconds + 60)
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
            head_gid = self.gid_index(self.head, mine.rdma, str(mine.address.ip))
            worker_gid = self.gid_index(self.worker, theirs.rdma, str(theirs.address.ip))
            if head_gid is None or worker_gid is None:
                results[index] = {"rail": index, "error": f"no RoCE v2 GID for the rail's address (head {head_gid}, worker {worker_gid})"}
                return
            server = threading.Thread(target=run, args=(self.worker, f"timeout {seconds + 30} ib_write_bw -d {theirs.rdma} -x {worker_gid} {flags}"))
            server.start()
            _, output = run(self.head, f"sleep 1; timeout {seconds + 30} ib_write_bw -d {mine.rdma} -x {head_gid} {flags} {theirs.address.ip}")
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
        status, _ = run(self.head, "command -v all_reduce_perf")
        if status != 0:
            return {"skipped": "all_reduce_perf is not on the head's PATH (build nccl-tests with MPI to measure NCCL)"}
        mine, theirs = self.rails[0]
        command = command.format(
            head=mine.address.ip, worker=theirs.address.ip, hcas=",".join(rail.rdma for rail, _ in self.rails),
            gid=self.gid_index(self.head, mine.rdma, str(mine.address.ip)), ifname=mine.netdev,
        )
        _, output = run(self.head, command, timeout=1800)
        return {"command": command, **parse_all_reduce_perf(self.keep("all_reduce_perf", output))}

    def close(self) -> None:
        self.head.close()
        self.worker.close()


@click.command()
@click.option("--site", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Site file (default: as inventory.py).")
@click.option("--seconds", default=10, show_default=True, help="Duration of each iperf3 and ib_write_bw run.")
@click.option("--mtu", type=int, help="MTU to ping at (default: the site's fabric_mtu).")
@click.option("--nccl-command", default=NCCL_COMMAND, show_default=True, help="How to run all_reduce_perf across the nodes.")
@click.option("--out", "out_dir", default="bench/results", show_default=True, type=click.Path(file_okay=False, path_type=Path))
def main(site: Path | None, seconds: int, mtu: int | None, nccl_command: str, out_dir: Path) -> None:
    """Measure the QSFP fabric between the head and the worker."""
    loaded = load_site(site or site_path())
    mtu = mtu or {**default_settings(), **loaded.settings}["fabric_mtu"]
    started = datetime.now(UTC)
    out = out_dir / f"fabric-{started.strftime('%Y%m%dT%H%M%SZ')}"
    out.mkdir(parents=True, exist_ok=True)
    fabric = Fabric(loaded, out)
    try:
        rails = []
        with click.progressbar(range(len(fabric.rails)), label="rails") as bar:
            for index in bar:
                rails.append({
                    "rail": index, "head": fabric.rails[index][0].netdev, "worker": fabric.rails[index][1].netdev,
                    "ping": fabric.ping(index, mtu),
                    "iperf3_forward": fabric.iperf3(index, seconds, reverse=False),
                    "iperf3_reverse": fabric.iperf3(index, seconds, reverse=True),
                    "ib_write_bw": fabric.ib_write_bw([index], seconds)[0],
                })
        together = fabric.ib_write_bw(list(range(len(fabric.rails))), seconds) if len(fabric.rails) > 1 else []
        record = {
            "schema_version": SCHEMA_VERSION, "started": started.isoformat(), "seconds": seconds, "mtu": mtu,
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
        click.echo(f"rail {rail['rail']} {rail['head']}: ping {rail['ping']['received']}/{rail['ping']['sent']} at {mtu - 28} B, "
                   f"iperf3 {rail['iperf3_forward'].get('received_gbps', '-')}/{rail['iperf3_reverse'].get('received_gbps', '-')} Gb/s, "
                   f"ib_write_bw {rail['ib_write_bw'].get('average_gbps') or rail['ib_write_bw'].get('error')}")
    nccl = record["nccl_all_reduce"]
    click.echo("nccl: " + (nccl.get("skipped") or f"avg bus {nccl['average_busbw_gbps']} GB/s"
                          + (" BELOW 21.875" if nccl["below_target"] else "")
                          + (" - looks like a TCP fallback" if nccl["tcp_fallback_suspected"] else "")))
    click.echo(f"--> raw results: {path} (tool output in {out})")


if __name__ == "__main__":
    main()
