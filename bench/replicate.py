"""Replication benchmark on the nodes of a site file, run from the control machine.

The same bytes (random shards, sized like safetensors shards scaled down) go from the head to
rank 1 twice: (a) the recipes' way, one `rsync -a` over SSH with default settings, and (b) this
project's, `sync send` (the deploy's programs) over every rail with parallel verified streams, as the deploy
runs it; then (b) once more, which must move nothing. Prints MiB/s and the ratio.

With three nodes or more, (c) the copy goes on down the chain as the deploy sends it (rank r to
r+1, from the copy r verified, the head's manifest on its stdin), and the bench reports the bytes each node's
fabric link carried each way (its rails' counters in /proc/net/dev, before (b) and after the last
hop: none should carry more than 1.05x the bytes) and the chain's time against (b), one pair's
copy of the same bytes. Raw JSON in bench/results/. Its scratch directory on every node is in the
deploy user's own model store (model_dir/.dual-spark-bench: no name in a shared place like
/var/tmp that another user could make first), removed after.

    python -m bench.replicate [--site site.toml] [--gib 2] [--shard-mib 256] [--streams N]
"""

from __future__ import annotations

import json
import shlex
import time
from datetime import UTC, datetime
from pathlib import Path

import click

from bench import cli
from bench.remote import head_of, run
from cluster import Cluster, Node
from layout import SSH_OPTIONS, paths

SCHEMA_VERSION = 2  # 2: "chain" with three nodes or more
SCRATCH = ".dual-spark-bench"  # in model_dir: the deploy user's own, and the deploy's own files' prefix there
MIB = 1 << 20
LINK_BOUND = 1.05  # the most any link may carry, each way, as a multiple of the bytes replicated


def timed(client, command: str, what: str) -> tuple[float, str]:
    """Run on the head; the seconds it took and its output, or an error naming ``what``."""
    started = time.monotonic()
    status, output = run(client, command, timeout=7200)
    seconds = time.monotonic() - started
    if status != 0:
        raise click.ClickException(f"{what} failed ({status}): {output.strip()[-500:]}")
    return seconds, output


def last_json(output: str) -> dict:
    return json.loads([line for line in output.splitlines() if line.startswith("{")][-1])


def on(user: str, node: Node) -> str:
    """The prefix that runs a command on ``node`` from the head: nothing on the head, ssh over
    its first rail to a worker."""
    return "" if node.rank == 0 else f"ssh {' '.join(SSH_OPTIONS)} {user}@{node.rails[0].address.ip} "


def link_bytes(proc_net_dev: str, netdevs: list[str]) -> dict[str, int]:
    """Bytes received and sent over ``netdevs``, summed, from /proc/net/dev's text."""
    totals = {"rx": 0, "tx": 0}
    for line in proc_net_dev.splitlines():
        name, colon, fields = line.partition(":")
        if colon and name.strip() in netdevs:
            values = fields.split()
            totals["rx"] += int(values[0])
            totals["tx"] += int(values[8])
    return totals


def links(client, user: str, cluster: Cluster) -> dict[str, dict[str, int]]:
    """Each node's fabric link counters (its rails' netdevs), read on the node."""
    readings = {}
    for node in cluster.nodes:
        _, output = timed(client, f"{on(user, node)}cat /proc/net/dev", f"reading {node.hostname}'s link counters")
        readings[node.hostname] = link_bytes(output, [rail.netdev for rail in node.rails])
    return readings


def carried(before: dict, after: dict, size: int) -> dict[str, dict]:
    """What each node's link carried each way between two readings, in bytes and as a multiple of ``size``."""
    moved = {}
    for name in before:
        rx, tx = (after[name][way] - before[name][way] for way in ("rx", "tx"))
        moved[name] = {"rx_bytes": rx, "tx_bytes": tx, "rx_vs_model": round(rx / size, 3), "tx_vs_model": round(tx / size, 3)}
    return moved


def send(programs: str, user: str, sender: Node, receiver: Node, src: str, manifest: str, streams: int, scratch: str) -> str:
    """model_sync send from ``sender`` to ``receiver`` into the scratch directory there, as the deploy runs it."""
    return (f"python3 {shlex.quote(programs)} sync send --dir {src} --manifest {manifest} "
            f"--peer {','.join(f'{user}@{rail.address.ip}' for rail in receiver.rails)} "
            f"--local {','.join(str(rail.address.ip) for rail in sender.rails)} "
            f"--remote-dir {scratch}/sync --remote-state {scratch}/sync-verified.json --remote-script {shlex.quote(programs)} "
            f"--streams {streams}")


@click.command()
@cli.site_option()
@click.option("--gib", type=cli.Bounded(0, 1024, min_open=True), default=2.0, show_default=True, help="How much to replicate.")
@click.option("--shard-mib", type=cli.count(16384), default=256, show_default=True, help="Shard size (real DeepSeek V4 Flash shards: ~3.5 GiB).")
@click.option("--streams", type=cli.count(32), help="Parallel streams per rail (default: the site's replication_streams).")
@click.option("--accept-new-host-key", is_flag=True, help="Record the head's SSH host key if seen for the first time.")
@click.option("--out", "out_dir", default="bench/results", show_default=True, type=cli.OutputDir())
def main(cluster: Cluster, gib: float, shard_mib: int, streams: int | None, accept_new_host_key: bool, out_dir: Path) -> None:
    """Measure rsync over SSH against this project's replication, on the same bytes; with three
    nodes or more, the chain through every worker too."""
    settings = cluster.settings
    streams = streams or settings.replication_streams
    user, head, worker = cluster.deploy_user, cluster.head, cluster.workers[0]
    programs = paths(settings.state_dir, settings.model_dir)["programs"]
    scratch = f"{settings.model_dir}/{SCRATCH}"  # the site's paths hold no character a shell reads
    shards = max(1, round(gib * 1024 / shard_mib))
    src, manifest = f"{scratch}/src", f"{scratch}/manifest.json"
    chain = cluster.size > 2
    worker_ssh = f"{user}@{worker.rails[0].address.ip}"
    on_worker = f"ssh {' '.join(SSH_OPTIONS)} {worker_ssh}"
    pair_send = send(programs, user, head, worker, src, manifest, streams, scratch)
    started = datetime.now(UTC)
    with head_of(cluster, accept_new_host_key) as client:
        try:
            click.echo(f"--> {shards} shards of {shard_mib} MiB of random bytes on {head.hostname}")
            for node in cluster.workers[1:]:
                timed(client, f"{on(user, node)}'rm -rf {scratch} && mkdir -p {scratch}'", f"preparing {node.hostname}")
            timed(client, f"rm -rf {scratch} && {on_worker} 'rm -rf {scratch} && mkdir -p {scratch}/rsync' && mkdir -p {src} && for i in $(seq -w 1 {shards}); do "
                          f"head -c {shard_mib * MIB} /dev/urandom > {src}/model-$i-of-{shards}.safetensors; done", "making the shards")
            hashed, _ = timed(client, f"python3 {shlex.quote(programs)} sync manifest --dir {src} --manifest {manifest}", "hashing")
            settle = f"sync && {on_worker} sync"  # each way starts with nothing left to write back
            size = shards * shard_mib * MIB
            click.echo(f"--> (a) rsync -a over SSH to {worker.hostname} at {worker.rails[0].address.ip}")
            timed(client, settle, "sync")
            rsync_seconds, _ = timed(client, f"rsync -a {src}/ {worker_ssh}:{scratch}/rsync/ && {on_worker} sync", "rsync")
            timed(client, settle, "sync")
            before = links(client, user, cluster) if chain else {}
            click.echo(f"--> (b) model_sync over {len(head.rails)} rail(s), {streams} streams each")
            sync_seconds, output = timed(client, pair_send, "model_sync")
            first = last_json(output)
            hops = [{"from": head.hostname, "to": worker.hostname, "seconds": round(sync_seconds, 2), "bytes_moved": first["bytes"]}]
            for receiver in cluster.workers[1:]:
                sender = cluster.upstream(receiver)
                click.echo(f"--> (c) model_sync from {sender.hostname} to {receiver.hostname}, from its verified copy")
                hop = send(programs, user, sender, receiver, f"{scratch}/sync", "-", streams, scratch)
                seconds, output = timed(client, f"{on(user, sender)}{shlex.quote(hop)} < {manifest}",
                                        f"model_sync {sender.hostname} -> {receiver.hostname}")
                hops.append({"from": sender.hostname, "to": receiver.hostname, "seconds": round(seconds, 2),
                             "bytes_moved": last_json(output)["bytes"]})
            after = links(client, user, cluster) if chain else {}
            rerun_seconds, output = timed(client, pair_send, "model_sync again")
            rerun = last_json(output)
        finally:
            for node in cluster.workers[1:]:
                run(client, f"{on(user, node)}rm -rf {scratch}")
            run(client, f"{on_worker} rm -rf {scratch}; rm -rf {scratch}")
    rsync_rate, sync_rate = size / MIB / rsync_seconds, size / MIB / sync_seconds
    record = {
        "schema_version": SCHEMA_VERSION, "started": started.isoformat(), "head": head.hostname, "worker": worker.hostname,
        "bytes": size, "shards": shards, "shard_mib": shard_mib, "rails": len(head.rails), "streams_per_rail": streams,
        "rsync_ssh": {"seconds": round(rsync_seconds, 2), "mib_per_s": round(rsync_rate, 1)},
        "model_sync": {"seconds": round(sync_seconds, 2), "mib_per_s": round(sync_rate, 1), "bytes_moved": first["bytes"],
                       "bytes_by_rail": first["bytes_by_rail"]},
        "manifest_hash_seconds": round(hashed, 2),
        "speedup_vs_rsync_ssh": round(sync_rate / rsync_rate, 2),
        "speedup_vs_rsync_ssh_with_hashing": round(rsync_seconds / (sync_seconds + hashed), 2),
        "rerun_bytes_moved": rerun["bytes"], "rerun_seconds": round(rerun_seconds, 2),
    }
    if chain:
        record["chain"] = chain_record(hops, carried(before, after, size), sync_seconds)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"replicate-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(record, indent=2))
    click.echo(f"rsync -a over SSH: {rsync_rate:.0f} MiB/s ({rsync_seconds:.1f} s for {size / MIB:.0f} MiB)")
    click.echo(f"model_sync:        {sync_rate:.0f} MiB/s ({sync_seconds:.1f} s; hashing the manifest took {hashed:.1f} s, "
               "once, when the model is fetched)")
    click.echo(f"speedup: {record['speedup_vs_rsync_ssh']}x ({record['speedup_vs_rsync_ssh_with_hashing']}x counting the hashing)")
    click.echo(f"re-run: {rerun['bytes']} bytes moved in {rerun_seconds:.1f} s")
    if chain:
        for line in chain_lines(record["chain"], size):
            click.echo(line)
    click.echo(f"--> raw results: {path}")


def chain_record(hops: list[dict], links_carried: dict[str, dict], pair_seconds: float) -> dict:
    seconds = sum(hop["seconds"] for hop in hops)
    worst = max(max(link["rx_vs_model"], link["tx_vs_model"]) for link in links_carried.values())
    return {"workers": len(hops), "hops": hops, "seconds": round(seconds, 2), "pair_seconds": round(pair_seconds, 2),
            "time_vs_pair": round(seconds / pair_seconds, 2), "links": links_carried, "most_any_link_carried_vs_model": worst,
            "each_link_within_bound": worst <= LINK_BOUND}


def chain_lines(chain: dict, size: int) -> list[str]:
    """The chain's figures for people: its time against one pair's copy, each link's bytes each way."""
    lines = [f"chain to {chain['workers']} workers: {chain['seconds']:.1f} s, {chain['time_vs_pair']}x one pair's copy of the "
             f"same bytes ({chain['pair_seconds']:.1f} s); hops: " +
             ", ".join(f"{hop['from']} -> {hop['to']} {hop['seconds']:.1f} s" for hop in chain["hops"])]
    lines.append(f"bytes each link carried (its rails' counters; {size / MIB:.0f} MiB replicated):")
    for name, link in chain["links"].items():
        lines.append(f"  {name}: out {link['tx_bytes'] / MIB:.0f} MiB ({link['tx_vs_model']}x), "
                     f"in {link['rx_bytes'] / MIB:.0f} MiB ({link['rx_vs_model']}x)")
    if chain["each_link_within_bound"]:
        lines.append(f"no link carried it twice: each at most {chain['most_any_link_carried_vs_model']}x the bytes, each way "
                     f"(bound {LINK_BOUND}x)")
    else:
        lines.append(f"a link carried {chain['most_any_link_carried_vs_model']}x the bytes, over the {LINK_BOUND}x bound: "
                     "other traffic on the fabric, or a hop that sent twice (see the hops' bytes_moved in the raw results)")
    return lines


if __name__ == "__main__":
    main()
