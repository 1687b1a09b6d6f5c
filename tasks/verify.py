"""Verification: read every node back and print one readiness table; fail on any FAIL.
The head reports, or the first node that answers when the head does not.

    pyinfra inventory.py tasks/verify.py
"""

from pyinfra import host

from operations.verify import readiness

readiness(
    name="Verify every node is ready to serve",
    node_names=[node.hostname for node in host.data.cluster.nodes],
)
