"""Operations for the runtime artifacts every Spark needs before serving: the runtime image,
obtained once on the head, and the model, fetched once on the head and hashed; both passed down
a chain through the ranks over the fabric (rank r sends to rank r+1 what it lacks, once r has it
right), so that no link carries them twice."""

from __future__ import annotations

import gzip
import io
import json
import posixpath
import tarfile
from collections.abc import Callable
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, OperationError, QuoteString, StringCommand, operation

from cluster import Cluster, Image, Model, Node
from facts.runtime import ImageState, ModelState, token_fix, token_path, token_refusal
from facts.serving import ModelHeads
from files.dual_spark.room import short
from layout import IN_CONTAINER, OWN_FILES, paths, smoke_marker, store_entry
from operations.own import claimed, entry_claimed
from operations.peer import acts_here, at_once, on_node, reachable, read_all, target, warn_unreachable
from operations.readings import Reading, plans
from operations.upload import upload

PROGRESS_EVERY = 10  # seconds between the progress lines of a long step
# The hub fetch's own environment, which a site's container_env does not change (the rest of it
# applies: HF_HUB_DISABLE_XET=1 there fetches over plain HTTP). Xet (hf_xet, which huggingface_hub
# uses for the files the hub serves through Xet, never for a server that sends no Xet headers):
# its directory (logs, an empty upload staging area) lives in the container's own layer, gone with
# `docker run --rm`, never in the model directory where $HF_HOME would put it; its chunk cache
# stays off (a one-off fetch reads each chunk once; hf_xet has it off by default, pinned against an
# image's build that turns it on); its download buffers are capped at the fixed limit hf_xet had
# before it sized them from the host's memory: the head may be serving the old revision from the
# same unified memory while it fetches. Why: docs/cluster.md#the-hub-fetch-and-xet.
FETCH_ENV = {"HF_HOME": "/model/.cache/huggingface", "HF_XET_CACHE": "/tmp/hf-xet", "HF_XET_CHUNK_CACHE_SIZE_BYTES": "0",
             "HF_XET_RECONSTRUCTION_DOWNLOAD_BUFFER_LIMIT": "8gb"}


@plans
def readings(cluster: Cluster, name: str) -> list[Reading]:
    return [image_reading(cluster), model_reading(cluster), (ModelHeads, {"model_dir": model_entry(cluster)})]


def image_reading(cluster: Cluster) -> Reading:
    """The runtime image's reading on a node (verification reads it with the same arguments)."""
    return ImageState, {"tag": cluster.image.tag, "marker": smoke_marker(cluster.settings.state_dir, cluster.image.tag)}


def model_reading(cluster: Cluster) -> Reading:
    """The model's reading on a node (verification reads it with the same arguments)."""
    settings, model_dir = cluster.settings, model_entry(cluster)
    where = paths(settings.state_dir, model_dir)
    return ModelState, {"programs": where["programs"], "model_dir": model_dir, "manifest": where["manifest"], "state": where["verified"],
                        "user": cluster.deploy_user, "token_file": settings.hf_token_file}


def model_entry(cluster: Cluster) -> str:
    return store_entry(cluster.settings.model_dir, cluster.model.source)


def container_args(container: dict, own: dict | None = None) -> list:
    """`docker run` arguments every runtime container gets from the site's container settings;
    with ``own``, the container's own environment first, and a name of it the site's container_env
    also sets left out there: each name given once (given twice, both Python and hf_xet read the
    first, but nothing needs to rely on that)."""
    own = own or {}
    args: list = [arg for key, value in own.items() for arg in ("-e", f"{key}={value}")]
    for path in container["mounts"]:
        args += ["-v", QuoteString(f"{path}:{path}:ro")]
    for key, value in sorted(container["env"].items()):
        if key not in own:
            args += ["-e", QuoteString(f"{key}={value}")]
    return args


def smoke_test(tag: str, image: Image, container: dict, state_dir: str) -> StringCommand:
    """The node's smoke test of ``tag`` (files/dual_spark/smoke.py): `import vllm` in a throwaway
    container with the site's mounts and environment; when it passes, the image ID's marker
    records the ID and the fields of the image's SpeculativeConfig."""
    where = paths(state_dir, "")
    return StringCommand("python3", QuoteString(where["programs"]), "smoke", "--tag", QuoteString(tag), "--python", QuoteString(image.python),
                         "--markers", QuoteString(where["smoke"]),
                         *[arg for path in container["mounts"] for arg in ("--mount", QuoteString(path))],
                         *[arg for key, value in sorted(container["env"].items()) for arg in ("--env", QuoteString(f"{key}={value}"))])


def smoked(reading: dict, image_id: str | None) -> bool:
    """The node's smoke test passed for this image ID and read its SpeculativeConfig fields (a
    marker written before they were read is tested again)."""
    return image_id is not None and reading["smoke_tested"] == image_id and reading["speculative_keys"] is not None


def build_context(directory: str) -> io.BytesIO:
    """A Docker build context as a gzipped tar, for one upload; the same bytes for the same files."""
    def normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
        return info

    data = io.BytesIO()
    with gzip.GzipFile(fileobj=data, mode="wb", compresslevel=1, mtime=0) as compressed:
        with tarfile.open(fileobj=compressed, mode="w") as tar:
            for path in sorted(Path(directory).rglob("*")):
                tar.add(path, arcname=path.relative_to(directory).as_posix(), recursive=False, filter=normalized)
    data.seek(0)
    return data


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def streamed(state, host, command: StringCommand) -> bool:
    """Run a long step with its output printed as it comes (pyinfra prints a command's output only
    when it ends): the step's progress lines, then its summary line or its errors."""
    status, _ = host.run_shell_command(command, print_output=True, print_input=state.print_input, _sudo=True)
    return status


def watched(programs: str, what: str, *command) -> FunctionCommand:
    """A long command without byte counts of its own (a build, a pull, a copy), run under
    `progress run`, which says every so often how long it has run and its latest output line."""
    return FunctionCommand(streamed, (StringCommand("python3", QuoteString(programs), "progress", "run", "--what",
                                                    QuoteString(what), "--", *command),), {})


def every_node(cluster: Cluster) -> str:
    return "both nodes" if cluster.size == 2 else f"all {cluster.size} nodes"


def down_the_chain(cluster: Cluster, readings: dict[str, dict | None], done: Callable[[Node, dict], bool],
                   step: str) -> list[Node]:
    """The workers this run sends to, in rank order, each from its upstream (``cluster.upstream``):
    those that answer and lack it (``done`` says not), and whose upstream has it by then (the head
    does; a worker did already, or gets it earlier in this run). A worker that does not answer is
    warned about, and each one after it that lacks it and gets it through it waits for the next run."""
    receivers, holding = [], {cluster.head.hostname}
    for node in cluster.workers:
        upstream = cluster.upstream(node)
        reading = readings[node.hostname]
        if reading is None:
            warn_unreachable(step, node.hostname)
        elif done(node, reading):
            holding.add(node.hostname)
        elif upstream.hostname in holding:
            receivers.append(node)
            holding.add(node.hostname)
        else:
            logger.warning(f"{host.print_prefix}{step} to {node.hostname} waits: it comes from {upstream.hostname}, "
                           "which does not have it in this run; left for the next run.")
    return receivers


def from_upstream(programs: str, sender: Node, user: str, argv: list[str], stdin: str | None = None) -> StringCommand:
    """``argv`` run on ``sender``: as it is on the head; on a worker, by ``peers run`` from the head
    (as the deploy user, over the first of the worker's rails that answers), with the head's file
    ``stdin`` on its stdin."""
    if sender.rank == 0:
        return StringCommand(*(QuoteString(arg) for arg in argv))
    call = on_node(programs, sender.hostname, user, sender.rail_data, *argv)
    return StringCommand(call, "<", QuoteString(stdin)) if stdin else call


@operation()
def runtime_image(image_name: str, image: Image, user: str, state_dir: str, container: dict):
    """
    On the head: obtain the runtime image once (pull by digest, or build from its directory
    here); then pass it down the chain of ranks over the fabric: rank r streams it to rank r+1
    (`docker save | ssh docker load`) only when r+1 lacks that image ID, and the IDs are compared
    (the same ID is the same bytes) before r+1 sends it on. Then every node whose smoke test has
    not passed for that ID (the head, each receiver, a worker that had it untested) is smoke-tested
    (`import vllm` in a throwaway container), all at the same time, each on its own node, in one
    command: each writes its marker only when it passes there, and a failure names its node. Every
    node knows the image by one local tag; the head drives every hop and every test.

    + image_name: the image's name in the serving data
    + image: its spec (``tag``, and ``ref`` or ``build``, ``python``)
    + user: the deploy user (SSH from node to node as this user)
    + state_dir: where the smoke-test markers live
    + container: the site's container settings (``mounts``, ``env``)

    **Example:**

    .. code:: python

        runtime_image(image_name="tony-overlay", image=cluster.images["tony-overlay"], user="spark",
                      state_dir="/var/lib/dual-spark", container=...)
    """
    if not acts_here("head"):
        return
    cluster: Cluster = host.data.cluster
    tag = image.tag
    marker = smoke_marker(state_dir, tag)
    programs = paths(state_dir, "")["programs"]
    mine, *theirs = read_all(ImageState, [reachable(node.hostname) for node in cluster.workers], tag=tag, marker=marker)
    readings = {node.hostname: reading for node, reading in zip(cluster.workers, theirs)}
    if mine["id"] is None:
        if image.ref:
            host.log(f"will pull {image.ref}", logger.info)
            yield watched(programs, f"pulling {image.ref}", "docker", "pull", QuoteString(image.ref))
            yield StringCommand("docker", "tag", QuoteString(image.ref), QuoteString(tag))
        else:
            context = posixpath.join(state_dir, "build", image_name)
            archive = f"{context}.tar.gz"
            yield StringCommand("mkdir", "-p", QuoteString(posixpath.dirname(archive)))
            yield from upload(build_context(image.build), archive)
            yield StringCommand("rm", "-rf", QuoteString(context), "&&", "mkdir", "-p", QuoteString(context), "&&",
                                "tar", "-xzf", QuoteString(archive), "-C", QuoteString(context))
            host.log(f"will build {tag} from {image.build}", logger.info)
            yield watched(programs, f"building {tag}", "docker", "build", "-t", QuoteString(tag),
                          QuoteString(context))
            yield StringCommand("rm", "-rf", QuoteString(context), QuoteString(archive))
    receivers = down_the_chain(cluster, readings, lambda node, reading: mine["id"] is not None and reading["id"] == mine["id"],
                               "sending the runtime image")
    size = f" ({gib(mine['size'])})" if mine["size"] else ""
    for node in receivers:
        sender = cluster.upstream(node)
        host.log(f"will stream {tag}{size} to {node.hostname}" + (f" from {sender.hostname}" if sender.rank else ""), logger.info)
    unsmoked = [node for node in cluster.workers
                if node not in receivers and readings[node.hostname] is not None and readings[node.hostname]["id"] == mine["id"]
                and not smoked(readings[node.hostname], mine["id"])]
    for node in receivers:
        sender = cluster.upstream(node)
        send = ["python3", programs, "image", "send", "--tag", tag, "--node", node.hostname, "--user", user,
                *[arg for address in node.fabric_addresses for arg in ("--rail", address)], "--from", sender.hostname]
        yield FunctionCommand(streamed, (from_upstream(programs, sender, user, send if sender.rank == 0 else ["sudo", "-n", *send]),), {})
    test = smoke_test(tag, image, container, state_dir).get_raw_value()
    tests = ([(cluster.head.hostname, "here", test)] if not smoked(mine, mine["id"]) else []) + [
        (node.hostname, target(user, node.rail_data), f"sudo -n {test}") for node in cluster.workers if node in receivers or node in unsmoked]
    if tests:
        yield at_once(programs, tests, f"the smoke test of {tag} (import vllm)", " (tested again there next run; each node that passed is recorded)")
    if not receivers and not unsmoked and smoked(mine, mine["id"]) and None not in theirs:
        host.noop(f"{tag} ({mine['id'][:19]}) on {every_node(cluster)}, smoke-tested")


@operation()
def model_on_every_node(model: Model, user: str, state_dir: str, model_dir: str, image: Image, hf_endpoint: str,
                        hf_token_file: str, container: dict, streams: int, verify_model: str, hf_endpoint_insecure_http: bool = False):
    """
    On the head: fetch the model once into its own directory of the model store ``model_dir``
    (``layout.store_entry``: one per source), beside the one the stacks serve, which stays as it
    is (from the hub at the pinned revision, inside the runtime image, or copied from a directory
    on the head); hash it into its manifest there; then pass it down the chain of ranks into the
    same directory on each: rank r copies to rank r+1 what r+1 lacks, over every rail at once with
    parallel streams, checked chunk by chunk against the manifest there and recorded as verified
    only when complete, before r+1 sends it on (from its verified copy, with the head's manifest
    on its stdin). Before a byte moves, the bytes each receiving node needs (the hub's sizes, the
    source's, the manifest's; less what it has of this model) are compared with its free space:
    a node short of room is refused, naming it and both numbers. A re-run with every node matching
    (sizes and times against the manifest and each worker's verified record) fetches, hashes and
    moves nothing; ``verify_model="full"`` hashes every file on every node again. The head drives
    every hop.

    + model: the serving data's model (``repo`` and ``revision``, or ``path``)
    + user: the deploy user (owns the model store and its directories; SSH from node to node as this user)
    + state_dir: where the programs live
    + model_dir: the model store (the same on every node)
    + image: the runtime image's spec (``tag``, ``python``): the hub fetch runs in it
    + hf_endpoint: the hub's URL
    + hf_token_file: the deploy user's hub token file on the head (only gated repositories need it)
    + hf_endpoint_insecure_http: the token may go to an http:// hub (a mirror on the LAN); else only over https
    + container: the site's container settings (``mounts``, ``env``)
    + streams: parallel TCP streams per rail
    + verify_model: "size" or "full"

    **Example:**

    .. code:: python

        model_on_every_node(model=cluster.model, user="spark", state_dir="/var/lib/dual-spark",
                            model_dir="/var/lib/dual-spark/model", image=..., hf_endpoint="https://huggingface.co",
                            hf_token_file="~/.cache/huggingface/token", container=..., streams=4, verify_model="size")
    """
    if not acts_here("head"):
        return
    if not hf_token_file.startswith("~/"):
        raise OperationError(f"{host.name}: hf_token_file = {hf_token_file}: name it as ~/<path>, a file in {user}'s home on the head")
    cluster: Cluster = host.data.cluster
    source = model.source
    entry = store_entry(model_dir, source)
    where = paths(state_dir, entry)
    full = verify_model == "full"
    head, *theirs = read_all(ModelState, [reachable(node.hostname) for node in cluster.workers], programs=where["programs"],
                             model_dir=entry, manifest=where["manifest"], state=where["verified"], user=user,
                             token_file=hf_token_file)
    readings = {node.hostname: reading for node, reading in zip(cluster.workers, theirs)}
    manifest = head["manifest"]
    same_source = manifest is not None and manifest["source"] == source
    head_done = same_source and not head["changed"] and not full

    def done(node: Node, reading: dict) -> bool:
        """Verified against the head's manifest, and unchanged since."""
        return head_done and reading["verified"] == manifest["digest"] and not reading["changed"]

    receivers = down_the_chain(cluster, readings, done, "replicating the model")
    receiving = ([(cluster.head, head)] if not same_source else []) + [(node, readings[node.hostname]) for node in receivers]
    rooms = [room(node.hostname, reading) for node, reading in receiving if reading["free_bytes"] is not None]
    if not same_source:
        if model.path:
            host.log(f"will copy the model from {model.path} into {entry}, then hash it", logger.info)
        else:
            free = f"; {gib(head['free_bytes'])} free there" if head["free_bytes"] is not None else ""
            host.log(f"will fetch {model.repo} at {model.revision[:12]} from the hub into {entry} (its size "
                     f"shows once the hub answers{free}), then hash it", logger.info)
            refusal = token_refusal(hf_token_file, user, head["token"])
            if refusal:
                raise OperationError(f"{host.name}: {refusal}: nothing was fetched")
        yield fetch(model, user, where, model_dir, entry, image, hf_endpoint, hf_token_file, container, rooms, hf_endpoint_insecure_http)
    else:
        refusal = short(manifest["bytes"], rooms, model_dir, "the model")
        if refusal:
            raise OperationError(refusal)
        if not head_done:
            what = f"{manifest['files']} files, {gib(manifest['bytes'])}" if full else f"{len(head['changed'])} changed file(s)"
            host.log(f"will hash {what} of the model", logger.info)
    if not head_done:
        hashing = ["sudo", "-n", "-u", QuoteString(user), "python3", QuoteString(where["programs"]), "sync", "manifest",
                   "--dir", QuoteString(entry), "--manifest", QuoteString(where["manifest"]),
                   "--source", QuoteString(json.dumps(source, sort_keys=True)), "--progress", str(PROGRESS_EVERY)]
        yield FunctionCommand(streamed, (StringCommand(*hashing, *(["--full"] if full else [])),), {})
    if not receivers:
        if head_done and None not in theirs:
            host.noop(f"the model is on {every_node(cluster)}, verified ({manifest['files']} files, "
                      f"{manifest['bytes'] / (1 << 30):.2f} GiB)")
        return
    for node in receivers if same_source else ():
        sender = cluster.upstream(node)
        host.log(f"will replicate to {node.hostname}" + (f" from {sender.hostname}" if sender.rank else "") +
                 f" at most {manifest['files']} files, {gib(manifest['bytes'])} (what it has right already stays)", logger.info)
    for node in receivers:
        sender = cluster.upstream(node)
        send = ["python3", where["programs"], "sync", "send", "--dir", entry,
                "--manifest", where["manifest"] if sender.rank == 0 else "-",
                "--peer", ",".join(f"{user}@{address}" for address in node.fabric_addresses),
                "--local", ",".join(sender.fabric_addresses),
                "--remote-dir", entry, "--remote-state", where["verified"],
                "--remote-script", where["programs"], "--streams", str(int(streams)),
                "--progress", str(PROGRESS_EVERY), *(["--full"] if full else [])]
        argv = ["sudo", "-n", "-u", user, *send] if sender.rank == 0 else send
        yield FunctionCommand(streamed, (from_upstream(where["programs"], sender, user, argv, stdin=where["manifest"]),), {})


def room(name: str, reading: dict) -> str:
    """A node's --room for the programs (files/dual_spark/room.py): its free bytes in the store,
    the bytes it has of this model."""
    return f"{name}={reading['free_bytes']}:{reading['bytes']}"


def fetch(model: Model, user: str, where: dict, store: str, entry: str, image: Image, hf_endpoint: str, hf_token_file: str,
          container: dict, rooms: list[str], insecure_http: bool = False) -> FunctionCommand:
    """The model into its directory ``entry`` of the model store ``store`` (the deploy user's,
    claimed by the first step, operations/own.py, and checked again here by ``own entry``), made
    the deploy user's and marked, or found marked: else nothing happens. Each node's room (``rooms``) is checked
    first, against the source's size or the hub's sizes. From a directory on the head: copied by
    the deploy user (rsync under sudo -u), which first checks, as that user, that the source holds
    a config.json: what it may not read stays unread. From the hub: the fetch program in the
    runtime image (over Xet where the hub serves a file through it, with FETCH_ENV), with the token
    file mounted only if the deploy user finds there a regular file of its own (not a link; it
    makes it mode 600 itself); the container writes as root, so the directory is given back to
    the user afterwards, in the same command."""
    as_user = ["sudo", "-n", "-u", QuoteString(user)]
    room_args = [arg for entry_room in rooms for arg in ("--room", QuoteString(entry_room))]
    if model.path:
        source = model.path.rstrip("/")
        readable = StringCommand(
            "{", *as_user, "test", "-f", QuoteString(f"{source}/config.json"), "||", "{", "echo",
            QuoteString(f"model.path = {model.path} is not a model directory {user} may read (no config.json there that "
                        f"{user} can read): nothing was copied. Fix: set model.path to the directory holding the config.json "
                        f"and the weights of the model, readable by {user}"), ">&2;", "exit", "1;", "};", "}")
        fits = StringCommand(*as_user, "python3", QuoteString(where["programs"]), "sync", "room", "--source", QuoteString(source),
                             "--store", QuoteString(store), "--what", QuoteString(f"the model in {model.path}"), *room_args)
        copy = [*as_user, "rsync", "-a", "--delete", "--exclude", QuoteString(f"/{OWN_FILES}*"), "--info=progress2",
                "--no-inc-recursive", QuoteString(source + "/"), QuoteString(entry + "/")]
        return FunctionCommand(streamed, (StringCommand(
            claimed(where["programs"], store, "model_dir", user), "&&", readable, "&&", fits, "&&",
            entry_claimed(where["programs"], store, entry, user), "&&",
            "python3", QuoteString(where["programs"]), "progress", "run", "--what",
            QuoteString(f"copying the model from {model.path}"), "--", *copy),), {})
    token = StringCommand(
        token_path(user, hf_token_file), "set", "--;", *as_user, "sh", "-c",
        QuoteString('if [ -f "$1" ] && [ ! -L "$1" ] && [ -O "$1" ]; then chmod 600 "$1"; '
                    'elif [ -e "$1" ] || [ -L "$1" ]; then exit 1; else exit 3; fi'), "-", '"$t";',
        "case", "$?", "in", "0)", "set", "--", "-v", '"$t:/run/secrets/hf_token:ro";;', "3)", ";;", "*)", "echo",
        QuoteString(token_fix(hf_token_file, user, f"a symbolic link, not a regular file, or not owned by {user}") + ": nothing was fetched"),
        ">&2;", "exit", "1;;", "esac;")
    command = StringCommand(
        token, entry_claimed(where["programs"], store, entry, user), "&&",
        "docker", "run", "--rm", "--network", "host", "-e", QuoteString(f"HF_ENDPOINT={hf_endpoint}"),
        *container_args(container, FETCH_ENV),
        "-v", QuoteString(f"{entry}:/model"), "-v", QuoteString(f"{where['programs']}:{IN_CONTAINER['programs']}:ro"), '"$@"',
        "--entrypoint", QuoteString(image.python), QuoteString(image.tag), IN_CONTAINER["programs"], "fetch",
        "--repo", QuoteString(model.repo), "--revision", QuoteString(model.revision), "--dest", "/model",
        "--store", QuoteString(store), *room_args,
        "--token-file", "/run/secrets/hf_token", *(["--allow-http-token"] if insecure_http else []), "--progress", str(PROGRESS_EVERY),
        "&&", "chown", "-R", QuoteString(f"{user}:"), QuoteString(entry),
    )
    return FunctionCommand(streamed, (command,), {})
