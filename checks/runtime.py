"""Rules for the runtime artifacts: on every node the head's runtime image, smoke-tested; the
model hashed on the head and its copy verified on each worker."""

from __future__ import annotations

from checks import FAIL, PASS, Check

RERUN = "run the deploy again: it sends what a worker lacks"


def image_check(name: str, tag: str, mine: dict, head_name: str | None, head: dict | None) -> Check:
    """``head_name`` and ``head`` (its reading, None when it did not answer) for a worker; the
    head itself has no image to compare with (None)."""
    item = f"runtime image {tag}"
    if mine["id"] is None:
        return Check(name, item, FAIL, "not on this node", RERUN + " (the head builds or pulls it, then streams it)")
    if mine["smoke_tested"] != mine["id"]:
        return Check(name, item, FAIL, f"{mine['id'][:19]} has not passed its smoke test (import vllm)",
                     f"run the deploy again; to see why, `docker run --rm --entrypoint python3 {tag} -c 'import vllm'` on {name}")
    if head_name is None or head is None:
        return Check(name, item, PASS, f"{mine['id'][:19]}, smoke-tested" + (f" ({head_name} not read)" if head_name else ""))
    if head["image"]["id"] != mine["id"]:
        return Check(name, item, FAIL, f"{mine['id'][:19]} here, {(head['image']['id'] or 'none')[:19]} on {head_name}", RERUN)
    return Check(name, item, PASS, f"{mine['id'][:19]}, the same as {head_name}'s, smoke-tested")


def model_check(name: str, role: str, source: dict, mine: dict, head: dict | None) -> Check:
    """``head`` is the head's reading (None when it did not answer); on the head, its own."""
    if role == "head":
        manifest = mine["manifest"]
        if manifest is None or manifest["source"] != source:
            return Check(name, "model", FAIL, "not fetched for this source" if manifest else "no manifest",
                         "run the deploy (it fetches the model once on the head and hashes it)")
        if mine["changed"]:
            return Check(name, "model", FAIL, f"{len(mine['changed'])} file(s) differ from the manifest: {', '.join(mine['changed'][:3])}",
                         "run the deploy again (it hashes them again); fetch again if they were damaged")
        return Check(name, "model", PASS, f"{manifest['files']} files, {manifest['bytes'] / (1 << 30):.2f} GiB, manifest {manifest['digest'][:12]}")
    manifest = head["model"]["manifest"] if head else None
    if manifest is None:
        return Check(name, "model copy", FAIL, "the head has no manifest to check against", "see the head's model row")
    if mine["verified"] != manifest["digest"]:
        return Check(name, "model copy", FAIL, "not verified against the head's manifest", RERUN)
    if mine["changed"]:
        return Check(name, "model copy", FAIL, f"{len(mine['changed'])} file(s) changed since verified: {', '.join(mine['changed'][:3])}",
                     RERUN + " (only what differs moves)")
    return Check(name, "model copy", PASS, f"verified against manifest {manifest['digest'][:12]}")
