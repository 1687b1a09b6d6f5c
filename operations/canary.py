"""The canary set, run on the head after a change has served its first token: its command
(files/dual_spark/canary.py), given the set's prompts and lengths from the site, the answers
recorded with the state that served before as its reference, and stack_dir/canary.json for its
answers, which `stack record` keeps with the state when they passed (operations/records.py).
On demand (`tasks/verify.py --data canary=full`), the same set against the state that serves,
its answers kept nowhere."""

from __future__ import annotations

import json

from pyinfra import host
from pyinfra.api import FunctionCommand, OperationError, QuoteString, StringCommand, operation

from cluster import Cluster
from facts.serving import ServingState
from files.dual_spark.canary import ASKED_WITH, UNKNOWN
from layout import CANARY_ANSWERS, RUN_DIR, VLLM_HOST
from operations.peer import acts_here
from operations.readings import Reading, plans
from operations.runtime import streamed
from operations.stack import StackSettings, stack_settings, state_arguments


@plans
def readings(cluster: Cluster, name: str) -> list[Reading]:
    """The head's stack reading, for the state that serves, where verification runs the canaries."""
    if cluster.settings.canary != "full" or cluster.node(name).role != "head":
        return []
    return [(ServingState, state_arguments(stack_settings(cluster, name)))]


def canary_set(settings: StackSettings) -> list[dict]:
    """The site's canaries, each with its length resolved, in name order; one with a tool is not
    run (and says why) where [model] names no tool-call parser: vLLM would refuse its request."""
    site, model = settings.site, settings.cluster.model
    found = []
    for name, canary in sorted(settings.cluster.canaries.items()):
        length = site.canary_long_tokens if canary.long else canary.max_tokens
        if canary.perplexity:
            found.append({"name": name, "prompt": canary.prompt, "perplexity": True})
        elif canary.tool and not model.tool_call_parser:
            found.append({"name": name, "not_run": "it offers a tool, and [model] names no tool_call_parser"})
        else:
            found.append({"name": name, "prompt": canary.prompt, "max_tokens": length, "ignore_eos": canary.ignore_eos, "checks": list(canary.checks),
                          **{field: getattr(canary, field) for field in ASKED_WITH if getattr(canary, field)}})
    return found


def canaries(settings: StackSettings, cluster: str, model_digest: str, speculation: str | None, out: str | None = None) -> StringCommand | None:
    """The head's run of the canary set on state ``cluster`` (serving the weights of
    ``model_digest`` with ``speculation``, its --speculative-config: "none" where it does not
    speculate, None where the state is not the site's and its speculation is not known here, so
    its acceptance is recorded but judged against nothing), its answers to ``out`` (default:
    stack_dir/canary.json, which a record keeps); None when the site runs none (canaries = false,
    or no canary)."""
    found = canary_set(settings)
    if not settings.site.canaries or not found:
        return None
    stack_dir = settings.site.stack_dir
    return StringCommand("python3", QuoteString(settings.programs), "canary", "--url", QuoteString(f"http://{VLLM_HOST}:{settings.site.vllm_port}"),
                         "--key-file", QuoteString(settings.api_key_file), "--set", QuoteString(json.dumps(found)),
                         "--model-digest", model_digest, "--cluster", cluster, "--agree-tokens", str(settings.site.canary_agree_tokens),
                         "--perplexity-ratio", str(settings.site.canary_perplexity_ratio),
                         "--speculation", QuoteString(UNKNOWN if speculation is None else speculation),
                         "--acceptance-ratio", str(settings.site.canary_acceptance_ratio),
                         "--reference", QuoteString(f"{stack_dir}/served/{CANARY_ANSWERS}"),
                         "--out", QuoteString(out or f"{stack_dir}/{CANARY_ANSWERS}"))


@operation()
def checked_now(settings: StackSettings):
    """
    Run the canary set on the head against the state that serves, each greedy answer compared
    with the one recorded with that state; fail naming each canary that failed, how and where.
    Changes nothing (its answers go to the run directory). Refused when no state that serves is
    recorded, or the site runs no canaries.

    + settings: the head's stack settings (``stack_settings``)

    **Example:**

    .. code:: python

        checked_now(settings=stack_settings(cluster, cluster.head.hostname))
    """
    if not acts_here("head"):
        return
    served = host.get_fact(ServingState, **state_arguments(settings))["records"]["served"]
    if served is None:
        raise OperationError("no state that serves is recorded yet: the canaries have no answers to compare with. Fix: run the deploy")
    command = canaries(settings, served["cluster"], served["model_digest"], None, f"{RUN_DIR}/{CANARY_ANSWERS}")
    if command is None:
        raise OperationError("the site runs no canaries (canaries = false, or no [canary.NAME]). Fix: set canaries = true")
    yield StringCommand("mkdir", "-p", "-m", "700", RUN_DIR)
    yield FunctionCommand(streamed, (command,), {})
