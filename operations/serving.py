"""Operations for serving: one compose stack per node (built as data, its launch script rendered
from templates/serving/), checked
by the real `docker compose config` before it is installed, and brought up in the only order
multi-node vLLM survives: the head stops first, fresh workers start, then the head. Containers
restart only when a stack of the cluster changed (or one of them is not running), and never
with a tensor parallel the model's attention heads refuse."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from io import StringIO

import click
import yaml
from pyinfra import host, logger
from pyinfra.api import FunctionCommand, OperationError, QuoteString, StringCommand, operation

from checks import table
from checks.serving import heads_refusal
from cluster import Cluster, Image, Model, Profile
from facts.fabric import roce_v2_gid_index
from facts.runtime import ImageState
from facts.serving import ModelHeads, ServingState
from facts.verify import api_reading
from layout import COMPOSE_PROJECT, CONTAINER, IN_CONTAINER, LABELS, RUN_DIR, STOP_TIMEOUT, paths, smoke_marker, store_entry
from operations.own import claimed
from operations.peer import acts_here, reachable, read_all, warn_unreachable
from operations.readings import Reading, plans, read
from operations.records import on_every_node, record, restore
from operations.render import render, show_diff
from operations.runtime import streamed
from operations.status import cluster_status
from operations.upload import upload
from programs import digest
from states import cluster_state, described, state_of

STAGING = f"{RUN_DIR}/stack-check"
PROBE_SLICE = 5  # seconds of each wait for the first token between two readings of the nodes' backoff records
FILES = ("compose.yaml", "launch.sh")
# A profile's keys that vLLM's --speculative-config takes as these SpeculativeConfig fields, only
# when the profile sets them (the image must have the field: image_supports).
SPECULATIVE_FIELDS = {"speculative_schedule": "num_speculative_tokens_per_batch_size",
                      "adaptive_verification": "enable_adaptive_verification"}


@plans
def readings(cluster: Cluster, name: str) -> list[Reading]:
    settings = cluster.settings
    model_dir = store_entry(settings.model_dir, cluster.model.source)
    where = paths(settings.state_dir, model_dir)
    return [(ImageState, {"tag": cluster.image.tag, "marker": smoke_marker(settings.state_dir, cluster.image.tag)}),
            (ModelHeads, {"model_dir": model_dir}),
            (ServingState, {"stack_dir": settings.stack_dir, "key_file": where["api_key"], "model_record": where["manifest"]})]


def vllm_args(settings: StackSettings) -> list[str]:
    """The `vllm serve` arguments of one node (FACTS.md's launch line), from its stack settings."""
    profile, model = settings.profile, settings.model
    head = settings.role == "head"
    args = [IN_CONTAINER["model"], "--served-model-name", model.served_name]
    if head:
        args += ["--host", settings.api_host, "--port", str(settings.api_port)]
    args += [
        "--trust-remote-code", "--tensor-parallel-size", str(settings.tensor_parallel),
        "--pipeline-parallel-size", str(settings.pipeline_parallel),
        "--kv-cache-dtype", profile.kv_cache_dtype, "--block-size", str(settings.block_size),
        "--max-model-len", str(profile.max_model_len), "--max-num-seqs", str(profile.max_num_seqs),
        "--max-num-batched-tokens", str(profile.max_num_batched_tokens),
        "--gpu-memory-utilization", str(profile.gpu_memory_utilization),
        "--enable-prefix-caching" if profile.prefix_caching else "--no-enable-prefix-caching",
    ]
    if profile.speculative_tokens:
        speculative = {"method": settings.speculative_method, "num_speculative_tokens": profile.speculative_tokens}
        for key, field in SPECULATIVE_FIELDS.items():
            if getattr(profile, key) is not None:
                speculative[field] = getattr(profile, key)
        speculative.update(settings.speculative_options)
        args += ["--speculative-config", json.dumps(speculative, separators=(",", ":"))]
    args += ["--tokenizer-mode", model.tokenizer_mode, "--distributed-executor-backend", "mp"]
    if model.tool_call_parser:
        args += ["--tool-call-parser", model.tool_call_parser, "--enable-auto-tool-choice"]
    if model.reasoning_parser:
        args += ["--reasoning-parser", model.reasoning_parser]
    args += [
        "--default-chat-template-kwargs", json.dumps({"thinking": profile.thinking}, separators=(",", ":")),
        "--generation-config", "vllm",
        "--override-generation-config", json.dumps(settings.generation_config, separators=(",", ":")),
    ]
    if profile.flashinfer_autotune:
        args.append("--enable-flashinfer-autotune")
    args += ["--nnodes", str(settings.nodes), "--node-rank", str(settings.rank), "--master-addr", settings.master_addr,
             "--master-port", str(settings.master_port)]
    if not head:
        args.append("--headless")
    return args + list(settings.vllm_extra_args)


@dataclass(frozen=True)
class StackSettings:
    """What one node's stack is made of: its place in the cluster, what it serves, and the
    settings and paths its compose file and launch script render (``stack_settings``)."""

    hostname: str
    rank: int
    role: str
    nodes: int
    tensor_parallel: int
    pipeline_parallel: int
    profile_name: str
    profile: Profile
    model: Model
    image: Image
    rails: list[dict]  # Rail.as_data() of each rail, rail 0 first
    master_addr: str
    worker_addresses: list[str]
    watchdog_port: int
    ready_timeout: int
    python: str
    programs: str
    restarts_dir: str
    api_host: str
    api_port: int
    master_port: int
    block_size: int
    speculative_method: str
    speculative_options: dict
    generation_config: dict
    vllm_extra_args: list[str]
    serving_env: dict[str, str]
    gpus: str
    devices: list[str]
    ulimits: dict[str, int]
    mounts: list[str]
    container_env: dict[str, str]
    model_dir: str
    stack_dir: str
    api_key_file: str
    deploy_user: str
    manifest: str
    smoke_marker: str


def stack_settings(cluster: Cluster, hostname: str) -> StackSettings:
    """One node's stack settings, from the cluster."""
    node, settings = cluster.node(hostname), cluster.settings
    model_dir = store_entry(settings.model_dir, cluster.model.source)  # the model's own directory of the store
    where = paths(settings.state_dir, model_dir)
    return StackSettings(
        hostname=hostname, rank=node.rank, role=node.role, nodes=cluster.size,
        tensor_parallel=cluster.tensor_parallel, pipeline_parallel=cluster.pipeline_parallel,
        profile_name=cluster.profile_name, profile=cluster.profile, model=cluster.model,
        image=cluster.image, rails=node.rail_data, master_addr=cluster.master_addr,
        worker_addresses=[str(worker.rails[0].address.ip) for worker in cluster.workers],
        watchdog_port=settings.watchdog_port, ready_timeout=settings.serving_ready_timeout,
        python=cluster.image.python, programs=where["programs"], restarts_dir=where["serving"],
        api_host=settings.api_host, api_port=settings.api_port, master_port=settings.master_port,
        block_size=settings.block_size, speculative_method=settings.speculative_method,
        speculative_options=settings.speculative_options, generation_config=settings.generation_config,
        vllm_extra_args=settings.vllm_extra_args, serving_env=settings.serving_env,
        gpus=settings.container_gpus, devices=settings.container_devices, ulimits=settings.container_ulimits,
        mounts=settings.container_mounts, container_env=settings.container_env, model_dir=model_dir,
        stack_dir=settings.stack_dir, api_key_file=where["api_key"],
        deploy_user=cluster.deploy_user, manifest=where["manifest"],
        smoke_marker=smoke_marker(settings.state_dir, cluster.image.tag),
    )


def state_arguments(settings: StackSettings) -> dict:
    """ServingState's arguments: the same on every node (the manifest exists on the head only)."""
    return {"stack_dir": settings.stack_dir, "key_file": settings.api_key_file, "model_record": settings.manifest}


@dataclass(frozen=True)
class Stack:
    compose: str
    launch: str
    hash: str


def gid_index(settings: StackSettings, reading: dict) -> int | str:
    """NCCL_IB_GID_INDEX: the RoCE v2 GID of rail 0's address as this node has it (or the
    site's pin); never a constant, since the table's order differs between machines. Before the
    changes run (--dry, the diff shown before asking) a node whose rail has no address yet shows
    what will be read."""
    rail = settings.rails[0]
    if rail["gid_index"] != "auto":
        return rail["gid_index"]
    found = roce_v2_gid_index(reading["rdma"]["devices"], rail["rdma"], rail["address"])
    if found is None and not host.state.is_executing:
        return f"the RoCE v2 GID of {rail['address']} on {rail['rdma']}, read once the rail has that address"
    if found is None:
        raise OperationError(f"no RoCE v2 GID for {rail['address']} on {rail['rdma']}: NCCL could not use the rail. "
                             "Fix: see the rail's rows in `pyinfra inventory.py tasks/verify.py` (link, address).")
    return found


def environment(settings: StackSettings, gid: int) -> dict[str, str]:
    rails = settings.rails
    own = {
        "VLLM_HOST_IP": rails[0]["address"],
        "NCCL_SOCKET_IFNAME": rails[0]["netdev"],
        "GLOO_SOCKET_IFNAME": rails[0]["netdev"],
        "TP_SOCKET_IFNAME": rails[0]["netdev"],
        "NCCL_IB_HCA": ",".join(rail["rdma"] for rail in rails),
        "NCCL_IB_GID_INDEX": str(gid),
    }
    return {**own, **settings.serving_env, **settings.image.env, **settings.profile.env, **settings.container_env}


def compose_stack(settings: StackSettings, env: dict[str, str], stack_hash: str, model_digest: str) -> dict:
    """The node's compose stack as data: every value a site gives lands as a value, never as YAML."""
    role, profile = settings.role, settings.profile
    service = {
        "image": settings.image.tag, "pull_policy": "never", "container_name": CONTAINER,
        "restart": "unless-stopped", "init": True, "network_mode": "host", "ipc": "host", "shm_size": "64gb",
        "privileged": profile.privileged,
    }
    if settings.gpus:
        service["gpus"] = int(settings.gpus) if settings.gpus.isdigit() else settings.gpus
    if settings.devices:
        service["devices"] = [f"{device}:{device}" for device in settings.devices]
    service["ulimits"] = dict(settings.ulimits)
    service["labels"] = {LABELS["role"]: role, LABELS["profile"]: settings.profile_name,
                         LABELS["model"]: model_digest, LABELS["stack"]: stack_hash}
    inside = IN_CONTAINER
    service["volumes"] = [
        f"{settings.model_dir}:{inside['model']}:ro", f"./launch.sh:{inside['launch']}:ro",
        f"{settings.programs}:{inside['programs']}:ro",
        f"{settings.restarts_dir}:{inside['state']}",
        *([f"{settings.api_key_file}:{inside['api_key']}:ro"] if role == "head" else []),
        *(f"{path}:{path}:ro" for path in settings.mounts),
    ]
    service["environment"] = {name: value.replace("$", "$$") for name, value in env.items()}  # compose reads $ as its own
    service["entrypoint"] = [inside["launch"]]
    service["healthcheck"] = {
        "test": ["CMD", settings.python, inside["programs"], "watchdog", "check", "--ip", settings.rails[0]["address"],
                 "--port", str(settings.watchdog_port)],
        "interval": "15s", "timeout": "10s", "retries": 3,
    }
    return {"name": COMPOSE_PROJECT, "services": {"vllm": service}}


def compose_file(settings: StackSettings, env: dict[str, str], stack_hash: str, model_digest: str) -> str:
    """compose.yaml: a managed-file header, then the stack serialised by a YAML library and read
    back to prove it says what was meant."""
    stack = compose_stack(settings, env, stack_hash, model_digest)
    text = render("serving/compose-header.yaml.j2", **vars(settings)) + yaml.safe_dump(stack, sort_keys=False, width=10**6)
    if yaml.safe_load(text) != stack:
        raise OperationError(f"{settings.stack_dir}/compose.yaml would not read back as the stack meant: refusing to write it")
    return text


def desired(settings: StackSettings, gid: int, model_digest: str | None) -> Stack:
    """The node's compose file and launch script; the stack hash names both (a container label).
    The launch script names the watchdog's version: a new watchdog restarts the cluster."""
    launch = render("serving/launch.sh.j2", **vars(settings), command=[settings.image.vllm, "serve"] + vllm_args(settings),
                    watchdog_digest=digest("watchdog.py")[:16])

    def compose(stack_hash: str) -> str:
        return compose_file(settings, environment(settings, gid), stack_hash, (model_digest or "none")[:12])

    stack_hash = hashlib.sha256((compose("") + launch).encode()).hexdigest()[:16]
    return Stack(compose(stack_hash), launch, stack_hash)


def in_place(stack: Stack, reading: dict | None) -> bool:
    """The node has these files and runs a container made from them."""
    if reading is None:
        return False
    container = reading["container"]
    return (reading["compose"] == stack.compose.splitlines() and reading["launch"] == stack.launch.splitlines()
            and container is not None and container["status"] == "running" and container["stack"] == stack.hash)


def own(stacks: list[StackSettings]) -> StackSettings:
    """This node's stack settings among every node's."""
    return next(settings for settings in stacks if settings.hostname == host.name)


def read_cluster(stacks: list[StackSettings], step: str) -> list[dict | None]:
    """Every node's ServingState in rank order, read at the same time; None for a node that does
    not answer (a warning says the step waits for it)."""
    names = [settings.hostname for settings in stacks if settings.hostname != host.name]
    others = [reachable(name) for name in names]
    mine, *theirs = read_all(ServingState, others, **state_arguments(own(stacks)))
    for name, other in zip(names, others):
        if other is None:
            warn_unreachable(step, name)
    found = {host.name: mine, **dict(zip(names, theirs))}
    return [found[settings.hostname] for settings in stacks]


def cluster_stacks(stacks: list[StackSettings], readings: list[dict | None]) -> tuple[list[Stack | None], bool]:
    """Every node's desired stack (None for a node not read), and whether every node runs its
    own. Every stack names the model of the head's manifest: new weights restart the cluster."""
    mine = readings[own(stacks).rank]
    model = (readings[0] or mine)["model_digest"]
    wanted = [desired(settings, gid_index(settings, reading), model) if reading is not None else None
              for settings, reading in zip(stacks, readings)]
    everywhere = all(stack is not None and in_place(stack, reading) for stack, reading in zip(wanted, readings))
    return wanted, everywhere


def heads_divided(settings: StackSettings) -> None:
    """Refuse, before anything stops or changes, a tensor parallel that vLLM would refuse for the
    model's attention heads (read from the config.json of the model on this node)."""
    refusal = heads_refusal(settings.profile_name, settings.tensor_parallel, settings.pipeline_parallel,
                            read(host, ModelHeads, model_dir=settings.model_dir))
    if refusal:
        raise OperationError(refusal)


def image_supports(settings: StackSettings) -> None:
    """Refuse, before anything stops or changes, a profile's speculative key that the image's vLLM
    lacks: its SpeculativeConfig's fields, as this node's smoke test read them (operations/runtime.py).
    Before the changes run (--dry) an image whose fields are not read yet waits for the runtime step."""
    profile, image = settings.profile, settings.image
    used = {key: field for key, field in SPECULATIVE_FIELDS.items() if getattr(profile, key) is not None and profile.speculative_tokens}
    if not used:
        return
    reading = read(host, ImageState, tag=image.tag, marker=settings.smoke_marker)
    fields = reading["speculative_keys"] if reading["id"] is not None and reading["smoke_tested"] == reading["id"] else None
    named = f"image {profile.image} ({image.tag})"
    if fields is None:
        if host.state.is_executing:
            raise OperationError(f"the speculative config keys {named} takes are not read on {host.name}: run "
                                 "`pyinfra inventory.py tasks/runtime.py` (its smoke test reads them), then this step again")
        return
    for key, field in used.items():
        if field not in fields:
            raise OperationError(
                f"profile {settings.profile_name} sets {key}, but the vLLM of {named}, {reading['id'][:19]}, has no {field} in its "
                f"SpeculativeConfig: nothing was stopped. Fix: drop {key} from the profile, or use an image whose vLLM has {field}"
                + ("; for another draft length under load, a second profile with another fixed speculative_tokens and no "
                   f"speculative_schedule (one based on {settings.profile_name} inherits its schedule), switched with tasks/profile.py" if key == "speculative_schedule" else ""))


def compose(stack_dir: str, *args: str) -> StringCommand:
    return StringCommand("docker", "compose", "--project-directory", QuoteString(stack_dir), "-f",
                         QuoteString(f"{stack_dir}/compose.yaml"), *args)


def stop(stack_dir: str) -> StringCommand:
    """Stop the node's stack, waiting STOP_TIMEOUT seconds (not Docker's 10) before killing vLLM."""
    return compose(stack_dir, "stop", "--timeout", str(STOP_TIMEOUT))


def install(stack: Stack, reading: dict, stack_dir: str):
    """Stage both files, check them with the real `docker compose config`, keep the previous
    ones, install into stack_dir only if it is the deploy's (claimed by tasks/runtime.py: a real
    directory holding its marker; never made here). Nothing is installed if a check fails."""
    for name, text in zip(FILES, (stack.compose, stack.launch)):
        show_diff(f"{stack_dir}/{name}", reading["compose" if name == "compose.yaml" else "launch"], text)
    yield StringCommand("rm", "-rf", STAGING, "&&", "mkdir", "-p", STAGING)
    for name, text in zip(FILES, (stack.compose, stack.launch)):
        staged = f"{STAGING}/{name}"
        yield from upload(StringIO(text), staged)
    yield StringCommand("chmod", "755", f"{STAGING}/launch.sh", "&&", "docker", "compose", "-f", f"{STAGING}/compose.yaml",
                        "config", "-q")
    for name in FILES:
        target = QuoteString(f"{stack_dir}/{name}")
        yield StringCommand(claimed(stack_dir, "stack_dir"), "&&", "{", "test", "!", "-f", target, "||", "cp", "-p", target,
                            StringCommand(target, '.previous', _separator=""), ";", "}", "&&",
                            "install", "-m", "755" if name == "launch.sh" else "644", f"{STAGING}/{name}", target)
    yield StringCommand("rm", "-rf", STAGING)


def failed_starts(state, starts: list[tuple[str, str]]) -> list[str]:
    """The nodes whose backoff record (``starts``: each node's name and record, watchdog.py's)
    says a start ended without serving: vLLM exited, or its watchdog ended it, before it served."""
    failed = []
    for name, path in starts:
        _, output = state.inventory.get_host(name).run_shell_command(StringCommand("cat", QuoteString(path), "2>/dev/null"), _sudo=True)
        try:
            record = json.loads("\n".join(output.stdout_lines) or "{}")
        except ValueError:
            continue
        if isinstance(record, dict) and not record.get("healthy", True) and record.get("failed_starts", 0) >= 1:
            failed.append(name)
    return failed


def first_token(state, host, probe: StringCommand, wait: int, what: str, node_names: list[str], backoff: list[tuple[str, str]]) -> bool:
    """Run the health probe until the head generates a token, for ``wait`` seconds at most and no
    longer once a node's vLLM has ended before it served (its backoff record says so, read
    between probes of PROBE_SLICE seconds). When none comes, the step fails saying why: the
    status table of every node (tasks/status.py's: the failing side's rows show the last lines
    of its container's log), then which rows fail."""
    started = time.monotonic()
    while True:
        left = int(wait - (time.monotonic() - started))
        ok, output = host.run_shell_command(StringCommand(probe, "--wait", str(max(0, min(PROBE_SLICE, left)))), _sudo=True)
        waited = time.monotonic() - started
        if ok:
            host.log(f"{what}: first token after {waited:.1f} s", logger.info)
            return True
        failed = failed_starts(state, backoff)
        if failed or waited >= wait:
            break
    reading = api_reading(output.stdout_lines)
    error = reading["error"]
    if failed:
        error = f"vLLM ended before it served on {', '.join(failed)}, and Docker started it again; the probe: {error}"
    for line in output.stderr_lines[-10:]:
        host.log(line, logger.error)
    checks = cluster_status([state.inventory.get_host(name) for name in node_names])
    click.echo(table.render(checks, "status"))
    host.log(f"{what}: no token after {waited:.1f} s ({error}); failing: {table.failure_summary(checks) or 'no row of the status'}",
             logger.error)
    return False


@operation()
def head_stopped_for_change(stacks: list[StackSettings]):
    """
    On the head: stop its vLLM when any node's stack is about to change or a worker is not
    running its current one, so the workers restart with no head waiting on a dead session.
    Refuses first, stopping nothing, a tensor parallel the model's attention heads do not divide,
    and a profile's speculative key the image's vLLM lacks.

    + stacks: every node's stack settings (``stack_settings``), in rank order

    **Example:**

    .. code:: python

        head_stopped_for_change(stacks=[stack_settings(cluster, node.hostname) for node in cluster.nodes])
    """
    if not acts_here("head"):
        return
    settings = own(stacks)
    heads_divided(settings)
    image_supports(settings)
    readings = read_cluster(stacks, "restarting the serving cluster")
    if None in readings:
        return
    _, everywhere = cluster_stacks(stacks, readings)
    mine = readings[settings.rank]
    running = mine["container"] is not None and mine["container"]["status"] == "running"
    if everywhere or not running:
        host.noop("the head keeps running" if running else "the head is not running")
        return
    yield stop(settings.stack_dir)


def probe(settings: StackSettings) -> StringCommand:
    """The head's one-token probe through the API (its --wait is the caller's)."""
    return StringCommand("python3", QuoteString(settings.programs), "health", "--url",
                         QuoteString(f"http://{settings.api_host}:{settings.api_port}"), "--key-file", QuoteString(settings.api_key_file))


def starts(stacks: list[StackSettings]) -> list[tuple[str, str]]:
    """Every node's name and backoff record (watchdog.py's), for ``first_token``."""
    return [(settings.hostname, f"{settings.restarts_dir}/{settings.role}-starts") for settings in stacks]


def recording(stacks: list[StackSettings], states: list[dict]) -> StringCommand:
    """Every node's stack recorded as the state that serves, each with its ``states`` entry
    (operations/records.py)."""
    return on_every_node(stacks, [record(settings, values) for settings, values in zip(stacks, states)],
                         "recording the state that serves")


def way_back(stacks: list[StackSettings], readings: list[dict], cluster: str, name: str) -> tuple[list[StringCommand] | None, str]:
    """The commands that return every node to its record ``name`` (the head stopped first, the
    workers started fresh, then the head) and a line naming that state; or None and why there is
    no way back."""
    records = [reading["records"][name] for reading in readings]
    missing = [settings.hostname for settings, found in zip(stacks, records) if found is None]
    if missing:
        return None, f"no state that served before is recorded on {', '.join(missing)}"
    if len({found["cluster"] for found in records}) != 1:
        return None, "the nodes' records of the state that served before disagree (a node was out of the run that recorded it)"
    if records[0]["cluster"] == cluster:
        return None, "it is the state recorded as the one that served"
    head, workers = stacks[0], stacks[1:]
    return [stop(head.stack_dir), on_every_node(workers, [restore(worker, name) for worker in workers], "the rollback"),
            StringCommand(restore(head, name))], described(records[0])


def served_or_rolled_back(state, host, probe: StringCommand, wait: int, what: str, node_names: list[str], backoff: list[tuple[str, str]],
                          recorded: StringCommand, back: list[StringCommand] | None, back_what: str) -> bool:
    """Wait for the first token; once it comes, record the state that serves. When none comes,
    run ``back`` (the state that served before, on every node) and wait for it in turn; the step
    fails either way, saying what failed and where the cluster is."""
    if first_token(state, host, probe, wait, what, node_names, backoff):
        return streamed(state, host, recorded)
    if back is None:
        host.log(f"{what}: not rolled back: {back_what}", logger.error)
        return False
    host.log(f"{what} failed: rolling every node back to the state that served before it: {back_what}", logger.warning)
    for command in back:
        if not streamed(state, host, command):
            host.log("the rollback failed at the step above: nothing serves. Fix: see the errors above, then run the deploy again",
                     logger.error)
            return False
    if first_token(state, host, probe, wait, f"rolled back to {back_what}", node_names, backoff):
        host.log(f"{what} generated no token, so every node was rolled back, and serves again: {back_what}. Why it failed: the "
                 "status table and log lines above. The site still names the change: the next run tries it again. To leave a failed "
                 "change in place for debugging: --data rollback_on_failure=false", logger.error)
    return False


def recorded_if_serving(state, host, probe: StringCommand, recorded: StringCommand) -> bool:
    """Record the state in place as the one that serves, if the head generates a token now."""
    ok, _ = host.run_shell_command(StringCommand(probe, "--wait", "30"), _sudo=True)
    if not ok:
        host.log("the stacks are in place but the head generates no token now: the state is recorded by a later run", logger.warning)
        return True
    return streamed(state, host, recorded)


@operation()
def stack_up(role: str, stacks: list[StackSettings], ready_timeout: int, rollback: bool):
    """
    Install this node's stack when it changed and start it when any node's is not in place:
    every worker fresh (``--force-recreate``), the head after them, and then the head waits until
    a token is generated through the API, and records on every node the state that serves
    (operations/records.py). When no token comes, every node returns to the state that served
    before (``rollback``), and the step fails saying why. The head's API key is made on the first
    run (a random token, in a file only the deploy user reads; it never leaves the head). A tensor
    parallel the model's attention heads do not divide, or a speculative key the image's vLLM
    lacks, is refused before anything is installed.

    + role: the nodes this step starts ("worker" or "head")
    + stacks: every node's stack settings (``stack_settings``), in rank order
    + ready_timeout: seconds the head waits for the first token
    + rollback: return to the state that served before when no token comes

    **Example:**

    .. code:: python

        stack_up(role="worker", stacks=[stack_settings(cluster, node.hostname) for node in cluster.nodes],
                 ready_timeout=1800, rollback=True)
    """
    if not acts_here(role):
        return
    settings = own(stacks)
    heads_divided(settings)
    image_supports(settings)
    readings = read_cluster(stacks, "starting the serving cluster")
    mine = readings[settings.rank]
    wanted, everywhere = cluster_stacks(stacks, readings)
    stack = wanted[settings.rank]
    head = settings.role == "head"
    files_ok = mine["compose"] == stack.compose.splitlines() and mine["launch"] == stack.launch.splitlines()
    if not files_ok:  # before any other command: pyinfra's check for a change (--dry) stops at the first one
        yield from install(stack, mine, settings.stack_dir)
    if head and not mine["api_key"]:
        key = QuoteString(settings.api_key_file)
        yield StringCommand("umask", "077", "&&", "python3", "-c", QuoteString("import secrets; print(secrets.token_urlsafe(32))"),
                            ">", key, "&&", "chown", QuoteString(f"{settings.deploy_user}:"), key)
    if None in readings:
        return  # a node started without all the others waits at the rendezvous for ever: the next run starts them
    cluster = cluster_state([found.hash for found in wanted])
    states = [state_of(node, found.hash, cluster, readings[0]["model_digest"]) for node, found in zip(stacks, wanted)]
    if everywhere:
        if head and any(reading["records"]["served"] is None or reading["records"]["served"]["cluster"] != cluster
                        for reading in readings):
            host.log("will record on every node the state in place as the one that serves (the way back for the next change), "
                     "once the head generates a token", logger.info)
            yield FunctionCommand(recorded_if_serving, (probe(settings), recording(stacks, states)), {})
            return
        host.noop(f"the {settings.role} serves profile {settings.profile_name} (stack {stack.hash})")
        return
    # a start the deploy makes is no crash loop: it owes no backoff (the watchdog's record of failed starts)
    yield StringCommand("rm", "-f", QuoteString(f"{settings.restarts_dir}/{settings.role}-starts"))
    yield compose(settings.stack_dir, "up", "-d", "--force-recreate", "--remove-orphans", "--timeout", str(STOP_TIMEOUT))
    if head:
        back, back_what = way_back(stacks, readings, cluster, "served") if rollback else (None, "rollback_on_failure is false")
        yield FunctionCommand(served_or_rolled_back, (
            probe(settings), int(ready_timeout), f"serving {settings.model.served_name} (profile {settings.profile_name})",
            [node.hostname for node in stacks], starts(stacks), recording(stacks, states), back, back_what), {})
