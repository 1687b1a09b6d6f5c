"""Verification: read both nodes back and print one readiness table; fail on any FAIL.

    pyinfra inventory.py tasks/verify.py
"""

from pyinfra import host, inventory

from operations.verify import readiness

if host.data.role == "head":
    readiness(
        name="Verify both nodes are ready to serve",
        node_names=[node.name for node in inventory.iter_hosts() if node.data.role in ("head", "worker")],
    )
