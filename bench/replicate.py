"""Replication benchmark between the two Sparks of a site file, run from the control machine.

The same bytes (random shards, sized like safetensors shards scaled down) go from the head to
the worker twice: (a) the recipes' way, one `rsync -a` over SSH with default settings, and
(b) this project's, `model_sync.py send` over every rail with parallel verified streams, as
the deploy runs it; then (b) once more, which must move nothing. Prints MiB/s and the ratio;
raw JSON in bench/results/. Uses scratch directories under /var/tmp on both nodes, removed after.

    python -m bench.replicate [--site site.toml] [--gib 2] [--shard-mib 256] [--streams N]
"""

from __future__ import annotations

import json
import shlex
import time
from datetime import UTC, datetime
from pathlib import Path

import click

from bench.remote import head_of, run
from operations.runtime import paths
from site_config import default_settings, load_site, site_path

SCHEMA_VERSION = 1
SCRATCH = "/var/tmp/dual-spark-replicate"
MIB = 1 << 20


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


@click.command()
@click.option("--site", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Site file (default: as inventory.py).")
@click.option("--gib", default=2.0, show_default=True, help="How much to replicate.")
@click.option("--shard-mib", default=256, show_default=True, help="Shard size (real DeepSeek V4 Flash shards: ~3.5 GiB).")
@click.option("--streams", type=int, help="Parallel streams per rail (default: the site's replication_streams).")
@click.option("--accept-new-host-key", is_flag=True, help="Record the head's SSH host key if seen for the first time.")
@click.option("--out", "out_dir", default="bench/results", show_default=True, type=click.Path(file_okay=False, path_type=Path))
def main(site: Path | None, gib: float, shard_mib: int, streams: int | None, accept_new_host_key: bool, out_dir: Path) -> None:
    """Measure rsync over SSH against this project's replication, on the same bytes."""
    loaded = load_site(site or site_path())
    settings = {**default_settings(), **loaded.settings}
    streams = streams or settings["replication_streams"]
    user, head, worker = loaded.deploy_user, loaded.nodes["head"], loaded.nodes["worker"]
    script = paths(settings["state_dir"], settings["model_dir"])["model_sync"]
    shards = max(1, round(gib * 1024 / shard_mib))
    src, manifest = f"{SCRATCH}/src", f"{SCRATCH}/manifest.json"
    peers = ",".join(f"{user}@{rail.address.ip}" for rail in worker.rails)
    local = ",".join(str(rail.address.ip) for rail in head.rails)
    worker_ssh = f"{user}@{worker.rails[0].address.ip}"
    on_worker = f"ssh -o BatchMode=yes {worker_ssh}"
    send = (f"python3 {shlex.quote(script)} send --dir {src} --manifest {manifest} --peer {peers} --local {local} "
            f"--remote-dir {SCRATCH}/sync --remote-state {SCRATCH}/sync-verified.json --remote-script {shlex.quote(script)} "
            f"--streams {streams}")
    started = datetime.now(UTC)
    with head_of(loaded, accept_new_host_key) as client:
        try:
            click.echo(f"--> {shards} shards of {shard_mib} MiB of random bytes on {head.hostname}")
            timed(client, f"rm -rf {SCRATCH} && {on_worker} 'rm -rf {SCRATCH} && mkdir -p {SCRATCH}/rsync' && mkdir -p {src} && for i in $(seq -w 1 {shards}); do "
                          f"head -c {shard_mib * MIB} /dev/urandom > {src}/model-$i-of-{shards}.safetensors; done", "making the shards")
            hashed, _ = timed(client, f"python3 {shlex.quote(script)} manifest --dir {src} --manifest {manifest}", "hashing")
            settle = f"sync && {on_worker} sync"  # each way starts with nothing left to write back
            size = shards * shard_mib * MIB
            click.echo(f"--> (a) rsync -a over SSH to {worker.hostname} at {worker.rails[0].address.ip}")
            timed(client, settle, "sync")
            rsync_seconds, _ = timed(client, f"rsync -a {src}/ {worker_ssh}:{SCRATCH}/rsync/ && {on_worker} sync", "rsync")
            timed(client, settle, "sync")
            click.echo(f"--> (b) model_sync over {len(head.rails)} rail(s), {streams} streams each")
            sync_seconds, output = timed(client, send, "model_sync")
            first = last_json(output)
            rerun_seconds, output = timed(client, send, "model_sync again")
            rerun = last_json(output)
        finally:
            run(client, f"{on_worker} rm -rf {SCRATCH}; rm -rf {SCRATCH}")
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
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"replicate-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(record, indent=2))
    click.echo(f"rsync -a over SSH: {rsync_rate:.0f} MiB/s ({rsync_seconds:.1f} s for {size / MIB:.0f} MiB)")
    click.echo(f"model_sync:        {sync_rate:.0f} MiB/s ({sync_seconds:.1f} s; hashing the manifest took {hashed:.1f} s, "
               "once, when the model is fetched)")
    click.echo(f"speedup: {record['speedup_vs_rsync_ssh']}x ({record['speedup_vs_rsync_ssh_with_hashing']}x counting the hashing)")
    click.echo(f"re-run: {rerun['bytes']} bytes moved in {rerun_seconds:.1f} s")
    click.echo(f"--> raw results: {path}")


if __name__ == "__main__":
    main()
