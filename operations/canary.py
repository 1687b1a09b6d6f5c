"""The canary set, run on the head after a change has served its first token: its command
(files/dual_spark/canary.py), given the set's prompts and lengths from the site, the answers
recorded with the state that served before as its reference, and stack_dir/canary.json for its
answers, which `stack record` keeps with the state when they passed (operations/records.py)."""

from __future__ import annotations

import json

from pyinfra.api import QuoteString, StringCommand

from layout import CANARY_ANSWERS, VLLM_HOST
from operations.stack import StackSettings


def canary_set(settings: StackSettings) -> list[dict]:
    """The site's canaries, each with its length resolved, in name order."""
    site = settings.site
    return [{"name": name, "prompt": canary.prompt, "max_tokens": site.canary_long_tokens if canary.long else canary.max_tokens,
             "ignore_eos": canary.ignore_eos, "checks": list(canary.checks)} for name, canary in sorted(settings.cluster.canaries.items())]


def canaries(settings: StackSettings, cluster: str, model_digest: str) -> StringCommand | None:
    """The head's run of the canary set on state ``cluster`` (serving the weights of
    ``model_digest``); None when the site runs none (canaries = false, or no canary)."""
    found = canary_set(settings)
    if not settings.site.canaries or not found:
        return None
    stack_dir = settings.site.stack_dir
    return StringCommand("python3", QuoteString(settings.programs), "canary", "--url", QuoteString(f"http://{VLLM_HOST}:{settings.site.vllm_port}"),
                         "--key-file", QuoteString(settings.api_key_file), "--set", QuoteString(json.dumps(found)),
                         "--model-digest", model_digest, "--cluster", cluster, "--agree-tokens", str(settings.site.canary_agree_tokens),
                         "--reference", QuoteString(f"{stack_dir}/served/{CANARY_ANSWERS}"), "--out", QuoteString(f"{stack_dir}/{CANARY_ANSWERS}"))
