"""What a node's serving stack is, as pure functions of the site: vLLM's arguments, the stack's
settings for one node, its compose file (as data) and launch script, and the docker compose
commands that act on it. operations/serving.py installs and starts it; operations/handover.py
waits for it to serve and finds the way back."""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass

import yaml
from pyinfra import host
from pyinfra.api import OperationError, QuoteString, StringCommand

from cluster import Cluster, Node, Settings
from facts.fabric import roce_v2_gid_index
from layout import (
    CACHE_ENV,
    COMPOSE_PROJECT,
    CONTAINER,
    DOOR,
    HEALTH_INTERVAL,
    IN_CONTAINER,
    LABELS,
    PLANNED_WORK,
    RECORDS,
    STACK_FILES,
    STOP_TIMEOUT,
    VLLM_HOST,
    cache_key,
    paths,
    smoke_marker,
    store_entry,
)
from operations.door import change_lapse
from operations.own import cache_kept as kept
from operations.render import render
from programs import digest

# A profile's keys that vLLM's --speculative-config takes as these SpeculativeConfig fields, only
# when the profile sets them (the image must have the field: image_supports).
SPECULATIVE_FIELDS = {"speculative_schedule": "num_speculative_tokens_per_batch_size",
                      "adaptive_verification": "enable_adaptive_verification"}


def speculative_config(settings: StackSettings) -> str | None:
    """vLLM's --speculative-config of the profile, as JSON; None when it does not speculate."""
    profile = settings.cluster.profile
    if not profile.speculative_tokens:
        return None
    speculative = {"method": settings.site.speculative_method, "num_speculative_tokens": profile.speculative_tokens}
    for key, field in SPECULATIVE_FIELDS.items():
        if getattr(profile, key) is not None:
            speculative[field] = getattr(profile, key)
    speculative.update(settings.site.speculative_options)
    return json.dumps(speculative, separators=(",", ":"))


def vllm_args(settings: StackSettings) -> list[str]:
    """The `vllm serve` arguments of one node (FACTS.md's launch line), from its stack settings."""
    profile, model = settings.cluster.profile, settings.cluster.model
    head = settings.role == "head"
    args = [IN_CONTAINER["model"], "--served-model-name", model.served_name]
    if head:
        args += ["--host", VLLM_HOST, "--port", str(settings.site.vllm_port)]
    args += [
        "--trust-remote-code", "--tensor-parallel-size", str(settings.cluster.tensor_parallel),
        "--pipeline-parallel-size", str(settings.cluster.pipeline_parallel),
        "--kv-cache-dtype", profile.kv_cache_dtype, "--block-size", str(settings.site.block_size),
        "--max-model-len", str(profile.max_model_len), "--max-num-seqs", str(profile.max_num_seqs),
        "--max-num-batched-tokens", str(profile.max_num_batched_tokens),
        "--gpu-memory-utilization", str(profile.gpu_memory_utilization),
        "--enable-prefix-caching" if profile.prefix_caching else "--no-enable-prefix-caching",
    ]
    if speculative_config(settings) is not None:
        args += ["--speculative-config", speculative_config(settings)]
    args += ["--tokenizer-mode", model.tokenizer_mode, "--distributed-executor-backend", "mp"]
    if model.tool_call_parser:
        args += ["--tool-call-parser", model.tool_call_parser, "--enable-auto-tool-choice"]
    if model.reasoning_parser:
        args += ["--reasoning-parser", model.reasoning_parser]
    args += [
        "--default-chat-template-kwargs", json.dumps({"thinking": profile.thinking}, separators=(",", ":")),
        "--generation-config", "vllm",
        "--override-generation-config", json.dumps(settings.site.generation_config, separators=(",", ":")),
    ]
    if profile.flashinfer_autotune:
        args.append("--enable-flashinfer-autotune")
    if profile.weight_prefetch:
        args += ["--safetensors-load-strategy", "prefetch"]
    args += ["--nnodes", str(settings.cluster.size), "--node-rank", str(settings.rank), "--master-addr", settings.cluster.master_addr,
             "--master-port", str(settings.site.master_port)]
    if not head:
        args.append("--headless")
    return args + list(settings.site.vllm_extra_args)


@dataclass(frozen=True)
class StackSettings:
    """One node's stack: the cluster, and the node it is for. Its compose file and launch script
    render the site's settings (``site``), the node's place in the cluster, what it serves and
    the deploy's paths on it, each read from these two."""

    cluster: Cluster
    hostname: str

    @property
    def site(self) -> Settings:
        return self.cluster.settings

    @property
    def node(self) -> Node:
        return self.cluster.node(self.hostname)

    @property
    def rank(self) -> int:
        return self.node.rank

    @property
    def role(self) -> str:
        return self.node.role

    @property
    def rails(self) -> list[dict]:
        """Rail.as_data() of each rail, rail 0 first."""
        return self.node.rail_data

    @property
    def worker_addresses(self) -> list[str]:
        return [str(worker.rails[0].address.ip) for worker in self.cluster.workers]

    @property
    def model_dir(self) -> str:
        """The model's own directory of the model store."""
        return store_entry(self.site.model_dir, self.cluster.model.source)

    @property
    def paths(self) -> dict[str, str]:
        return paths(self.site.state_dir, self.model_dir)

    @property
    def programs(self) -> str:
        return self.paths["programs"]

    @property
    def restarts_dir(self) -> str:
        return self.paths["serving"]

    @property
    def cache_dir(self) -> str:
        """This image's caches (layout.cache_key), kept across restarts."""
        return f"{self.paths['cache']}/{cache_key(self.cluster.image.tag)}"

    @property
    def api_key_file(self) -> str:
        return self.paths["api_key"]

    @property
    def manifest(self) -> str:
        return self.paths["manifest"]

    @property
    def smoke_marker(self) -> str:
        return smoke_marker(self.site.state_dir, self.cluster.image.tag)

    def rendered(self) -> dict:
        """What the compose file's header and the launch script name, by the names they use."""
        cluster, site = self.cluster, self.site
        return {"role": self.role, "rank": self.rank, "rails": self.rails, "worker_addresses": self.worker_addresses,
                "nodes": cluster.size, "tensor_parallel": cluster.tensor_parallel, "pipeline_parallel": cluster.pipeline_parallel,
                "profile_name": cluster.profile_name, "python": cluster.image.python, "master_addr": cluster.master_addr,
                "watchdog_port": site.watchdog_port, "vllm_port": site.vllm_port, "ready_timeout": site.serving_ready_timeout}


def stack_settings(cluster: Cluster, hostname: str) -> StackSettings:
    """One node's stack settings, from the cluster."""
    return StackSettings(cluster, hostname)


def state_arguments(settings: StackSettings) -> dict:
    """ServingState's arguments: the same on every node (the manifest exists on the head only)."""
    return {"stack_dir": settings.site.stack_dir, "key_file": settings.api_key_file, "model_record": settings.manifest}


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
    caches = {name: f"{IN_CONTAINER['cache']}/{below}" for name, below in CACHE_ENV.items()}
    return {**own, **caches, **settings.site.serving_env, **settings.cluster.image.env, **settings.cluster.profile.env, **settings.site.container_env}


def compose_stack(settings: StackSettings, env: dict[str, str], stack_hash: str, model_digest: str) -> dict:
    """The node's compose stack as data: every value a site gives lands as a value, never as YAML."""
    role, profile, site = settings.role, settings.cluster.profile, settings.site
    service = {
        "image": settings.cluster.image.tag, "pull_policy": "never", "container_name": CONTAINER,
        "restart": "unless-stopped", "init": True, "network_mode": "host", "ipc": "host", "shm_size": "64gb",
        "privileged": profile.privileged,
    }
    if site.container_gpus:
        service["gpus"] = int(site.container_gpus) if site.container_gpus.isdecimal() else site.container_gpus
    if site.container_devices:
        service["devices"] = [f"{device}:{device}" for device in site.container_devices]
    service["ulimits"] = dict(site.container_ulimits)
    service["labels"] = {LABELS["role"]: role, LABELS["profile"]: settings.cluster.profile_name,
                         LABELS["model"]: model_digest, LABELS["stack"]: stack_hash}
    inside = IN_CONTAINER
    service["volumes"] = [
        f"{settings.model_dir}:{inside['model']}:ro", f"./launch.sh:{inside['launch']}:ro",
        f"{settings.programs}:{inside['programs']}:ro",
        f"{settings.restarts_dir}:{inside['state']}",
        # made and marked by the deploy before each start (cache_kept), never by Docker
        {"type": "bind", "source": settings.cache_dir, "target": inside["cache"], "bind": {"create_host_path": False}},
        *([f"{settings.api_key_file}:{inside['api_key']}:ro"] if role == "head" else []),
        *(f"{path}:{path}:ro" for path in site.container_mounts),
        *(f"{path}:{inside['secrets']}/{name}:ro" for name, path in sorted(site.container_secrets.items())),
    ]
    service["environment"] = {name: value.replace("$", "$$") for name, value in env.items()}  # compose reads $ as its own
    service["entrypoint"] = [inside["launch"]]
    service["healthcheck"] = {
        "test": ["CMD", settings.cluster.image.python, inside["programs"], "watchdog", "check", "--ip", settings.rails[0]["address"],
                 "--port", str(site.watchdog_port)],
        "interval": f"{HEALTH_INTERVAL}s", "timeout": "10s", "retries": 3,
    }
    return {"name": COMPOSE_PROJECT, "services": {"vllm": service}}


# libyaml's safe dumper and loader where PyYAML has them (its wheels do): the same text, a few times faster.
SafeDumper, SafeLoader = getattr(yaml, "CSafeDumper", yaml.SafeDumper), getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def compose_file(settings: StackSettings, env: dict[str, str], stack_hash: str, model_digest: str) -> str:
    """compose.yaml: a managed-file header, then the stack serialised by a YAML library and read
    back to prove it says what was meant."""
    stack = compose_stack(settings, env, stack_hash, model_digest)
    text = render("serving/compose-header.yaml.j2", **settings.rendered()) + yaml.dump(stack, Dumper=SafeDumper, sort_keys=False, width=10**6)
    if yaml.load(text, Loader=SafeLoader) != stack:
        raise OperationError(f"{settings.site.stack_dir}/compose.yaml would not read back as the stack meant: refusing to write it")
    return text


def desired(settings: StackSettings, gid: int, model_digest: str | None) -> Stack:
    """The node's compose file and launch script; the stack hash names both (a container label).
    The launch script names the watchdog's version: a new watchdog restarts the cluster."""
    launch = render("serving/launch.sh.j2", **settings.rendered(), vllm_host=VLLM_HOST, command=[settings.cluster.image.vllm, "serve"] + vllm_args(settings),
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


def cache_kept(settings: StackSettings) -> StringCommand:
    """Before a start: this image's caches claimed, and those of images no stack file of this node
    names (the stack in place, its previous one, the recorded states': the way back starts warm)
    removed, if the deploy made them (operations/own.py)."""
    compose_file = STACK_FILES[0]
    named = [f"{settings.site.stack_dir}/{compose_file}", f"{settings.site.stack_dir}/{compose_file}.previous",
             *(f"{settings.site.stack_dir}/{record}/{compose_file}" for record in RECORDS)]
    state_dir = posixpath.dirname(posixpath.dirname(settings.cache_dir))  # state_dir/cache/KEY
    return kept(settings.programs, state_dir, settings.cache_dir, named)


def compose(stack_dir: str, *args: str) -> StringCommand:
    return StringCommand("docker", "compose", "--project-directory", QuoteString(stack_dir), "-f",
                         QuoteString(f"{stack_dir}/compose.yaml"), *args)


def stop(stack_dir: str) -> StringCommand:
    """Stop the node's stack, waiting STOP_TIMEOUT seconds (not Docker's 10) before killing vLLM."""
    return compose(stack_dir, "stop", "--timeout", str(STOP_TIMEOUT))


def drained_stop(settings: StackSettings) -> StringCommand:
    """The head's stop for a planned change: planned work is marked first, and silenced in
    Alertmanager (both lapse after the drain, a change's wait for its first token and its
    rollback's, and a minute, if no end comes: ``change_lapse``); the front door holds new
    requests and lets those in flight finish (up to door_drain_seconds) before vLLM stops, and
    holds them until ``planned_done`` opens it (or the lapse)."""
    lapses = change_lapse(settings.site)
    return StringCommand("python3", QuoteString(settings.programs), "planned", "begin", "--file", QuoteString(planned_file(settings)),
                         "--seconds", str(lapses), "--what", QuoteString("a deploy run stops and starts serving"), "&&",
                         *silence(settings, "begin"), "&&",
                         "python3", QuoteString(settings.programs), "door", "stop", "--socket", DOOR["socket"], "--drain",
                         str(settings.site.door_drain_seconds), "--", stop(settings.site.stack_dir))


def silence(settings: StackSettings, verb: str) -> tuple:
    """``silence begin`` or ``end`` (files/dual_spark/silence.py): the planned work in the head's Alertmanager."""
    return ("python3", QuoteString(settings.programs), "silence", verb, "--file", QuoteString(planned_file(settings)),
            "--alertmanager", f"http://127.0.0.1:{settings.site.alertmanager_port}")


def planned_file(settings: StackSettings) -> str:
    return f"{settings.restarts_dir}/{PLANNED_WORK}"


def planned_done(settings: StackSettings) -> StringCommand:
    """The end of the planned work drained_stop marked: the head serves a state that passed its
    canaries (or the one before), or the run gave up. The door lets the requests it held go on
    first; the planned work ends whether or not it could (it says why where it could not)."""
    return StringCommand("python3", QuoteString(settings.programs), "door", "open", "--socket", DOOR["socket"], ";",
                         *silence(settings, "end"), "&&", "python3", QuoteString(settings.programs), "planned", "end", "--file",
                         QuoteString(planned_file(settings)))
