"""Room for a model on every node that receives it, checked before any byte moves: what each
node needs (the model's bytes less what it has of it already) against its free space.

    --room NODE=FREE:HAVE   (once per node: bytes free in its model store, bytes it has of this model)
"""

from __future__ import annotations


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def parse(entry: str) -> tuple[str, int, int]:
    """NODE=FREE:HAVE as (node, free, have)."""
    node, _, numbers = entry.rpartition("=")
    free, _, have = numbers.partition(":")
    return node, int(free), int(have)


def short(total: int, rooms: list[str], store: str, what: str) -> str | None:
    """Why ``what`` (``total`` bytes) does not fit on a node (None: it fits on each): the node,
    its free space, what it needs, and the fix."""
    for node, free, have in map(parse, rooms):
        needed = max(0, total - have)
        if needed > free:
            return (f"{node}: {store} has {gib(free)} free; {what} needs {gib(needed)} more. Fix: free space there, or set "
                    f"model_dir in site.toml to a disk with room. Nothing was fetched or copied, nothing in service touched")
    return None
