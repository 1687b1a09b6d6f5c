"""Where the deploy keeps things on a node and what it names them: paths under state_dir, the
container, its labels, the compose project, the API key, the model directory's own files, the
paths inside the container, the model store's entries, and the SSH options of node-to-node commands. The programs that run
on the nodes (files/dual_spark/) get what they need of it as a module written into their archive
(programs.py); the serving templates cannot import it: tests/test_layout.py holds them to it."""

from __future__ import annotations

import hashlib
import json
import re
import shlex

COMPOSE_PROJECT = "dual-spark"
CONTAINER = "dual-spark-vllm"
# Seconds Docker waits for a vLLM container the deploy stops or replaces before it kills it: the head
# is stopped first, and a rank whose head is gone waits on a collective that never ends, which
# vLLM's own shutdown ends with SIGKILL after about 10 s (Docker's default wait): nothing is gained.
STOP_TIMEOUT = 3
LABELS = {key: f"dual-spark.{key}" for key in ("role", "profile", "model", "stack")}
API_KEY = "api-key"  # the file in state_dir holding the API key
# The first or second line of every configuration file the deploy writes: one without it is not
# the deploy's, and is never overwritten (operations/managed.py ``refuse_theirs``).
MANAGED_HEADER = "# Managed by the dual-spark deploy"
MANAGED_MARKER = ".dual-spark-managed"  # in a model directory the deploy made (sync cleans only those)
MANIFEST = ".dual-spark-manifest.json"  # in a model directory on the head: its SHA-256 manifest
VERIFIED = ".dual-spark-verified.json"  # in a model directory on a worker: what was verified there
OWN_FILES = ".dual-spark-"  # the prefix of the deploy's own files in a model directory, never replicated
RUN_DIR = "/run/dual-spark"  # staging, gone at a reboot
# In stack_dir: the stack files of the last state that served (a first token came), and of the
# one that served before it, each with its state.json (what it served, since when): the way back.
RECORDS = ("served", "rollback")
STACK_FILES = ("compose.yaml", "launch.sh")  # in stack_dir: a node's stack
RECORD_STATE = "state.json"
# In stack_dir on the head: the last canary run's answers and results (files/dual_spark/canary.py),
# kept in served/ with the state they passed on.
CANARY_ANSWERS = "canary.json"
# In paths()["serving"] on the head: the mark of a deploy's planned work (files/dual_spark/planned.py),
# there while a run stops and starts serving; the collector exports it, the alerts wait for it.
PLANNED_WORK = "planned-work"
HEALTH_INTERVAL = 15  # seconds between two of Docker's health checks of a vLLM container

# Inside a container: what compose mounts where, and what launch.sh calls (the programs' archive
# also in the hub fetch's container).
IN_CONTAINER = {
    "dir": "/dual-spark",
    "launch": "/dual-spark/launch.sh",
    "programs": "/dual-spark/dual-spark.pyz",
    "state": "/dual-spark/state",
    "api_key": "/run/secrets/dual-spark-api-key",
    "secrets": "/run/secrets",  # the site's container_secrets, each NAME a file here
    "model": "/model",
    "cache": "/dual-spark/cache",  # this image's caches on the node (paths()["cache"]/cache_key), kept across restarts
    # in the container's own layer, on no mount: a restart of the container keeps it, a new one starts without
    "container_starts": "/var/tmp/dual-spark-container-starts",
}

# The `vllm serve` flags the deploy sets itself (operations/stack.py: vllm_args), each with the
# setting that governs it: a site's vllm_extra_args may not set one again (site_schema.py), and
# tests/test_layout.py holds this table to what vllm_args writes.
VLLM_FLAGS = {
    "--served-model-name": "model.served_name", "--host": "the front door (vLLM listens on loopback behind it)", "--port": "vllm_port",
    "--trust-remote-code": "the deploy (always on)", "--tensor-parallel-size": "the profile's tensor_parallel",
    "--pipeline-parallel-size": "the profile's pipeline_parallel", "--kv-cache-dtype": "the profile's kv_cache_dtype",
    "--block-size": "block_size", "--max-model-len": "the profile's max_model_len", "--max-num-seqs": "the profile's max_num_seqs",
    "--max-num-batched-tokens": "the profile's max_num_batched_tokens",
    "--gpu-memory-utilization": "the profile's gpu_memory_utilization", "--enable-prefix-caching": "the profile's prefix_caching",
    "--speculative-config": "speculative_method, speculative_options and the profile's speculative_tokens",
    "--tokenizer-mode": "model.tokenizer_mode", "--distributed-executor-backend": "the deploy (mp)",
    "--tool-call-parser": "model.tool_call_parser", "--enable-auto-tool-choice": "model.tool_call_parser",
    "--reasoning-parser": "model.reasoning_parser", "--default-chat-template-kwargs": "the profile's thinking",
    "--generation-config": "generation_config", "--override-generation-config": "generation_config",
    "--enable-flashinfer-autotune": "the profile's flashinfer_autotune", "--nnodes": "the [[node]] tables",
    "--node-rank": "the [[node]] tables", "--master-addr": "the head's rail 0 address", "--master-port": "master_port",
    "--headless": "the node's role", "--safetensors-load-strategy": "the profile's weight_prefetch",
}
# What sets the same by another name (vLLM 0.32's parser) or another way: the API key reaches vLLM
# by its environment, the model as the first argument, the hub token only the fetch; --uds moves
# the API off its address and --config reads any flag from a file.
VLLM_FLAG_ALIASES = {
    "--api-key": "the API key file (state_dir/api-key), which the deploy makes and hands to vLLM",
    "--hf-token": "hf_token_file, read by the hub fetch only", "--model": "[model]", "--uds": "vllm_port",
    "--config": "the site file", "-tp": VLLM_FLAGS["--tensor-parallel-size"], "-pp": VLLM_FLAGS["--pipeline-parallel-size"],
    "-n": VLLM_FLAGS["--nnodes"], "-r": VLLM_FLAGS["--node-rank"], "-sc": VLLM_FLAGS["--speculative-config"],
    "--device-memory-utilization": VLLM_FLAGS["--gpu-memory-utilization"],
}
# vLLM's parser reads an abbreviation (--hos for --host) and a short flag's value written on to it
# (-n4); these of its own flags begin one of the deploy's and are no abbreviation of it.
VLLM_FLAG_PREFIXES = ("--tokenizer",)


# Observability (tasks/observability.py): the OS's Prometheus and node exporter, configured through
# drop-ins of their Debian units, and the deploy's collector writing the exporter's textfile.
PROMETHEUS_DIR = "/etc/prometheus/dual-spark"  # prometheus.yml and its rule files, the deploy's
PROMETHEUS_STORAGE = "/var/lib/prometheus/metrics2"  # Debian's
# Alertmanager on the head delivers the alerts to the site's receivers. Its configuration names them
# (a webhook's URL may hold a token): root's, readable by the daemon's group alone, never shown whole.
ALERTMANAGER_CONFIG = f"{PROMETHEUS_DIR}/alertmanager.yml"
ALERTMANAGER_STORAGE = "/var/lib/prometheus/alertmanager"  # Debian's: silences and the notification log
# The collector runs as a system user of its own, which may write its own directory only; the node
# exporter reads its textfile there.
COLLECTOR_USER = "dual-spark-metrics"
TEXTFILE_DIR = "/var/lib/dual-spark-metrics"
TEXTFILE = f"{TEXTFILE_DIR}/dual-spark.prom"
COLLECTOR_STATE = f"{TEXTFILE_DIR}/.dual-spark-collector.json"  # the starts the collector has seen (not *.prom: not read)
# On the head, the watch of the answers while it serves (files/dual_spark/answers.py) runs as the
# collector's user, with the API key as a systemd credential, and writes a textfile of its own.
ANSWERS_TEXTFILE = f"{TEXTFILE_DIR}/dual-spark-answers.prom"
UNITS = {"prometheus": "prometheus", "node_exporter": "prometheus-node-exporter", "collector": "dual-spark-metrics",
         "alertmanager": "prometheus-alertmanager", "answers": "dual-spark-answers"}
UNIT_FILES = {
    "prometheus": "/etc/systemd/system/prometheus.service.d/50-dual-spark.conf",
    "alertmanager": "/etc/systemd/system/prometheus-alertmanager.service.d/50-dual-spark.conf",
    "node_exporter": "/etc/systemd/system/prometheus-node-exporter.service.d/50-dual-spark.conf",
    "collector": "/etc/systemd/system/dual-spark-metrics.service",
    "answers": "/etc/systemd/system/dual-spark-answers.service",
}
# The front door (tasks/door.py, docs/front-door.md): the OS's HAProxy on the head, run by a
# drop-in of its Debian unit with the deploy's configuration; vLLM listens behind it on loopback.
VLLM_HOST = "127.0.0.1"
DOOR = {
    "unit": "haproxy",
    "package": "haproxy",
    "dir": "/etc/haproxy/dual-spark",  # haproxy.cfg and its Lua, the deploy's
    "files": ("haproxy.cfg", "counts.lua", "hold.lua"),
    "dropin": "/etc/systemd/system/haproxy.service.d/50-dual-spark.conf",
    "socket": "/run/haproxy-dual-spark.sock",  # its runtime API, root's only: the drain before a planned stop
    # root's, mode 600, written on the head from the key files (door keys): never in a diff or a log
    "clients_map": "/etc/haproxy/dual-spark/clients.map",  # each key the door lets in -> its client's name
    "backend_map": "/etc/haproxy/dual-spark/backend.map",  # the key the door hands vLLM
    # on door_metrics_port beside HAProxy's exporter (/metrics): counts.lua's, held requests and per client
    "counts_path": "/counts",
}
SCRAPE_JOBS = {"vllm": "vllm", "node": "node", "prometheus": "prometheus", "door": "door", "door_counts": "door_counts"}
# The bucket bounds of vLLM's latency histograms (its /metrics, vLLM 0.32): an objective's bound is
# one of them, so that the share of requests within it is read from one bucket, never guessed.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
                640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
GRAFANA_PROJECT = "dual-spark-grafana"
GRAFANA_DATASOURCE_UID = "dual-spark-prometheus"


def ssh_options(connect_timeout: int = 5) -> list[str]:
    """ssh from one node to another (the deploy user's key): never a prompt, a dead peer fails fast."""
    return ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect_timeout}"]


SSH_OPTIONS = ssh_options()
FABRIC_CIPHER = "aes128-gcm@openssh.com"  # node-to-node ssh over the fabric (the image stream, sync)


# A directory of the model store: a readable slug of the source, then 12 hex digits of its hash.
STORE_ENTRY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}-[0-9a-f]{12}")


def store_entry(store: str, source: dict) -> str:
    """The directory of the model store (the site's model_dir) that holds one source (``Model.source``:
    a hub repository at a revision, or a path): its slug readable (the repository and the revision's
    first 12 characters, or the path's last name), in shell- and path-safe characters only; its
    last 12 hex digits the SHA-256 of the source's canonical JSON, so two sources never share one.

    .. code:: python

        store_entry("/var/lib/dual-spark/model", {"repo": "lab/tiny-llama", "revision": "9c1e0f2a7b3d" + "0" * 28})
        # "/var/lib/dual-spark/model/lab-tiny-llama-9c1e0f2a7b3d-832a99825131"
    """
    def safe(text: str, length: int) -> str:
        return re.sub(r"[^A-Za-z0-9._]+", "-", text).lstrip("._-")[:length].rstrip("-")

    if "repo" in source:
        slug = "-".join(part for part in (safe(source["repo"], 38), safe(source["revision"], 12)) if part)
    else:
        slug = safe(source["path"].rstrip("/").rsplit("/", 1)[-1], 51)
    slug = slug or "model"
    digest = hashlib.sha256(json.dumps(source, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return f"{store.rstrip('/')}/{slug}-{digest[:12]}"


def paths(state_dir: str, model_dir: str) -> dict[str, str]:
    """Where the deploy's files live on a node; the model's records in ``model_dir``, the store
    entry of the model (``store_entry``)."""
    return {
        "programs": f"{state_dir}/bin/dual-spark.pyz",  # files/dual_spark as one zipapp (programs.py)
        "serving": f"{state_dir}/serving",  # the watchdogs' backoff records
        "planned": f"{state_dir}/serving/{PLANNED_WORK}",
        "manifest": f"{model_dir}/{MANIFEST}",
        "api_key": f"{state_dir}/{API_KEY}",  # the deploy's own key: vLLM's, and the front door's "deploy" client
        "clients": f"{state_dir}/clients",  # NAME.key of each [client.NAME], the deploy user's, mode 600
        "verified": f"{model_dir}/{VERIFIED}",
        "smoke": f"{state_dir}/runtime",
        "cache": f"{state_dir}/cache",  # what vLLM and its libraries compiled or tuned, a directory per image (cache_key)
    }


def cache_key(tag: str) -> str:
    """The directory of an image's caches under paths()["cache"], from its tag (dual-spark/NAME:HEX12,
    HEX12 its digest or build context's): NAME-HEX12. A new image starts with an empty one.

    .. code:: python

        cache_key("dual-spark/tony-overlay:8c83abf6f44b")  # "tony-overlay-8c83abf6f44b"
    """
    return tag.split("/", 1)[-1].replace(":", "-")


# Inside a container, under IN_CONTAINER["cache"]: where each library keeps what it compiled or
# tuned (docs/serving.md, "Restarts and the caches"). vLLM's own (VLLM_CACHE_ROOT) holds
# torch.compile's artefacts (torch_compile_cache, with inductor's and, unless TRITON_CACHE_DIR is set,
# Triton's), FlashInfer's autotuning results and DeepGEMM's JIT kernels (DG_JIT_CACHE_DIR's
# default); Triton's kernels (with TRITON_CACHE_DIR set, torch.compile's too) and FlashInfer's JIT
# modules (FLASHINFER_WORKSPACE_BASE/.cache/flashinfer) have their own.
CACHE_ENV = {"VLLM_CACHE_ROOT": "vllm", "TRITON_CACHE_DIR": "triton", "FLASHINFER_WORKSPACE_BASE": "flashinfer"}


def smoke_marker(state_dir: str, tag: str) -> str:
    """Where a node records that the image ``tag`` names passed its smoke test, as a shell word:
    one file per image ID, so that another tag of the same image is not tested again."""
    return f'"{paths(state_dir, "")["smoke"]}/$(docker image inspect -f {{{{.Id}}}} {shlex.quote(tag)} 2>/dev/null)"'
