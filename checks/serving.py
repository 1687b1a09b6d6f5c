"""Rules for serving: each node runs the stack installed for the configured profile; the head's
API generates a token with its key and listens only where the site says."""

from __future__ import annotations

import yaml

from checks import FAIL, PASS, Check

LOGS = "docker logs --tail 50 dual-spark-vllm"


def installed_stack(compose: list[str] | None) -> str | None:
    """The stack hash the node's compose file labels its container with (None: no readable file)."""
    try:
        stack = yaml.safe_load("\n".join(compose or []))
        return str(stack["services"]["vllm"]["labels"]["dual-spark.stack"])
    except (yaml.YAMLError, KeyError, TypeError):
        return None


def container_check(name: str, profile: str, serving: dict) -> Check:
    container = serving["container"]
    installed = installed_stack(serving["compose"])
    if installed is None:
        return Check(name, "vLLM stack", FAIL, "no stack installed", "run the deploy (tasks/serving.py installs it)")
    if container is None:
        return Check(name, "vLLM stack", FAIL, "no container", "run the deploy: it starts the worker, then the head")
    if container["status"] != "running":
        return Check(name, "vLLM stack", FAIL, f"container {container['status']} (restarted {container['restarts']} times)",
                     f"`{LOGS}` on {name} says why; the deploy restarts the pair, worker first")
    if container["stack"] != installed or container["profile"] != profile:
        return Check(name, "vLLM stack", FAIL, f"runs stack {container['stack']} ({container['profile']}), "
                     f"installed {installed} ({profile})", "run the deploy: it restarts the pair on the installed stack")
    return Check(name, "vLLM stack", PASS, f"running profile {profile} (stack {installed}), up since {container['started'][:19]}Z")


def api_checks(name: str, host: str, port: int, api: dict, listening: list[str]) -> list[Check]:
    where = f"{host}:{port}"
    if api["ok"]:
        checks = [Check(name, "API", PASS, f"generates tokens at {where} as {api['model']} (max model len {api['max_model_len']})")]
    else:
        checks = [Check(name, "API", FAIL, api["error"] or "no token generated",
                        f"`{LOGS}` on both nodes; if the worker died, the deploy restarts the pair (worker first)")]
    others = sorted(address for address in listening if address not in (host, f"[{host}]"))
    if others:
        checks.append(Check(name, "API exposure", FAIL, f"port {port} also listens on {', '.join(others)}",
                            f"something else binds port {port}, or the API was started with another host: keep api_host = \"{host}\""))
    else:
        checks.append(Check(name, "API exposure", PASS, f"only on {where}"))
    return checks
