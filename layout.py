"""Where the deploy keeps things on a node and what it names them: paths under state_dir, the
container, its labels, the compose project, the API key, the model directory's own files, the
paths inside the container, and the SSH options of node-to-node commands. The programs that run
on the nodes (files/dual_spark/) get what they need of it as a module written into their archive
(programs.py); the serving templates cannot import it: tests/test_layout.py holds them to it."""

from __future__ import annotations

COMPOSE_PROJECT = "dual-spark"
CONTAINER = "dual-spark-vllm"
LABELS = {key: f"dual-spark.{key}" for key in ("role", "profile", "model", "stack")}
API_KEY = "api-key"  # the file in state_dir holding the API key
MANAGED_MARKER = ".dual-spark-managed"  # in a model directory the deploy made (sync cleans only those)
VERIFIED = ".dual-spark-verified.json"  # in a model directory: what was verified there
OWN_FILES = ".dual-spark-"  # the prefix of the deploy's own files in a model directory, never replicated
RUN_DIR = "/run/dual-spark"  # staging, gone at a reboot
# In stack_dir: the stack files of the last state that served (a first token came), and of the
# one that served before it, each with its state.json (what it served, since when): the way back.
RECORDS = ("served", "rollback")
RECORD_STATE = "state.json"

# Inside a container: what compose mounts where, and what launch.sh calls (the programs' archive
# also in the hub fetch's container).
IN_CONTAINER = {
    "dir": "/dual-spark",
    "launch": "/dual-spark/launch.sh",
    "programs": "/dual-spark/dual-spark.pyz",
    "state": "/dual-spark/state",
    "api_key": "/run/secrets/dual-spark-api-key",
    "model": "/model",
}


def ssh_options(connect_timeout: int = 5) -> list[str]:
    """ssh from one node to another (the deploy user's key): never a prompt, a dead peer fails fast."""
    return ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect_timeout}"]


SSH_OPTIONS = ssh_options()
FABRIC_CIPHER = "aes128-gcm@openssh.com"  # node-to-node ssh over the fabric (the image stream, sync)


def paths(state_dir: str, model_dir: str) -> dict[str, str]:
    """Where the deploy's files live on a node."""
    return {
        "programs": f"{state_dir}/bin/dual-spark.pyz",  # files/dual_spark as one zipapp (programs.py)
        "serving": f"{state_dir}/serving",  # the watchdogs' backoff records
        "manifest": f"{state_dir}/model.manifest.json",
        "api_key": f"{state_dir}/{API_KEY}",
        "verified": f"{model_dir}/{VERIFIED}",
        "smoke": f"{state_dir}/runtime",
    }


def smoke_marker(state_dir: str, tag: str) -> str:
    """Where a node records the image ID that passed its smoke test."""
    return f"{paths(state_dir, '')['smoke']}/{tag.replace('/', '_').replace(':', '_')}"
