"""The states that served, as every node records them (operations/records.py writes them, the
checks and the way back read them): a state's ID, what a node records of it, and one line that
names it. Ground floor: imports nothing of the project."""

from __future__ import annotations

import hashlib


def cluster_state(stack_hashes: list[str]) -> str:
    """The ID of a state of the cluster: every node's stack hash, in rank order."""
    return hashlib.sha256(" ".join(stack_hashes).encode()).hexdigest()[:16]


def state_of(settings, stack_hash: str, cluster: str, model_digest: str | None) -> dict:
    """What a node records of a state that served (``settings``: its StackSettings)."""
    return {"cluster": cluster, "stack": stack_hash, "profile": settings.cluster.profile_name, "image": settings.cluster.image.tag,
            "model": settings.cluster.model.source, "model_digest": (model_digest or "none")[:12]}


def described(values: dict) -> str:
    """One line naming a recorded state: profile, image (and its ID), model, since when."""
    model = values.get("model") or {}
    source = model.get("path") or f"{model.get('repo')}@{str(model.get('revision'))[:12]}"
    image_id = f" ({values['image_id'][:19]})" if values.get("image_id") else ""
    since = f", serving since {values['since']}" if values.get("since") else ""
    return f"profile {values.get('profile')}, image {values.get('image')}{image_id}, model {source}{since}"
