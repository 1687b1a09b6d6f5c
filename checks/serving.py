"""Rules for serving: each node runs the stack installed for the configured profile; the head's
API generates a token with its key and listens only where the site says; the tensor parallel
divides the model's attention heads as vLLM needs."""

from __future__ import annotations

import yaml

from checks import FAIL, PASS, WARN, Check
from layout import CONTAINER, LABELS

LOGS = f"docker logs --tail 50 {CONTAINER}"


def installed_stack(compose: list[str] | None) -> str | None:
    """The stack hash the node's compose file labels its container with (None: no readable file)."""
    try:
        stack = yaml.safe_load("\n".join(compose or []))
        return str(stack["services"]["vllm"]["labels"][LABELS["stack"]])
    except (yaml.YAMLError, KeyError, TypeError):
        return None


def container_check(name: str, profile: str, serving: dict) -> Check:
    container = serving["container"]
    installed = installed_stack(serving["compose"])
    if installed is None:
        return Check(name, "vLLM stack", FAIL, "no stack installed", "run the deploy (tasks/serving.py installs it)")
    if container is None:
        return Check(name, "vLLM stack", FAIL, "no container", "run the deploy: it starts the workers, then the head")
    if container["status"] != "running":
        return Check(name, "vLLM stack", FAIL, f"container {container['status']} (restarted {container['restarts']} times)",
                     f"`{LOGS}` on {name} says why; the deploy restarts every node, workers first")
    if container["stack"] != installed or container["profile"] != profile:
        return Check(name, "vLLM stack", FAIL, f"runs stack {container['stack']} ({container['profile']}), "
                     f"installed {installed} ({profile})", "run the deploy: it restarts every node on the installed stack")
    return Check(name, "vLLM stack", PASS, f"running profile {profile} (stack {installed}), up since {container['started'][:19]}Z")


def api_checks(name: str, host: str, port: int, api: dict, listening: list[str]) -> list[Check]:
    where = f"{host}:{port}"
    if api["ok"]:
        checks = [Check(name, "API", PASS, f"generates tokens at {where} as {api['model']} (max model len {api['max_model_len']})")]
    elif api.get("busy"):
        work = api["busy"]
        checks = [Check(name, "API", WARN, f"no token for the probe, but busy, not hung: the engine finished steps on "
                                           f"{work['running']} running and {work['waiting']} waiting request(s) meanwhile ({api['error']})",
                        "nothing, if the pair is in use (a profile that serves one request at a time answers the probe after "
                        "the request before it): run tasks/verify.py again when it is idle")]
    else:
        checks = [Check(name, "API", FAIL, api["error"] or "no token generated",
                        f"`{LOGS}` on every node; if a worker died, the deploy restarts every node (workers first)")]
    others = sorted(address for address in listening if address not in (host, f"[{host}]"))
    if others:
        checks.append(Check(name, "API exposure", FAIL, f"port {port} also listens on {', '.join(others)}",
                            f"something else binds port {port}, or the API was started with another host: keep api_host = \"{host}\""))
    else:
        checks.append(Check(name, "API exposure", PASS, f"only on {where}"))
    return checks


def divides_heads(tensor_parallel: int, heads: int, kv_heads: int) -> bool:
    """vLLM 0.32's rule: the attention heads divide by the tensor parallel (ModelConfig's
    verify_with_parallel_config); the KV heads are split when there are more of them than ranks,
    else replicated, so one divides the other (QKVParallelLinear)."""
    if heads % tensor_parallel:
        return False
    return kv_heads % tensor_parallel == 0 if kv_heads > tensor_parallel else tensor_parallel % kv_heads == 0


def heads_refusal(profile: str, tensor_parallel: int, pipeline_parallel: int, heads: dict) -> str | None:
    """Why vLLM would refuse this split of the nodes for the model's head counts (``ModelHeads``),
    with the splits it takes; None when it takes this one or the counts are not known."""
    if heads["attention_heads"] is None or heads["kv_heads"] is None:
        return None
    attention, kv = heads["attention_heads"], heads["kv_heads"]
    if divides_heads(tensor_parallel, attention, kv):
        return None
    nodes = tensor_parallel * pipeline_parallel
    splits = [f"tensor_parallel = {tp}, pipeline_parallel = {nodes // tp}" for tp in range(nodes, 0, -1)
              if nodes % tp == 0 and divides_heads(tp, attention, kv)]
    return (f"profile {profile}: tensor_parallel = {tensor_parallel} does not fit the model's {attention} attention heads "
            f"and {kv} KV heads (vLLM needs the attention heads divisible by the tensor parallel, and the KV heads "
            f"divisible by it or it by them); nothing was stopped or restarted. Fix: in [profile.{profile}] of the site file "
            f"split the {nodes} nodes another way: {'; or '.join(splits)}.")
